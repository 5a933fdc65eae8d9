#!/bin/bash
# tutti-release refuses bad arguments (exit 2, usage) and reports a handle it cannot open (exit 1,
# a CUDA error) whether or not a GPU is present: with one, an all-zero handle does not open;
# without one, the device is not usable.
set -u
bin="$1"
fail=0
expect() {  # expected-exit description args...
  local want="$1" what="$2"
  shift 2
  "$bin" "$@" > /dev/null 2> "$TEST_TMPDIR/err"
  local got=$?
  if [[ "$got" != "$want" ]]; then
    echo "FAIL: $what: exit $got, want $want: $(cat "$TEST_TMPDIR/err")"
    fail=1
  elif [[ "$want" == 2 ]] && ! grep -q "usage: tutti-release" "$TEST_TMPDIR/err"; then
    echo "FAIL: $what: no usage line"
    fail=1
  elif [[ "$want" == 1 ]] && ! grep -q "^tutti-release: cuda" "$TEST_TMPDIR/err"; then
    echo "FAIL: $what: no CUDA error named: $(cat "$TEST_TMPDIR/err")"
    fail=1
  else
    echo "ok: $what"
  fi
}
zero=$(printf '0%.0s' $(seq 128))
expect 2 "no arguments"
expect 2 "short handle" 0 abcd 4 7
expect 2 "non-hex handle" 0 "$(printf 'g%.0s' $(seq 128))" 4 7
expect 2 "zero words" 0 "$zero" 0 7
expect 2 "bad ticket" 0 "$zero" 4 seven
expect 2 "bad device" x "$zero" 4 7
expect 1 "a handle that does not open" 0 "$zero" 4 7
exit $fail
