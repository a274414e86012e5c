#!/usr/bin/env bash
# Run the real-card tests (tests/gpu) and bench/gpu.py on a bare machine with an NVIDIA card,
# as root, without network: everything it installs comes from a folder prepared beforehand.
#
# Prepare on a machine with network (the GPU machine's python3 version and platform):
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     -d shared/gpu-wheels pydantic fastapi uvicorn sqlalchemy websockets ipython ipywidgets \
#     nbformat papermill ipykernel pytest pytest-timeout nvidia-ml-py
#   (cd shared/gpu-wheels && apt-get download bubblewrap)
# Then, in the repository root on the GPU machine:
#   tests/gpu/run_on_gpu.sh [WHEELS_DIR]        (default shared/gpu-wheels)
# The machine's own python3 must have torch with CUDA (it is not installed here).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${1:-shared/gpu-wheels}
DEPS=${MA_GPU_DEPS:-/tmp/ma-gpu-deps}
OUT=${OUT:-/tmp/ma-gpu-out}
mkdir -p "$DEPS" "$OUT"

if ! command -v bwrap >/dev/null; then
  deb=$(ls "$WHEELS"/bubblewrap_*.deb | head -1)
  dpkg -x "$deb" /   # Debian's bubblewrap: its libraries are on the machine already
fi
python3 -m pip install -q --no-index --find-links "$WHEELS" --target "$DEPS" \
  pydantic fastapi uvicorn sqlalchemy websockets ipython ipywidgets nbformat papermill ipykernel \
  pytest pytest-timeout nvidia-ml-py
export PYTHONPATH="$PWD:$DEPS"
export PATH="$DEPS/bin:$PATH"

{
  echo "== card"; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  echo "== $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')"
  echo "== bubblewrap $(bwrap --version)"
} | tee "$OUT/machine.txt"
rc=0
python3 -m pytest tests/gpu -v -rs -s -p no:cacheprovider 2>&1 | tee "$OUT/tests.txt" || rc=$?
python3 bench/gpu.py --reps 5 2>&1 | tee "$OUT/bench.txt" || rc=$?
exit $rc
