#!/usr/bin/env bash
# The demo: installs what it needs (scripts/setup.sh), then runs the `train` scenario
# quickly: a training loop reading shards from local disk and through NeuralCache over
# an emulated 60 ms link (embedded SeaweedFS), printing samples/s side by side.
# Extra arguments go to `python -m bench run`, e.g. scripts/demo.sh --systems local,neuralcache,rclone
set -euo pipefail
cd "$(dirname "$0")/.."
NEURALCACHE_NO_TORCH=${NEURALCACHE_NO_TORCH:-0} bash scripts/setup.sh
exec .venv/bin/python -m bench run --scenario train --systems local,neuralcache --quick "$@"
