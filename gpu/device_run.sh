#!/bin/bash
# Runs the GPU tests, the benchmarks, the interference measurement and the owner-death experiment
# on the GPU machine, from the repository root, with the bundle made by tools/gpu_bundle.sh (see
# BUNDLE_TARGETS in that script's header, or docs/gpu.md).
# Device tool: run(carry=[".bundle"], command="gpu/device_run.sh [PART...]"), PART among tests,
# sanitizer, bench (copy kernels), retrieve (through tuttid), interference, deadmem, owner,
# nvme (GPU-initiated NVMe submission against the controller model: its tests and
# bench/gpu_nvme_bench), ssd_array (issue 20's emulated arrays through tuttid, bench/ssd_array.py:
# TUTTI_SSD_PARTS, default "array share"; "ttft engine_loss dram" fit a second call), checkslots
# (the GPU verifier's check sizes: its test, its bench, and the tmpfs:8 array and share with the
# default checks, small checks while Retrieves share, and small checks always; one call of its own)
# copyonarrival (datapath.gpu_check_copy_on_arrival: the verifier's test, then tmpfs:1 and tmpfs:8
# reads and a busy engine's loss under MPS with it off and on, interleaved; one call of its own)
# cpusplit (a busy engine's loss under MPS beside tmpfs:8 Retrieves with the host's CPUs shared
# and with the engine on CPUs of its own, TUTTI_ENGINE_CPUS (default the last two) and tuttid,
# its io_uring workers and the raw tool on the rest; three pairs, interleaved, with the defaults;
# about 3 minutes; measured at stop 53, docs/gpu.md)
# bouncefootprint (the minimal reader into the GPU with few and many slots; then tmpfs reads with
# fewer host bounce slots a device, datapath.read_bounce_depth TUTTI_BOUNCE_DEPTHS (default "8
# 4"), against the defaults, interleaved: tmpfs:8 twice, a small Retrieve beside a large one with
# 8, tmpfs:1 once with 16; whether a footprint the CPU's last-level cache holds reads faster; about
# 7 minutes; docs/gpu.md, "Stop 54")
# ceiling (tmpfs reads and copies to the GPU, each alone and each beside the other: the emulation's
# limit for a reader through host memory; about 30 s)
# readsize (the copies to the GPU alone in 1 and 4 MiB chunks, TUTTI_READSIZE_COPIES; then the runs
# of TUTTI_READSIZE_RUNS, each [part@]config:variant (see the part), by default tmpfs:8 reads with
# larger copies to the GPU against the defaults then, interleaved, twice, then tmpfs:4 and
# tmpfs:1, loop:4; runs past TUTTI_READSIZE_CUTOFF seconds (470) are skipped; docs/gpu.md, "Stop
# 56", "Stop 57" and "Stop 62". Next, the split of a read batch's way back to its bounce slot
# (arrival_pickup_ms, arrival_copy_release_ms, arrivals_a_group, new at stop 62) and stores on 8
# loop devices into a full pool with their commits counted (commits, commit_sync_s):
# TUTTI_READSIZE_COPIES="" TUTTI_READSIZE_RUNS="8:default l8:default l8:s3 8:default l4:default")
# (default: tests retrieve interference deadmem). Writes logs and JSON lines under $OUT (at most 8 files come back) and
# prints a short summary last.
set -u
out="${OUT:-/tmp/tutti-gpu-out}"
mkdir -p "$out"
run=.bundle/run.sh
# The C++ client's GPU test starts tuttid itself.
[[ -z "${TUTTID_BIN:-}" && -x .bundle/tuttid.sh ]] && export TUTTID_BIN="$PWD/.bundle/tuttid.sh"
parts="${*:-tests retrieve interference deadmem}"
smi="$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1 | head -1)"
machine="nvidia-h200 device machine: $smi"
echo "$machine" > "$out/summary.txt"
summary=()
has() { [[ " $parts " == *" $1 "* ]]; }
# An MPS control daemon of our own, if the machine has MPS: mps_start returns 0 once it runs (2: no
# MPS here, 1: it did not start); mps_stop stops it and forgets its directories.
mps_start() {
  command -v nvidia-cuda-mps-control > /dev/null || return 2
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/tutti-mps CUDA_MPS_LOG_DIRECTORY=/tmp/tutti-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && return 0
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  return 1
}
mps_stop() {
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
# One run of bench/ssd_array.py through the bundle's tuttid, one store round, cut at 80 s; its
# exit status is the run's. Lines go to $out/ssd.jsonl, the log to $out/ssd_array.log.
ssd_array_run() {  # LABEL PART CONFIGS RETRIEVE_ROUNDS [ARGS...]
  local label=$1 part=$2 cfg=$3 rounds=$4; shift 4
  PYTHONPATH=.bundle/site timeout 80 python3 bench/ssd_array.py --tuttid .bundle/tuttid.sh \
    --rawio "$run bench/raw_array_io" --out "$out/ssd.jsonl" --parts "$part" --configs "$cfg" \
    --store-rounds 1 --retrieve-rounds "$rounds" --label "$label" "$@" >> "$out/ssd_array.log" 2>&1
}

if has tests; then
  all_tests="gpu/probe_test gpu/io_stream_test gpu/ready_words_test daemon/gpu/placement_test
             daemon/gpu/cuda_ipc_memory_test daemon/gpu/ipc_two_process_test
             daemon/gpu/layer_copier_test tests/gpu/tuttid_gpu_test"
  for t in ${TUTTI_TESTS:-$all_tests}; do
    timeout 200 "$run" "$t" > "$out/t.log" 2>&1
    rc=$?
    cat "$out/t.log" >> "$out/tests.log"
    summary+=("$(printf '%-34s rc=%-3s %s' "$t" "$rc" "$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$out/t.log" | tr '\n' ' ')")")
  done
  rm -f "$out/t.log"
fi

# The copy kernel under compute-sanitizer's memory checker (small tests only).
if has sanitizer && command -v compute-sanitizer > /dev/null; then
  LD_LIBRARY_PATH=.bundle/lib timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
    .bundle/bin/daemon/gpu/cuda_ipc_memory_test --gtest_filter='AllFormats/*:*Bad*' \
    > "$out/sanitizer.log" 2>&1
  summary+=("compute-sanitizer memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -1)")
fi

if has bench; then
  for i in 1 2; do  # twice, to see the run-to-run spread
    timeout 300 "$run" bench/gpu_copy_bench --out="$out/gpu_copy.jsonl" --machine="$machine" \
      >> "$out/bench.log" 2>&1
    summary+=("gpu_copy_bench run $i rc=$?")
  done
fi

if has retrieve; then
  # TUTTI_RETRIEVE_FLAGS: more flags, e.g. --round_kib=8192 --scatter=staged.
  timeout 200 "$run" bench/gpu_retrieve_bench --reps="${TUTTI_REPS:-3}" \
    --parts="${TUTTI_RETRIEVE_PARTS:-inproc,dram,ssd}" --out="$out/gpu_retrieve.jsonl" \
    --machine="$machine" ${TUTTI_RETRIEVE_FLAGS:-} >> "$out/retrieve.log" 2>&1
  summary+=("gpu_retrieve_bench rc=$?")
fi

if has interference; then
  # TUTTI_INTERFERENCE_FLAGS: more flags for every variant (--direction=store: the daemon gathers).
  # PATH:SMS:CTAS[:ROUND_KIB[:MPS_PRIORITY]] of the daemon's copies: the staged path (copy engine, then a short
  # device-to-device kernel) with whole-slot rounds and with tuttid's default 8 MiB rounds and
  # smaller ones (shorter kernels hold the engine's SM slots for less time).
  variants="${TUTTI_INTERFERENCE:-staged:16:32 staged:16:32:8192 staged:16:32:2048}"
  interfere() {
    for v in $variants; do
      IFS=: read -r path sms ctas round prio <<< "$v"
      timeout 60 "$run" bench/gpu_interference --path="$path" --sms="$sms" --ctas="$ctas" \
        --round_kib="${round:-0}" --mps_priority="${prio:--1}" ${TUTTI_INTERFERENCE_FLAGS:-} \
        --label="$1" --out="$out/gpu_interference.jsonl" --machine="$machine" \
        >> "$out/interference.log" 2>&1
      summary+=("gpu_interference $1 $v rc=$?")
    done
  }
  [[ "${TUTTI_SKIP_NO_MPS:-0}" == 1 ]] || interfere no_mps
  # With MPS, if the machine has it: a control daemon of our own, stopped afterwards.
  mps_start
  case $? in
    0) sleep 1; interfere mps; mps_stop; sleep 1 ;;
    1) summary+=("MPS did not start") ;;
  esac
