#!/usr/bin/env bash
# Builds gradzip's tests, benchmarks, examples and Python package and runs the whole test suite.
# CUDA targets are compiled (for sm_90) whenever nvcc exists; the GPU tests run where a GPU is
# and report skipped elsewhere. Usage: tools/test.sh [build-dir (default build)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tools/deps.sh cmake ninja-build g++ catch2 libbenchmark-dev clang-14 libclang-rt-14-dev libomp-14-dev \
  openmpi-bin libopenmpi-dev zlib1g-dev dataset-fashion-mnist
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# The Python package's tests run in a venv inside the build tree: torch from PyPI, then
# `pip install ./python` exactly as a user installs it (docs/python.md).
venv="$build/python-venv"
if ! "$venv/bin/python" -c "import torch, pytest, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-cache-dir --upgrade pip
  "$venv/bin/pip" install --quiet --no-cache-dir torch numpy pytest
fi
# Where nvcc is found the module is built for CUDA tensors too: for sm_90 here, as the rest of
# the CUDA targets (a user's install builds sm_80, sm_90 and sm_100).
"$venv/bin/pip" install --quiet --no-cache-dir --force-reinstall --no-deps \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 ./python
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGRADZIP_PYTHON="$(cd "$venv" && pwd)/bin/python"
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)"
