#!/bin/bash
# Installs the Debian 12 packages listed in deploy/debian-packages.txt that are missing.
# Run as root (or with sudo). Idempotent: does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# The CUDA toolkit is the one dependency Debian does not package (tuttid's GPU code is compiled
# with it; it runs without a GPU). Say so plainly instead of failing deep inside the build.
if [ ! -x /usr/local/cuda/bin/nvcc ] || [ ! -f /usr/local/cuda/lib64/libcudart_static.a ]; then
  echo "install-deps: the CUDA toolkit (nvcc 13, libcudart_static) is not at /usr/local/cuda." >&2
  echo "install-deps: install NVIDIA's CUDA Toolkit 13 for Debian 12 (no GPU or driver needed" >&2
  echo "install-deps: to build), or link /usr/local/cuda to where it is, then run this again." >&2
  exit 1
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