fi

# GPU-initiated NVMe submission against the controller model (docs/nvme.md): its tests, then the
# command rate and CPU time per GB against the CPU-driven queue pair, in one run.
if has nvme; then
  for t in bench/nvme_gpu/doorbell_requirements_test bench/nvme_gpu/gpu_queue_test; do
    timeout 300 "$run" "$t" > "$out/t.log" 2>&1
    rc=$?
    cat "$out/t.log" >> "$out/nvme_tests.log"
    summary+=("$(printf '%-44s rc=%-3s %s' "$t" "$rc" "$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$out/t.log" | tr '\n' ' ')")")
  done
  rm -f "$out/t.log"
  timeout 400 "$run" bench/gpu_nvme_bench --reps="${TUTTI_REPS:-3}" --out="$out/gpu_nvme.jsonl" \
    --machine="$machine" ${TUTTI_NVME_FLAGS:-} >> "$out/nvme_bench.log" 2>&1
  summary+=("gpu_nvme_bench rc=$?")
fi

# Emulated NVMe arrays through tuttid (bench/ssd_array.py, run as root: it builds tmpfs directories,
# loop devices and a cgroup): one invocation per part, so that one failing leaves the others' lines.
# TUTTI_SSD_CONFIGS (array: tmpfs:1,tmpfs:4,tmpfs:8,loop:4), TUTTI_SSD_STORE_ROUNDS (3: the figures
# are the last round's, past the fresh pool), TUTTI_SSD_LABEL, TUTTI_SSD_FLAGS (e.g. --set k=v).
if has ssd_array; then
  ssd_label="${TUTTI_SSD_LABEL:-device-run}"
  for p in ${TUTTI_SSD_PARTS:-array share}; do
    case "$p" in
      array) cfg="${TUTTI_SSD_CONFIGS:-tmpfs:1,tmpfs:4,tmpfs:8,loop:4}"; limit=360 ;;
      share) cfg="${TUTTI_SSD_SHARE_CONFIGS:-tmpfs:8,loop:4}"; limit=120 ;;
      *) cfg=tmpfs:8; limit=200 ;;
    esac
    PYTHONPATH=.bundle/site timeout "$limit" python3 bench/ssd_array.py --tuttid .bundle/tuttid.sh \
      --rawio "$run bench/raw_array_io" --out "$out/ssd.jsonl" --parts "$p" --configs "$cfg" \
      --store-rounds "${TUTTI_SSD_STORE_ROUNDS:-3}" --retrieve-rounds 2 --label "$ssd_label-$p" \
      ${TUTTI_SSD_FLAGS:-} >> "$out/ssd_array.log" 2>&1
    summary+=("ssd_array $p ($cfg) rc=$?")
  done
