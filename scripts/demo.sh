#!/usr/bin/env bash
# The demo (the seed's): a LLaMA-architecture model learns to solve mazes from data read
# one small file per maze over an emulated 60 ms link (embedded SeaweedFS), from local
# disk, through NeuralCache and through rclone, side by side; then each mount cold-starts
# the trained checkpoint (time to first token). Installs what it needs first
# (scripts/setup.sh, with the PyTorch extra). Quick by default (~10 min: throughput and
# warm-up); pass --full for the accuracy run (~20 CPU-minutes per system).
# Other arguments go to `python -m bench run`, e.g. scripts/demo.sh --systems local,neuralcache
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
quick=--quick
args=()
for a in "$@"; do
    if [ "$a" = "--full" ]; then quick=""; else args+=("$a"); fi
done
exec .venv/bin/python -m bench run --scenario maze --systems local,neuralcache,rclone \
    --out bench/out/demo $quick "${args[@]}"
