#!/bin/bash
# Runs the test suite (without gpu-tagged tests) under ASan+UBSan and/or TSan (the .bazelrc configs
# asan and tsan) and appends one line per config to bench/results/sanitizers.jsonl: pass/fail counts
# and the failing targets. Logs of failing tests: bazel-testlogs of that config (bazel info
# --config=<cfg> bazel-testlogs).
#   tools/sanitize.sh [asan|tsan|all] [TARGET_PATTERN...]   (default: all //...)
set -u
cd "$(dirname "$0")/.."
WHICH=${1:-all}
shift || true
PATTERNS=("$@")
[ ${#PATTERNS[@]} -eq 0 ] && PATTERNS=(//...)
case "$WHICH" in
  all) CONFIGS=(asan tsan) ;;
  asan | tsan) CONFIGS=("$WHICH") ;;
  *) echo "usage: tools/sanitize.sh [asan|tsan|all] [TARGET_PATTERN...]" >&2; exit 2 ;;
esac
mkdir -p bench/results
status=0
for cfg in "${CONFIGS[@]}"; do
  log=$(mktemp)
  start=$(date +%s)
  bazel test --config="$cfg" --test_tag_filters=-gpu --build_tests_only -k \
    --test_output=errors "${PATTERNS[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && status=1
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
  failed_targets=$(grep -E '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" | awk '{print $1}' | paste -sd, -)
  failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log")
  printf '{"date":"%s","machine":"%s, %s cores","config":"%s","command":"tools/sanitize.sh %s %s","seconds":%s,"passed":%s,"failed":%s,"failed_targets":"%s","bazel_exit":%s}\n' \
    "$(date -u +%FT%TZ)" "$(hostname)" "$(nproc)" "$cfg" "$cfg" "${PATTERNS[*]}" \
    "$(($(date +%s) - start))" "$passed" "$failed" "$failed_targets" "$rc" \
    | tee -a bench/results/sanitizers.jsonl
  rm -f "$log"
done
exit $status