fi

# The GPU verifier's checks (datapath.gpu_check_*, docs/gpu.md "Smaller checks only while Retrieves share"):
# the test, the verifier alone, then tuttid on tmpfs:8 (one store round, array and share parts)
# with the default checks, checks of 512 objects only while Retrieves share
# (gpu_check_shared_objects 512), and checks of 512 objects always (gpu_check_batch_objects 512).
# Stop 47 measured 8 checks in flight (docs/gpu.md, "Checks in flight, measured").
# With .bundle/tuttid_old.sh (an earlier tuttid, see docs/gpu.md) its default runs first as well.
# At most about 9 minutes (each tuttid run is cut at 120 s): a call of its own.
if has checkslots; then
  timeout 120 "$run" daemon/gpu/gpu_verifier_test > "$out/checkslots_test.log" 2>&1
  summary+=("gpu_verifier_test rc=$? $(grep -E '^\[  (PASSED  |FAILED  )\]' "$out/checkslots_test.log" | tr '\n' ' ')")
  timeout 90 "$run" bench/gpu_verifier_bench --sm=16 --check_objects=512 --check_slots=2,8 \
    --out="$out/gpu_verifier.jsonl" --machine="$machine" > "$out/checkslots_bench.log" 2>&1
  summary+=("gpu_verifier_bench 512 objects, 2|8 slots rc=$?")
  small="--set datapath.gpu_check_batch_objects=512"
  variants=("default|.bundle/tuttid.sh|"
            "shared512|.bundle/tuttid.sh|--set datapath.gpu_check_shared_objects=512"
            "small2|.bundle/tuttid.sh|$small")
  [[ -x .bundle/tuttid_old.sh ]] && variants=("old-default|.bundle/tuttid_old.sh|" "${variants[@]}")
  for v in "${variants[@]}"; do
    IFS='|' read -r name daemon flags <<< "$v"
    # shellcheck disable=SC2086  # flags are words
    PYTHONPATH=.bundle/site timeout 120 python3 bench/ssd_array.py --tuttid "$daemon" \
      --rawio "$run bench/raw_array_io" --out "$out/ssd.jsonl" --parts array,share \
      --configs tmpfs:8 --store-rounds 1 --retrieve-rounds 3 \
      --label "${TUTTI_SSD_LABEL:-checkslots}-$name" $flags >> "$out/ssd_array.log" 2>&1
    summary+=("ssd_array checkslots $name rc=$?")
  done
