#!/bin/bash
# GPUDirect Storage on this host: is libcufile there, can it move data, and does tuttid fall back
# to uring with the reason when it cannot (docs/nvme.md, "GDS").
# Build here, then run on the GPU machine with the device tool:
#   tools/gpu_bundle.sh //daemon/io:gds_probe //daemon:tuttid //client:tuttictl
#   run(carry=[".bundle"], command="bash gpu/gds_probe.sh")
# Part 1 runs daemon/io/gds_probe (tuttid's own detection, on a file of DIR); part 2 starts tuttid
# in gpu.mode "auto" with io.backend "gds" and shows `tuttictl status`, the metric and the log
# line; part 3 the same with io.fallback "fail" (expected: tuttid refuses to start, naming the
# reason). DIR: $GDS_PROBE_DIR, default /var/tmp (the GPU machine's ext4 disk). Output also goes
# to $OUT/gds_probe.txt when $OUT is set.
set -u
R=.bundle/run.sh
dir="${GDS_PROBE_DIR:-/var/tmp}"
report="${OUT:-/tmp}/gds_probe.txt"
exec > >(tee "$report") 2>&1

# libcufile is not bundled (tuttid never links it): find the host's copy for the loader.
for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/targets/x86_64-linux/lib \
         /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  if ls "$d"/libcufile.so* > /dev/null 2>&1; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
    echo "libcufile found in $d: $(ls "$d"/libcufile.so* | xargs -n1 basename | tr '\n' ' ')"
    break
  fi
done
echo "/dev/nvidia-fs: $([ -e /dev/nvidia-fs* ] 2>/dev/null && echo present || echo absent)"
echo "file system of $dir: $(stat -f -c %T "$dir" 2>/dev/null) ($(df --output=source "$dir" | tail -1))"
[ -r /etc/cufile.json ] && echo "/etc/cufile.json: $(grep -E '"allow_compat_mode"' /etc/cufile.json | tr -s ' ')"
echo
echo "== 1. gds_probe (tuttid's detection, run directly)"
$R daemon/io/gds_probe --dir="$dir"
echo "gds_probe rc=$?"

# Starts tuttid with io.backend "gds" and io.fallback $1 in a fresh directory under $dir.
start_tuttid() {
  D=$(mktemp -d "$dir/gds_probe_tuttid.XXXXXX"); mkdir -p "$D/state" "$D/pool" "$D/run"
  cat > "$D/c.textproto" <<CFG
state_dir: "$D/state"
listen { socket_path: "$D/run/tuttid.sock" }
pool { dirs: "$D/pool" capacity_bytes: 268435456 object_bytes: 32768 max_objects: 8 }
io { backend: "gds" fallback: "$1" }
gpu { mode: "auto" }
metrics { listen: "127.0.0.1:0" }
CFG
  $R daemon/tuttid --config="$D/c.textproto" > "$D/log" 2>&1 & pid=$!
  for _ in $(seq 60); do
    [ -S "$D/run/tuttid.sock.admin" ] && break
    kill -0 $pid 2> /dev/null || break
    sleep 1
  done
}

echo
echo "== 2. tuttid with io.backend \"gds\" (io.fallback \"uring\")"
start_tuttid uring
$R client/tuttictl --admin_socket="$D/run/tuttid.sock.admin" status 2>&1 | head -20
port=$(grep -oE 'metrics on http://127.0.0.1:[0-9]+' "$D/log" | grep -oE '[0-9]+$' | head -1)
[ -n "$port" ] && curl -s "127.0.0.1:$port/metrics" | grep '^tutti_io_backend_info'
grep -E 'io backend|cuda mode|host mode' "$D/log" | cut -c1-300 | head -5
kill -TERM $pid 2> /dev/null; wait $pid; echo "tuttid exit $?"
rm -rf "$D"

echo
echo "== 3. tuttid with io.backend \"gds\" and io.fallback \"fail\" (expected: refuses to start)"
start_tuttid fail
wait $pid; echo "tuttid exit $?"
tail -2 "$D/log" | cut -c1-300
rm -rf "$D"
