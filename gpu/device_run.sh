#!/bin/bash
# Runs the GPU tests, the copy benchmark and the owner-death experiment on the GPU machine, from
# the repository root, with the bundle made by:
#   tools/gpu_bundle.sh //gpu:probe_test //gpu:placement_test //gpu:io_stream_test \
#     //gpu:cuda_ipc_memory_test //gpu:ready_words_test //gpu:ipc_two_process_test \
#     //bench:gpu_copy_bench //bench:gpu_owner_death
# Device tool: run(carry=[".bundle"], command="gpu/device_run.sh"). Writes logs and JSON lines
# under $OUT (at most 8 files come back) and prints a short summary last.
set -u
out="${OUT:-/tmp/tutti-gpu-out}"
mkdir -p "$out"
run=.bundle/run.sh
tests="gpu/probe_test gpu/placement_test gpu/io_stream_test gpu/cuda_ipc_memory_test gpu/ready_words_test gpu/ipc_two_process_test"
smi="$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1 | head -1)"
machine="nvidia-h200 device machine: $smi"
echo "$machine" > "$out/summary.txt"

summary=()
for t in $tests; do
  timeout 180 "$run" "$t" > "$out/t.log" 2>&1
  rc=$?
  cat "$out/t.log" >> "$out/tests.log"
  summary+=("$(printf '%-28s rc=%-3s %s' "$t" "$rc" "$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$out/t.log" | tr '\n' ' ')")")
done
rm -f "$out/t.log"

# The copy kernel under compute-sanitizer's memory checker (small tests only).
if command -v compute-sanitizer > /dev/null; then
  LD_LIBRARY_PATH=.bundle/lib timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
    .bundle/bin/gpu/cuda_ipc_memory_test --gtest_filter='AllFormats/*:*Bad*' > "$out/sanitizer.log" 2>&1
  summary+=("compute-sanitizer memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -1)")
fi

# Twice, to see the run-to-run spread.
for i in 1 2; do
  timeout 300 "$run" bench/gpu_copy_bench --out="$out/gpu_copy.jsonl" --machine="$machine" \
    >> "$out/bench.log" 2>&1
  summary+=("gpu_copy_bench run $i rc=$?")
done

# Last: the experiment that may leave the GPU in a bad state.
for s in legacy_kill legacy_exit vmm_kill vmm_exit; do
  timeout 150 "$run" bench/gpu_owner_death --scenario="$s" --out="$out/gpu_owner_death.jsonl" \
    --machine="$machine" >> "$out/owner_death.log" 2>&1
  summary+=("gpu_owner_death $s rc=$?")
done
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader >> "$out/summary.txt" 2>&1

{
  printf '%s\n' "${summary[@]}"
  echo
  grep -E '^(I/O stream|metric|[a-z_0-9]+ +[0-9.]+ )' "$out/bench.log"
  echo
  cat "$out/owner_death.log" | grep -v '^$' | cut -c1-160
} | tee -a "$out/summary.txt"