fi

# Copies on arrival (datapath.gpu_check_copy_on_arrival, docs/gpu.md "Stop 51"): the verifier's
# test, then tmpfs:1 and tmpfs:8 reads (one store round) with it off and on, interleaved, then a
# busy engine's loss beside full-speed Retrieves with each, under our own MPS control daemon where
# the machine has one. At most about 9 minutes: a call of its own.
if has copyonarrival; then
  timeout 120 "$run" daemon/gpu/gpu_verifier_test > "$out/copyonarrival_test.log" 2>&1
  summary+=("gpu_verifier_test rc=$? $(grep -E '^\[  (PASSED  |FAILED  )\]' "$out/copyonarrival_test.log" | tr '\n' ' ')")
  # Both named: the default is on since stop 53.
  on="--set datapath.gpu_check_copy_on_arrival=true"
  off="--set datapath.gpu_check_copy_on_arrival=false"
  coa() {  # NAME PART CONFIG [FLAGS...]
    local name=$1 part=$2 cfg=$3; shift 3
    ssd_array_run "${TUTTI_SSD_LABEL:-coa}-$name" "$part" "$cfg" 2 "$@"
    summary+=("ssd_array copyonarrival $name rc=$?")
  }
  # shellcheck disable=SC2086  # $on and $off are words
  {
    coa t1-off array tmpfs:1 $off; coa t1-on array tmpfs:1 $on
    coa t8-off array tmpfs:8 $off; coa t8-on array tmpfs:8 $on
    coa t1-on2 array tmpfs:1 $on; coa t1-off2 array tmpfs:1 $off
  }
  mps_start && mps=1 || mps=0
  # shellcheck disable=SC2086
  { coa loss-off engine_loss tmpfs:8 $off; coa loss-on engine_loss tmpfs:8 $on; }
  if [[ $mps == 1 ]]; then mps_stop; fi
fi

# Where a busy engine's loss goes: the host's CPUs shared, or kept apart (docs/gpu.md, "Stop 52").
if has cpusplit; then
  ncpu=$(nproc)
  engine_cpus="${TUTTI_ENGINE_CPUS:-$((ncpu - 2))-$((ncpu - 1))}"
  tuttid_cpus="${TUTTI_TUTTID_CPUS:-0-$((ncpu - 3))}"
  mps_start && mps=1 || mps=0
  for i in 1 2 3; do
    for split in shared apart; do
      flags=()
      [[ $split == apart ]] && flags=(--engine-cpus "$engine_cpus" --tuttid-cpus "$tuttid_cpus")
      ssd_array_run "${TUTTI_SSD_LABEL:-cpusplit}-$split$i" engine_loss tmpfs:8 3 "${flags[@]}"
      summary+=("ssd_array cpusplit $split$i rc=$? $(grep -E '^  engine .* loss' "$out/ssd_array.log" | tail -1 | cut -c1-200)")
    done
  done
  if [[ $mps == 1 ]]; then mps_stop; fi
fi

