#!/bin/bash
# Builds the `tutti` wheel from a site made by make_site.sh (the package's sources, tutti/_version.py
# and the generated protobuf/gRPC modules) and client/python/pyproject.toml, offline: pip's
# setuptools backend from Debian (python3-pip, python3-setuptools, python3-wheel), no build
# isolation, no index. Bazel runs this for //client/python:wheel.
#
#   client/python/make_wheel.sh SITE PYPROJECT OUT
#     OUT: the wheel's path (its name must be the one setuptools gives it) or a directory
# Python: /usr/bin/python3, or $TUTTI_PYTHON.
set -euo pipefail
site="${1:?usage: make_wheel.sh SITE PYPROJECT OUT}"
pyproject="${2:?usage: make_wheel.sh SITE PYPROJECT OUT}"
out="${3:?usage: make_wheel.sh SITE PYPROJECT OUT}"
python="${TUTTI_PYTHON:-/usr/bin/python3}"
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PYTHONPATH
[ -f "$site/tutti/_version.py" ] && [ -f "$site/tutti/v1/kvcache_pb2.py" ] ||
  { echo "make_wheel.sh: $site is not a site made by make_site.sh" >&2; exit 1; }
stage="$(mktemp -d "${TMPDIR:-/tmp}/tutti-wheel.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/src" "$stage/dist" "$stage/home"
cp -r "$site/tutti" "$stage/src/"
find "$stage/src" -name __pycache__ -prune -exec rm -rf {} +
cp "$pyproject" "$stage/src/pyproject.toml"
# Fixed timestamps in the archive (wheel honours SOURCE_DATE_EPOCH): the same inputs give the
# same bytes. No pip configuration, cache or version check; nothing from the network.
(cd "$stage/src" &&
   HOME="$stage/home" SOURCE_DATE_EPOCH=315532800 PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 \
   PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1 \
   "$python" -m pip wheel --no-deps --no-build-isolation --no-index --wheel-dir "$stage/dist" . \
   >"$stage/pip.log" 2>&1) || { cat "$stage/pip.log" >&2; exit 1; }
wheels=("$stage"/dist/*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] ||
  { cat "$stage/pip.log" >&2; echo "make_wheel.sh: expected one wheel" >&2; exit 1; }
name="$(basename "${wheels[0]}")"
if [ -d "$out" ]; then
  out="$out/$name"
elif [ "$(basename "$out")" != "$name" ]; then
  echo "make_wheel.sh: setuptools made $name, not $(basename "$out")" >&2
  exit 1
fi
cp "${wheels[0]}" "$out"
echo "$out"
