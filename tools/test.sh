#!/bin/bash
# Runs the whole test suite: installs missing Debian packages, then `bazel test //...`.
# GPU tests (tag "gpu") run too; without a GPU they skip themselves and pass. Without the CUDA
# toolkit they, and the rest of the GPU code, are left out of the build (tools/cuda_configure.bzl).
# Extra arguments go to `bazel test` (e.g. a target pattern or --test_output=all).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install-deps.sh
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(//...); fi
exec bazel test "${targets[@]}"