# The emulation's own ceiling for a reader that lands reads in host memory and copies them to the
# GPU: tmpfs reads (io_uring workers' memory copies) and pinned copies to the GPU share the host's
# memory. Each alone, then each timed while the other runs in the background (started first, run
# longer), then the minimal reader with 1 and 4 MiB reads, and with 1 MiB reads copied in batches
# (TUTTI_CEILING_BATCHES, below). 8 tmpfs files of 1 GiB; about 50 s.
# (bench/ssd_array.py's raw_beside_copy times only the reads, beside one contiguous torch copy;
# this times both sides, with copies in the 4 MiB chunks tuttid's batches make.)
if has ceiling; then
  d=/dev/shm/tutti-ceiling
  mkdir -p $d
  for i in 0 1 2 3 4 5 6 7; do fallocate -l 1G "$d/f$i"; done
  reads=(--op=read --no_gpu --qd=16 --slots=16 --lifo)
  copies=(--op=copy --io_bytes=4194304 --qd=8 --slots=8 --lifo)
  ceil() {  # NAME FLAGS... : one foreground run, its JSON line tagged with NAME
    local name=$1; shift
    j="$(timeout 30 "$run" bench/raw_gpu_io "$@" $d/f{0..7} 2>> "$out/raw_gpu_io.log")"
    echo "{\"ceiling\":\"$name\",\"result\":${j:-null}}" >> "$out/raw_gpu_io_ceiling.jsonl"
    summary+=("ceiling $name: $(sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p' <<< "$j") GB/s")
  }
  ceil copies-alone "${copies[@]}" --seconds=2
  ceil reads-alone "${reads[@]}" --seconds=2
  timeout 30 "$run" bench/raw_gpu_io "${reads[@]}" --seconds=7 $d/f{0..7} > /dev/null 2>&1 &
  bg=$!
  sleep 1
  ceil copies-beside-reads "${copies[@]}" --seconds=2
  wait $bg
  timeout 30 "$run" bench/raw_gpu_io "${copies[@]}" --seconds=7 $d/f{0..7} > /dev/null 2>&1 &
  bg=$!
  sleep 3
  ceil reads-beside-copies "${reads[@]}" --seconds=2
  wait $bg
  ceil minimal-reader-1m --op=read --qd=16 --slots=16 --lifo --seconds=2
  ceil minimal-reader-4m --op=read --io_bytes=4194304 --qd=8 --slots=8 --lifo --seconds=2
  # tuttid's batches without tuttid: 1 MiB reads landed back to back in slots of R MiB, each slot
  # copied in one copy once its R reads are in; TUTTI_CEILING_BATCHES, each RxS (S slots a file;
  # 4x2 is tuttid's default at 8 devices: posts of 4 MiB, 2 bounce slots a device). With --async,
  # as tuttid's reads (io_uring's workers copy, not the file's own thread).
  ceil minimal-reader-1m-async --op=read --qd=16 --slots=16 --lifo --async --seconds=2
  for b in ${TUTTI_CEILING_BATCHES-4x2 4x4 4x8 8x2}; do
    ceil "minimal-reader-1m-batch-$b" --op=read --qd=16 --reads_per_copy="${b%x*}" \
      --slots="${b#*x}" --lifo --async --seconds=2
  done
  rm -rf $d
fi

