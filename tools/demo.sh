#!/bin/bash
# The main job: installs missing Debian packages, builds tuttid and tuttictl, starts tuttid on its
# embedded default configuration (state and pool under /var/lib/tutti, socket
# /run/tutti/tuttid.sock) and runs the demo engine against it:
#   1. `tuttictl bench --verify`: stores KV blocks from host shared memory, retrieves them into
#      other blocks, compares every byte (hits come from the DRAM tier);
#   2. restarts tuttid (SIGTERM, start again) and runs `tuttictl bench --phase retrieve --verify`:
#      the same blocks, now read back from the SSD pool after the restart.
# Then it prints the daemon's stats and stops it with SIGTERM. Extra arguments go to both bench runs
# (e.g. --blocks 1024).
# Exit status: non-zero if the bench found a mismatch or a miss, or the daemon did not stop cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install-deps.sh
bazel build //daemon:tuttid //client:tuttictl
BIN="$(bazel info bazel-bin 2>/dev/null)"
TUTTID="$BIN/daemon/tuttid"
TUTTICTL="$BIN/client/tuttictl"
LOG="$(mktemp /tmp/tuttid.XXXXXX.log)"
pid=""

start_daemon() {
  "$TUTTID" >>"$LOG" 2>&1 &
  pid=$!
  echo "demo: started tuttid (pid $pid, log $LOG); waiting until it answers"
  for _ in $(seq 1 600); do
    if "$TUTTICTL" status >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "demo: tuttid exited during start-up:"; cat "$LOG"; exit 1
    fi
    sleep 0.2
  done
  echo "demo: tuttid did not answer within 120 s"; exit 1
}

# Stops tuttid with SIGTERM; returns its exit status.
stop_daemon() {
  kill -TERM "$pid" 2>/dev/null || true
  local rc=0
  wait "$pid" || rc=$?
  return "$rc"
}
trap 'kill -TERM $pid 2>/dev/null || true' EXIT

start_daemon
"$TUTTICTL" status
bench_rc=0
"$TUTTICTL" bench --verify "$@" || bench_rc=$?

echo "demo: restarting tuttid; the blocks must come back from the SSD pool"
daemon_rc=0
stop_daemon || daemon_rc=$?
start_daemon
"$TUTTICTL" bench --phase retrieve --verify "$@" || bench_rc=$?
"$TUTTICTL" stats

trap - EXIT
stop_daemon || daemon_rc=$?
echo "demo: tuttid exited with status $daemon_rc (log: $LOG)"
if [ "$bench_rc" -ne 0 ]; then
  echo "demo: FAILED: the bench reported mismatches or misses"; exit "$bench_rc"
fi
[ "$daemon_rc" -eq 0 ] || { echo "demo: FAILED: tuttid did not stop cleanly"; exit 1; }
echo "demo: OK: every retrieved byte matched what was stored, before and after a restart"
