#!/bin/bash
# Device tool: tools/gpu_bundle.sh //daemon:tuttid //client:tuttictl; cp tools/gpu_memory_check.sh .bundle/; run(carry=[".bundle"], command="bash .bundle/gpu_memory_check.sh").
# Starts tuttid in cuda mode on the GPU machine, reads its status (gpu memory taken at start) and
# nvidia-smi's memory figures before/while/after, then stops it.
set -u
R=.bundle/run.sh; D=$(mktemp -d); mkdir -p $D/state $D/pool $D/run
cat > $D/c.textproto <<CFG
state_dir: "$D/state"
listen { socket_path: "$D/run/tuttid.sock" }
pool { dirs: "$D/pool" capacity_bytes: 1073741824 object_bytes: 32768 max_objects: 64 }
gpu { mode: "cuda" }
metrics { listen: "127.0.0.1:9464" }
CFG
before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)
$R daemon/tuttid --config=$D/c.textproto > $D/log 2>&1 & pid=$!
for i in $(seq 60); do [ -S $D/run/tuttid.sock.admin ] && break; sleep 1; done
sleep 1
$R client/tuttictl --admin_socket=$D/run/tuttid.sock.admin status 2>&1 | head -30
during=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)
curl -s 127.0.0.1:9464/metrics 2>/dev/null | grep -c '^tutti_' | sed 's/^/metrics lines: /'
kill -TERM $pid; wait $pid; echo "tuttid exit $?"
echo "nvidia-smi memory.used: before $before, while tuttid ran $during, after $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
grep -E "cuda mode|gpu memory|GPU" $D/log | head -5 | cut -c1-220
