#!/bin/bash
# Checks every Python file of the repository (tracked, or new and not ignored) with pyflakes
# (Debian's pyflakes3) for the mistakes that only show when a line runs: undefined names (a
# helper moved to another module and not imported) and syntax errors. Much of the Python here
# (the GPU paths of the client, the device benchmarks) never runs in CI, so this is what catches
# them there. Style findings (unused imports and the like) are not errors here.
#
#   tools/python_check.sh            exit 0 when clean, 1 with the findings on stderr
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v pyflakes3 >/dev/null; then
  echo "python_check: pyflakes3 is missing (tools/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.py' 2>/dev/null ||
  find . -name '*.py' -not -path './bazel-*')
out=$(pyflakes3 "${files[@]}" 2>&1)
bad=$(grep -E "undefined name|syntax error|invalid syntax|unexpected indent|EOF while" <<<"$out")
if [ -n "$bad" ]; then
  echo "$bad" >&2
  echo "python_check: $(wc -l <<<"$bad") finding(s) in ${#files[@]} files" >&2
  exit 1
fi
echo "python_check: ${#files[@]} files, no undefined names or syntax errors"
