#!/usr/bin/env bash
# The demo. Installs what it needs first (scripts/setup.sh, with the PyTorch extra).
#
#   scripts/demo.sh               the `train` scenario, quick: a training loop reading
#                                 shards from local disk and through NeuralCache over an
#                                 emulated 60 ms link (embedded SeaweedFS), samples/s
#                                 side by side (~3 min)
#   scripts/demo.sh --maze        the seed's demo: a LLaMA-architecture model learns to
#                                 solve mazes from one small file per maze, read from
#                                 local disk, through NeuralCache and through rclone;
#                                 then cold time-to-first-token per system (~10 min)
#   scripts/demo.sh --maze --full the same to >= 95 % accuracy (~1 hour)
#
# Other arguments go to `python -m bench run`, e.g. --systems local,neuralcache,rclone
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
scenario=(--scenario train --systems local,neuralcache)
quick=--quick
args=()
for a in "$@"; do
    case "$a" in
        --maze) scenario=(--scenario maze --systems local,neuralcache,rclone --out bench/out/maze) ;;
        --full) quick="" ;;
        *) args+=("$a") ;;
    esac
done
exec .venv/bin/python -m bench run "${scenario[@]}" $quick "${args[@]}"
