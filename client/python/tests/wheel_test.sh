#!/bin/bash
# The wheel as vLLM users install it: a fresh virtual environment (python3 -m venv
# --system-site-packages: grpcio and protobuf come from Debian, there being no index), pip installs
# the wheel from the file with --no-index, so Debian 12's python3-grpcio and python3-protobuf must
# satisfy its requirements; then, from the venv, wheel_check.py imports the package (not the
# source tree's, not the Bazel site's), checks its version against `tuttid --version`, and runs
# the Python quick start against a real tuttid.
#
#   wheel_test.sh WHEEL TUTTID WHEEL_CHECK.py QUICKSTART.py VLLM_STUB_DIR
# Python: /usr/bin/python3, or $TUTTI_PYTHON.
set -euo pipefail
wheel="$(readlink -f "$1")"
tuttid="$(readlink -f "$2")"
check="$(readlink -f "$3")"
quickstart="$(readlink -f "$4")"
stub="$(cd "$5" && pwd)"
python="${TUTTI_PYTHON:-/usr/bin/python3}"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel.XXXXXX")"
venv="$tmp/venv"

# Nothing of this build on the path: the package must come from the venv.
unset PYTHONPATH PYTHONHOME PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS
export HOME="$tmp/home" PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1 \
  PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$HOME"
cd "$tmp"

echo "wheel_test: $python -m venv --system-site-packages $venv"
"$python" -m venv --system-site-packages "$venv"
# Where this machine's Python has the package already (the .deb installed), pip in the venv calls
# it satisfied: replace it as docs/vllm.md says (the requirements are then not checked).
flags=()
if "$python" -c 'import importlib.metadata as m; m.distribution("tutti")' 2>/dev/null; then
  echo "wheel_test: note: the system Python has a tutti distribution (the .deb?): --force-reinstall"
  flags=(--force-reinstall --no-deps)
fi
echo "wheel_test: pip install --no-index ${flags[*]:+${flags[*]} }$(basename "$wheel")"
"$venv/bin/python" -m pip install --no-index "${flags[@]}" "$wheel" 2>&1 | tee "$tmp/pip.log"
grep -q "^Successfully installed tutti-" "$tmp/pip.log" ||
  { echo "wheel_test: pip did not install tutti" >&2; exit 1; }

version="$("$tuttid" --version)"
echo "wheel_test: $version"
version="${version#tuttid }"
[ -n "$version" ] || { echo "wheel_test: tuttid --version printed nothing" >&2; exit 1; }

"$venv/bin/python" "$check" --venv "$venv" --version "$version" --vllm-stub "$stub" \
  --tuttid "$tuttid" --quickstart "$quickstart"

# pip uninstalls what it installed: nothing of the package is left in the venv.
"$venv/bin/python" -m pip uninstall -y tutti
left="$(find "$venv" -name 'tutti*' -print)"
[ -z "$left" ] || { echo "wheel_test: left in the venv after pip uninstall: $left" >&2; exit 1; }
echo "wheel_test: PASSED"
