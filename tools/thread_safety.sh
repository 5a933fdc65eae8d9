#!/bin/bash
# Checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...): builds the code
# with clang's -Wthread-safety as errors (bazel --config=tsa, .bazelrc). gcc, the main build's
# compiler, ignores the annotations. CUDA is left out of this build (TUTTI_NO_CUDA), so the CUDA
# targets of gpu/ and daemon/gpu/ are not checked by it.
#
#   tools/thread_safety.sh [TARGET...]      (default: everything but gpu/)
#
# Runs in an output base of its own (TUTTI_TSA_OUTPUT_BASE, default ~/.cache/tutti-tsa): the
# compiler switch would otherwise reconfigure the main build's toolchain and rebuild it afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null; then
  echo "thread_safety: clang is missing (tools/install-deps.sh installs it)" >&2
  exit 1
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(//common/... //daemon/... //client/... //config/... //bench/... //tests/...)
fi
exec bazel --output_base="${TUTTI_TSA_OUTPUT_BASE:-$HOME/.cache/tutti-tsa}" build --config=tsa \
  "${targets[@]}"
