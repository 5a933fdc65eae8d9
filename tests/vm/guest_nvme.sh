# The VM test's user-space NVMe phase (issue 13), sourced by guest_check.sh after its other checks
# (it uses their say/pass/fail/check/show). The guest boots with QEMU's emulated IOMMU
# (-device intel-iommu, intel_iommu=on iommu=pt: kernel drivers keep identity mappings, vfio gets a
# translated domain). On the one emulated controller, whose namespace still holds the mounted
# pool: tools/nvme_bind.sh must refuse it while mounted; after umount it binds it to vfio-pci,
# /payload/vfio_device_test (daemon/io/nvme, gtest) drives it through daemon/io/nvme/vfio.h
# (open, BAR0 CAP/VS, DMA map/unmap with hugepages, Identify by DMA through the IOMMU, shutdown),
# /payload/vfio_controller_test runs the controller driver (controller.h, queue_pair.h) on it
# (bring-up, Identify, reads/writes with the data checked, wrap-around, an out-of-range LBA,
# Flush, shutdown; SGL and PRP), and nvme_bind.sh hands it back to nvme, whose namespace must read
# again.
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
  gtest "vfio: vfio_device_test: vfio.h against the controller under the emulated IOMMU" "" \
    6 /payload/vfio_device_test "$addr"
  gtest "vfio: vfio_controller_test: the controller driver (controller.h) over vfio.h: bring-up," \
    "Identify, reads/writes checked, wrap-around, out-of-range LBA, Flush, shutdown (SGL and PRP)" \
    10 /payload/vfio_controller_test "$addr"
  check "vfio: nvme_bind.sh unbind $addr (vfio-pci -> nvme)" "unbind failed" "$bind" unbind "$addr"
  check "vfio: the namespace reads again on nvme (dd 1 MiB O_DIRECT)" "no read" \
    dd if=/dev/nvme0n1 of=/dev/null bs=1M count=1 iflag=direct
  say "vfio: the user-space NVMe phase took $(( $(date +%s) - t0 )) s (emulated: means nothing)"
}
nvme_phase
