#!/bin/bash
# Installs the Debian 12 packages listed in deploy/debian-packages.txt that are missing.
# Run as root (or with sudo). Idempotent: does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# The CUDA toolkit is the one dependency Debian does not package. Without it the build leaves the
# GPU code out (tools/cuda_configure.bzl) and tuttid runs in host mode only: say so, go on.
cuda="${CUDA_PATH:-/usr/local/cuda}"
if [ -n "${TUTTI_NO_CUDA:-}" ] && [ "${TUTTI_NO_CUDA}" != 0 ]; then
  echo "install-deps: TUTTI_NO_CUDA is set: building without CUDA (host mode only)"
elif [ ! -x "$cuda/bin/nvcc" ] && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: no CUDA toolkit (\$CUDA_PATH or /usr/local/cuda): building without CUDA;"
  echo "install-deps: tuttid will run in host mode only. For the GPU data path install NVIDIA's"
  echo "install-deps: CUDA Toolkit 13 for Debian 12 (no GPU or driver is needed to build)."
fi

mapfile -t wanted < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' -e 's/[[:space:]]//g' deploy/debian-packages.txt)
missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#wanted[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
