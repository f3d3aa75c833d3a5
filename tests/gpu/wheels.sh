#!/usr/bin/env bash
# Fetches, here, the wheels the GPU suite needs and a lent GPU machine lacks (it reaches no
# package registry), into .whl/ (ignored by git; name it in the device tool's carry).
# The machine's image has torch, numpy, pyyaml, xxhash, nvidia-ml-py, safetensors, pytest and
# pytest-timeout; sres's run also needs cryptography (the store's sealed values), which needs cffi.
#   tests/gpu/wheels.sh [--python-version 3.12]
set -euo pipefail
cd "$(dirname "$0")/../.."
version=3.12
[ "${1:-}" = "--python-version" ] && version=$2
mkdir -p .whl
for spec in cryptography==48.0.0 cffi==2.0.0 pycparser==3.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$spec"
done
ls -l .whl
