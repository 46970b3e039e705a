#!/usr/bin/env bash
# Builds and runs gradzip-demo: every codec on a 2^24-element heavy-tailed gradient.
# Usage: tools/demo.sh [elements] [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh cmake ninja-build g++
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADZIP_ENABLE_CUDA=OFF \
  -DGRADZIP_BUILD_TESTS=OFF -DGRADZIP_BUILD_BENCHMARKS=OFF -DGRADZIP_BUILD_EXAMPLES=ON >/dev/null
cmake --build build-demo --target gradzip-demo >/dev/null
exec build-demo/examples/gradzip-demo "$@"