# Larger copies to the GPU: a copy of each landed 1 MiB read tops out at 0.87 of a contiguous copy,
# 0.93 in 2 MiB and 0.96 in 4 MiB (stop 56). A batch of one device's reads lands in one bounce slot
# and is copied in one go (its reads are adjacent in the slot and in the layer's GPU staging), so
# read_post_bytes sets the copy size while max_read_bytes sets the I/O size. Variants: see rs_flags
# below (p2r2: 2 MiB reads and posts; p4d4: posts of 4 MiB, 4 bounce slots a device).
if has readsize; then
  mkdir -p /dev/shm/tutti-readsize
  for i in 0 1 2 3 4 5 6 7; do fallocate -l 1G "/dev/shm/tutti-readsize/f$i"; done
  for v in ${TUTTI_READSIZE_COPIES-"--io_bytes=1048576" "--io_bytes=4194304 --qd=8 --slots=8"}; do
    # shellcheck disable=SC2086  # $v is several flags
    j="$(timeout 20 "$run" bench/raw_gpu_io --op=copy --seconds=2 --qd=16 --slots=16 --lifo $v \
      /dev/shm/tutti-readsize/f{0..7} 2>> "$out/raw_gpu_io.log")"
    echo "$j" >> "$out/raw_gpu_io_copy.jsonl"
    summary+=("raw_gpu_io --op=copy 8 threads $v: $(sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p' <<< "$j") GB/s")
  done
  rm -rf /dev/shm/tutti-readsize
  # A variant: "default", or [p<MiB>][d<slots>][r<MiB>][w<N>][g<N>][m<N>][b<N>][k<N>][n<N>][s<N>]:
  # read_post_bytes, read_bounce_depth, max_read_bytes, io.memory_read_workers (1: plain
  # submission), io.memory_read_rings, gpu.io_sm_count, datapath.write_batches_in_flight, and
  # ssd_array.py's --store-batch (blocks a Store call), --ring-nice and
  # --store-rounds (the store figure is the last round's: from round 3 on, every write lands on a
  # slot written before, as the raw writes do on their files filled first). A run:
  # [<part>@]<config>:<variant>, config "N" for tmpfs:N or "lN" for loop:N, part one of
  # ssd_array.py's (default array); engine_loss and ttft run under our own MPS control daemon
  # (where the machine has one) with the engine on the last two CPUs.
  rs_flags() {
    local v=$1
    [[ $v =~ ^p([0-9]+) ]] && echo "--set datapath.read_post_bytes=$((BASH_REMATCH[1] << 20))"
    [[ $v =~ d([0-9]+) ]] && echo "--set datapath.read_bounce_depth=${BASH_REMATCH[1]}"
    [[ $v =~ r([0-9]+) ]] && echo "--set datapath.max_read_bytes=$((BASH_REMATCH[1] << 20))"
    [[ $v =~ w([0-9]+) ]] && echo "--set io.memory_read_workers=${BASH_REMATCH[1]}"
    [[ $v =~ g([0-9]+) ]] && echo "--set io.memory_read_rings=${BASH_REMATCH[1]}"
    [[ $v =~ m([0-9]+) ]] && echo "--set gpu.io_sm_count=${BASH_REMATCH[1]}"
    [[ $v =~ b([0-9]+) ]] && echo "--set datapath.write_batches_in_flight=${BASH_REMATCH[1]}"
    [[ $v =~ k([0-9]+) ]] && echo "--store-batch ${BASH_REMATCH[1]}"
    [[ $v =~ n([0-9]+) ]] && echo "--ring-nice ${BASH_REMATCH[1]}"
    [[ $v =~ s([0-9]+) ]] && echo "--store-rounds ${BASH_REMATCH[1]}"
    true
  }
  runs="${TUTTI_READSIZE_RUNS:-8:p4 8:default 8:p2r2 8:p2 8:p4d4 8:p4 8:default 8:p2r2 8:p2 8:p4d4 4:p4 4:default 1:p4 1:default l4:p4}"
  ncpu=$(nproc)
  apart=(--engine-cpus "$((ncpu - 2))-$((ncpu - 1))" --tuttid-cpus "0-$((ncpu - 3))")
  mps=0
  [[ " $runs" == *" engine_loss@"* || " $runs" == *" ttft@"* ]] && mps_start && mps=1
  for r in $runs; do
    part=array
    [[ $r == *@* ]] && { part=${r%%@*}; r=${r#*@}; }
    c=${r%%:*} v=${r#*:}
    cfg="tmpfs:$c"
    [[ $c == l* ]] && cfg="loop:${c#l}"
    if (( SECONDS > ${TUTTI_READSIZE_CUTOFF:-470} )); then
      summary+=("ssd_array readsize $part@$r skipped at ${SECONDS}s")
      continue
    fi
    extra=()
    [[ $part == engine_loss || $part == ttft ]] && extra=("${apart[@]}")
    # shellcheck disable=SC2046  # the variant's flags are words
    ssd_array_run "${TUTTI_SSD_LABEL:-readsize}-$part-${c}-$v" "$part" "$cfg" 3 $(rs_flags "$v") \
      "${extra[@]}"
    summary+=("ssd_array readsize $part@$r rc=$?")
  done
  if [[ $mps == 1 ]]; then mps_stop; fi
fi

# tmpfs reads with a bounce footprint (pool devices x depth x 1 MiB) the L3 holds or not.
if has bouncefootprint; then
  # The minimal reader into the GPU first: 8 tmpfs files of 1 GiB, slots reused freed-last-first
  # (as tuttid's bounce slots) or oldest-first, few (the L3 holds them) and many.
  mkdir -p /dev/shm/tutti-footprint
  for i in 0 1 2 3 4 5 6 7; do fallocate -l 1G "/dev/shm/tutti-footprint/f$i"; done
  for v in "--slots=16 --lifo" "--slots=64 --lifo" "--slots=64" "--slots=512" \
      "--slots=16 --lifo --no_gpu" "--slots=64 --no_gpu"; do
    # shellcheck disable=SC2086  # $v is several flags
    j="$(timeout 20 "$run" bench/raw_gpu_io --async --seconds=2 --qd=16 $v \
      /dev/shm/tutti-footprint/f{0..7} 2>> "$out/raw_gpu_io.log")"
    echo "$j" >> "$out/raw_gpu_io_footprint.jsonl"
    summary+=("raw_gpu_io 8 tmpfs files $v: $(sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p' <<< "$j") GB/s")
  done
  rm -rf /dev/shm/tutti-footprint
  footprint_run() {  # label part configs [depth]
    local flags=()
    [[ -n ${4:-} ]] && flags=(--set "datapath.read_bounce_depth=$4")
    ssd_array_run "${TUTTI_SSD_LABEL:-footprint}-$1" "$2" "$3" 3 "${flags[@]}"
    summary+=("ssd_array bouncefootprint $1 rc=$?")
  }
  for i in 1 2; do
    footprint_run "t8-default$i" array tmpfs:8
    for d in ${TUTTI_BOUNCE_DEPTHS:-8 4}; do footprint_run "t8-b$d-$i" array tmpfs:8 "$d"; done
  done
  # A small Retrieve beside a large one waits about one round of the large one's slots.
  footprint_run share-b8 share tmpfs:8 8
  footprint_run share-default share tmpfs:8
  footprint_run t1-b16 array tmpfs:1 16
  footprint_run t1-default array tmpfs:1
fi

# A dead engine's memory while the daemon still maps it (free memory, a third process's memory).
if has deadmem; then
  timeout 120 "$run" bench/gpu_dead_memory --out="$out/gpu_dead_memory.jsonl" \
    --machine="$machine" >> "$out/dead_memory.log" 2>&1
  summary+=("gpu_dead_memory rc=$?")
fi

# Last: the experiment that might leave the GPU in a bad state.
if has owner; then
  for s in legacy_kill legacy_exit vmm_kill vmm_exit; do
    timeout 150 "$run" bench/gpu_owner_death --scenario="$s" --out="$out/gpu_owner_death.jsonl" \
      --machine="$machine" >> "$out/owner_death.log" 2>&1
    summary+=("gpu_owner_death $s rc=$?")
  done
fi
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader >> "$out/summary.txt" 2>&1

{
  printf '%s\n' "${summary[@]}"
  echo
  [[ -f "$out/bench.log" ]] && grep -E '^(I/O stream|metric|[a-z_0-9]+ +[0-9.]+ )' "$out/bench.log"
  [[ -f "$out/retrieve.log" ]] && grep -E '^(I/O stream|stored|[a-z_0-9]+ +[0-9.]+ )|rror' "$out/retrieve.log" | cut -c1-150
  [[ -f "$out/interference.log" ]] && grep -E 'loss|daemon_(scatter|gather)|copy-engine|rror' "$out/interference.log" | cut -c1-150
  [[ -f "$out/tests.log" ]] && grep -E '^(survivor|daemon killed)|Failure|FAILED  \]' "$out/tests.log" | head -30 | cut -c1-200
  [[ -f "$out/nvme_tests.log" ]] && grep -E 'Failure|FAILED  \]|fallback reason' "$out/nvme_tests.log" | head -20 | cut -c1-200
  [[ -f "$out/nvme_bench.log" ]] && grep -E '^(metric|[a-z_0-9]+ +[0-9.]+ )|rror' "$out/nvme_bench.log" | cut -c1-160
  [[ -f "$out/ssd_array.log" ]] && grep -E '^  -> |^  small (alone|beside) |^(config |tmpfs:|loop:|share |ttft|dram)|rror|parts failed' "$out/ssd_array.log" | cut -c1-300
  [[ -f "$out/dead_memory.log" ]] && cat "$out/dead_memory.log" | cut -c1-150
  [[ -f "$out/owner_death.log" ]] && grep -v '^$' "$out/owner_death.log" | cut -c1-160
} | tee -a "$out/summary.txt"
