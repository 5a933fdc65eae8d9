# The VM test's user-space NVMe phase (issue 13), sourced by guest_check.sh after its other checks
# (it uses their say/pass/fail/check/show). The guest boots with QEMU's emulated IOMMU
# (-device intel-iommu, intel_iommu=on iommu=pt: kernel drivers keep identity mappings, vfio gets a
# translated domain). On the one emulated controller, whose namespace still holds the mounted
# pool: tools/nvme_bind.sh must refuse it while mounted; after umount it binds it to vfio-pci,
# /payload/vfio_device_test (daemon/io/nvme, gtest) drives it through daemon/io/nvme/vfio.h
# (open, BAR0 CAP/VS, DMA map/unmap with hugepages, Identify by DMA through the IOMMU, shutdown),
# /payload/vfio_controller_test runs the controller driver (controller.h, queue_pair.h) on it
# (bring-up, Identify, reads/writes with the data checked, wrap-around, an out-of-range LBA,
# Flush, shutdown; SGL and PRP). tuttid itself (/payload/tuttid, as root) with
# io { backend: "nvme" } on the controller: right after the bind it refuses the namespace, which
# still holds the ext4 filesystem; after the gtests, its first 1 MiB zeroed, it creates its pool
# there, status says "nvme",
# bench --verify, a SIGTERM restart keeps the blocks, and after kill -9 during stores (3 rounds)
# every store acknowledged before comes back. Last nvme_bind.sh hands the controller back to nvme,
# whose namespace must read again.
# Timings under emulation mean nothing.
# gtest NAME MORE WANT BINARY ADDR: runs a gtest binary on the controller; PASS when it exits 0
# with WANT tests passed and none skipped.
gtest() {
  local name="$1 $2" want="$3" bin="$4" addr="$5" out rc
  out="$(TUTTI_VFIO_PCI="$addr" TUTTI_VFIO_SERIAL=deadbeef timeout 300 "$bin" 2>&1)"; rc=$?
  echo "$out" | grep -vE '^\[ (RUN|      OK) ' | show
  if [ "$rc" = 0 ] && echo "$out" | grep -q "^\[  PASSED  \] $want tests" &&
     ! echo "$out" | grep -q '^\[  SKIPPED \]'; then pass "${name% } ($want tests)"
  else fail "$name" "exit $rc (or tests skipped, or not $want passed)"; fi
}
TN=/var/tmp/tutti-nvme  # the nvme-backend tuttid's config, state_dir, sockets and log
tn() { timeout 300 /payload/tuttictl --socket "$TN/tuttid.sock" "$@"; }
# tn_start: tuttid in the background (TN_PID); 0 once it answers status, 1 if it exits first.
tn_start() {
  /payload/tuttid --config="$TN/config" >>"$TN/log" 2>&1 &
  TN_PID=$!
  for _ in $(seq 1 300); do
    tn status >/dev/null 2>&1 && return 0
    kill -0 "$TN_PID" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
tn_stop() { kill -TERM "$TN_PID"; wait "$TN_PID"; }
# tn_config ADDR: the config: the pool on the controller's namespace 1 through tuttid's driver.
tn_config() {
  rm -rf "$TN"; mkdir -p "$TN"
  cat >"$TN/config" <<EOF
state_dir: "$TN/state"
listen { socket_path: "$TN/tuttid.sock" socket_mode: 0600 socket_group: "" }
pool { capacity_bytes: 268435456 }
io { backend: "nvme" nvme_devices: "$1" fallback: "fail" }
dram { capacity_bytes: 0 }
limits { max_blocks_per_call: 256 store_staging_bytes: 67108864 retrieve_staging_bytes: 67108864 }
metrics { listen: "off" }
EOF
}
# nvme_refuses_ext4 ADDR: the namespace still holds the ext4 filesystem: tuttid must not start.
nvme_refuses_ext4() {
  local out rc
  tn_config "$1"
  out="$(timeout 300 /payload/tuttid --config="$TN/config" 2>&1)"; rc=$?
  echo "$out" | tail -4 | show
  if [ "$rc" != 0 ] && echo "$out" | grep -q 'ext2/3/4'; then
    pass "nvme backend: tuttid refuses the namespace holding ext4 (exit $rc, names it)"
  else fail "nvme backend: tuttid refuses a namespace holding ext4" "exit $rc, no 'ext2/3/4'"; fi
}
# nvme_tuttid ADDR: tuttid on the (zeroed) namespace: status, bench, restart, kill -9 under stores.
nvme_tuttid() {
  local round acked out
  tn_config "$1"
  tn_start || { fail "nvme backend: tuttid starts" "$(tail -5 "$TN/log")"; return; }
  grep -E 'pool |io backend|nvme ' "$TN/log" | tail -4 | show
  if grep -q "created on the raw namespaces $1 (tuttid's NVMe driver)" "$TN/log"; then
    pass "nvme backend: tuttid created its pool on the zeroed namespace"
  else fail "nvme backend: pool created on the namespace" "no 'created on the raw namespaces $1'"; fi
  out="$(tn status 2>&1)"; echo "$out" | show
  if echo "$out" | grep -qE 'io backend +nvme'; then
    pass "nvme backend: tuttid runs with io.backend \"nvme\" on $1 (status: io backend nvme)"
  else fail "nvme backend: status shows io backend nvme" "$(tn status 2>&1 | grep backend)"; fi
  check "nvme backend: bench --blocks 16 --verify with the pool on the namespace" "mismatch or error" \
    tn bench --blocks 16 --seed 7 --verify
  tn_stop
  tn_start && check "nvme backend: a SIGTERM restart keeps the blocks (bench --phase retrieve --verify)" \
    "mismatch or miss" tn bench --blocks 16 --seed 7 --phase retrieve --verify
  for round in 1 2 3; do  # kill -9 during stores; every store acknowledged before comes back
    (for seed in $(seq $((round * 100)) $((round * 100 + 50))); do
       tn bench --blocks 4 --seed "$seed" --phase store >/dev/null 2>&1 || break
       echo "$seed" >>"$TN/acked"
     done) &
    sleep $((round + 2))
    kill -9 "$TN_PID"; wait "$TN_PID" 2>/dev/null; wait $!
    tn_start || { fail "nvme backend: restart after kill -9 (round $round)" "$(tail -5 "$TN/log")"; return; }
  done
  acked="$(cat "$TN/acked" 2>/dev/null | tr '\n' ' ')"
  if [ -n "$acked" ] && tn_verify $acked; then
    pass "nvme backend: 3 kill -9 during stores, restarted: all $(echo $acked | wc -w) acknowledged stores (4 blocks each) come back"
  else fail "nvme backend: kill -9 during stores" "acknowledged: '$acked'; a retrieve missed or mismatched"; fi
  tn_stop
  if grep -q 'controller shut down' "$TN/log"; then
    pass "nvme backend: tuttid shut the controller down at exit (SIGTERM)"
  else fail "nvme backend: controller shut down at exit" "no 'controller shut down' in its log"; fi
}
# tn_verify SEEDS...: each seed's 4 blocks are found and match.
tn_verify() {
  local s
  for s in "$@"; do tn bench --blocks 4 --seed "$s" --phase retrieve --verify >/dev/null || return 1; done
}
nvme_phase() {
  local addr bind=/payload/nvme_bind.sh out rc t0
  t0=$(date +%s)
  addr="$(basename "$(readlink -f /sys/class/nvme/nvme0/device)")"
  say "vfio: the emulated controller is $addr; IOMMU group $(basename "$(readlink /sys/bus/pci/devices/$addr/iommu_group 2>/dev/null)" 2>/dev/null)"
  if [ ! -e "/sys/bus/pci/devices/$addr/iommu_group" ]; then
    fail "vfio: the controller has an IOMMU group" "none: was the guest booted with intel-iommu?"
    return
  fi
  out="$("$bind" bind "$addr" 2>&1)"; rc=$?
  echo "$out" | show
  if [ "$rc" = 2 ] && echo "$out" | grep -q 'mounted on /mnt/nvme0'; then
    pass "vfio: nvme_bind.sh refuses the controller while its namespace is mounted (exit 2)"
  else fail "vfio: nvme_bind.sh refuses a mounted controller" "exit $rc, no 'mounted on /mnt/nvme0'"; fi
  umount /mnt/nvme0 || { fail "vfio: umount /mnt/nvme0" "umount failed"; return; }
  echo 4 >/proc/sys/vm/nr_hugepages  # 8 MiB of 2 MiB pages for the DMA allocator
  check "vfio: nvme_bind.sh bind $addr (nvme -> vfio-pci)" "bind failed" "$bind" bind "$addr" ||
    return
  nvme_refuses_ext4 "$addr"  # before the gtests, which write LBA 0
  gtest "vfio: vfio_device_test: vfio.h against the controller under the emulated IOMMU" "" \
    6 /payload/vfio_device_test "$addr"
  gtest "vfio: vfio_controller_test: the controller driver (controller.h) over vfio.h: bring-up," \
    "Identify, reads/writes checked, wrap-around, out-of-range LBA, Flush, shutdown (SGL and PRP)" \
    10 /payload/vfio_controller_test "$addr"
  # A fresh namespace for the pool: its first 1 MiB zeroed (on the kernel's driver), bound again.
  { "$bind" unbind "$addr" && dd if=/dev/zero of=/dev/nvme0n1 bs=1M count=1 oflag=direct &&
    "$bind" bind "$addr"; } >/dev/null 2>&1 ||
    { fail "vfio: zero the namespace's first 1 MiB and bind again" "unbind, dd or bind failed"; return; }
  nvme_tuttid "$addr"
  check "vfio: nvme_bind.sh unbind $addr (vfio-pci -> nvme)" "unbind failed" "$bind" unbind "$addr"
  check "vfio: the namespace reads again on nvme (dd 1 MiB O_DIRECT)" "no read" \
    dd if=/dev/nvme0n1 of=/dev/null bs=1M count=1 iflag=direct
  say "vfio: the user-space NVMe phase took $(( $(date +%s) - t0 )) s (emulated: means nothing)"
}
nvme_phase
