#!/bin/bash
# Runs a Python test file with the built `tutti` package on PYTHONPATH, under Debian's python3
# (or $TUTTI_PYTHON): run_py_test.sh TEST.py [args...]
set -euo pipefail
root="${TEST_SRCDIR:-$PWD/..}/tutti"
export PYTHONPATH="$root/client/python/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
exec "${TUTTI_PYTHON:-/usr/bin/python3}" "$@"
