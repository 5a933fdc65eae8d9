#!/bin/bash
# Builds the libFuzzer targets of tests/fuzz with clang (bazel --config=fuzz) and runs each for
# SECONDS (default 120) on a working copy of its committed corpus, appending one line per target to
# bench/results/fuzz.jsonl. Crashing inputs are kept in $WORK/<target>/artifacts/; add a fixed one
# to tests/fuzz/corpus/<target>/ so the regression test replays it from then on.
#   tools/fuzz.sh [SECONDS] [TARGET...]      (targets: config_fuzz journal_fuzz ...)
set -u
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-120}
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(config_fuzz journal_fuzz checkpoint_fuzz slot_header_fuzz superblock_fuzz service_fuzz)
fi
WORK=${WORK:-/var/tmp/tutti-fuzz}
bazel build --config=fuzz $(printf '//tests/fuzz:%s ' "${TARGETS[@]}") || exit 1
BIN=$(bazel info --config=fuzz bazel-bin)/tests/fuzz
mkdir -p bench/results "$WORK/bin"
# Copies, so that a later bazel build cannot replace a binary between runs.
for t in "${TARGETS[@]}"; do cp -f "$BIN/$t" "$WORK/bin/$t" || exit 1; done
for t in "${TARGETS[@]}"; do
  rm -rf "$WORK/$t" && mkdir -p "$WORK/$t/corpus" "$WORK/$t/artifacts"
  cp tests/fuzz/corpus/$t/* "$WORK/$t/corpus/"
  # TEST_TMPDIR: the targets' scratch files. The journal targets fsync on every input, so theirs is
  # on tmpfs; the superblock target needs O_DIRECT, so its is not.
  scratch="$WORK/$t"
  case "$t" in journal_fuzz | checkpoint_fuzz) scratch=$(mktemp -d /dev/shm/tutti-fuzz.XXXXXX) ;; esac
  TEST_TMPDIR="$scratch" "$WORK/bin/$t" "$WORK/$t/corpus" -max_total_time="$SECONDS_EACH" \
    -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$WORK/$t/artifacts/" \
    >"$WORK/$t/log" 2>&1
  rc=$?
  [ "$scratch" != "$WORK/$t" ] && rm -rf "$scratch"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/$t/log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$WORK/$t/log" | tail -1)
  crashes=$(find "$WORK/$t/artifacts" -type f | wc -l)
  corpus=$(find "$WORK/$t/corpus" -type f | wc -l)
  printf '{"date":"%s","machine":"%s, %s cores","command":"tools/fuzz.sh %s %s","target":"%s","runs":%s,"seconds":%s,"crashes":%s,"exit":%s,"corpus_after":%s}\n' \
    "$(date -u +%FT%TZ)" "$(hostname)" "$(nproc)" "$SECONDS_EACH" "$t" "$t" "${runs:-0}" \
    "${secs:-0}" "$crashes" "$rc" "$corpus" | tee -a bench/results/fuzz.jsonl
done
