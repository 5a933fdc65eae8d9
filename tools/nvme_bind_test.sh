#!/bin/bash
# tools/nvme_bind.sh against a made-up sysfs and /proc (NVME_BIND_SYSFS, NVME_BIND_PROC): it refuses
# a controller whose namespace or partition is mounted, used as swap or held by device-mapper, and a
# device that is not an NVMe controller, changing nothing; --dry-run prints the bind's steps; a bind
# the kernel did not carry out (the made-up driver link stays on nvme) is reported as a failure.
set -u
script="${1:?usage: nvme_bind_test.sh tools/nvme_bind.sh}"
root="${TEST_TMPDIR:-$(mktemp -d)}/nvme_bind"
addr=0000:00:04.0
failures=0
expect() {  # expect NAME WANT_RC WANT_TEXT ARGS...
  local name="$1" want_rc="$2" want_text="$3"; shift 3
  local out rc
  out="$(NVME_BIND_SYSFS="$root/sys" NVME_BIND_PROC="$root/proc" bash "$script" "$@" 2>&1)"; rc=$?
  if [ "$rc" = "$want_rc" ] && grep -qF -- "$want_text" <<<"$out"; then echo "PASS: $name"
  else echo "FAIL: $name: exit $rc (want $want_rc), output:"; echo "$out" | sed 's/^/  | /'
    failures=$((failures + 1)); fi
}
make_tree() {
  rm -rf "$root"
  local d="$root/sys/bus/pci/devices/$addr"
  mkdir -p "$d/nvme/nvme0/nvme0n1/nvme0n1p1" "$root/sys/bus/pci/drivers/nvme" \
           "$root/sys/bus/pci/drivers/vfio-pci" "$root/sys/kernel/iommu_groups/7/devices" \
           "$root/sys/class/block/nvme0n1/holders" "$root/sys/class/block/nvme0n1p1/holders" \
           "$root/proc/self"
  echo 0x010802 >"$d/class"
  : >"$d/driver_override"
  : >"$root/sys/bus/pci/drivers/nvme/unbind"
  : >"$root/sys/bus/pci/drivers_probe"
  ln -s ../../drivers/nvme "$d/driver"
  ln -s "$root/sys/kernel/iommu_groups/7" "$d/iommu_group"
  ln -s "$d" "$root/sys/kernel/iommu_groups/7/devices/$addr"
  echo 259:0 >"$d/nvme/nvme0/nvme0n1/dev"; echo 259:0 >"$root/sys/class/block/nvme0n1/dev"
  echo 259:1 >"$d/nvme/nvme0/nvme0n1/nvme0n1p1/dev"; echo 259:1 >"$root/sys/class/block/nvme0n1p1/dev"
  echo '22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw' >"$root/proc/self/mountinfo"
  echo 'Filename Type Size Used Priority' >"$root/proc/swaps"
}

make_tree
echo '40 22 259:1 / /mnt/pool rw,relatime shared:9 - ext4 /dev/nvme0n1p1 rw' >>"$root/proc/self/mountinfo"
expect "refuses a mounted partition" 2 "/dev/nvme0n1p1 is mounted on /mnt/pool" bind "$addr"
if [ -s "$root/sys/bus/pci/devices/$addr/driver_override" ]; then
  echo "FAIL: a refused bind wrote driver_override"; failures=$((failures + 1)); fi

make_tree
echo '/dev/nvme0n1 partition 1048572 0 -2' >>"$root/proc/swaps"
expect "refuses a namespace used as swap" 2 "/dev/nvme0n1 is used as swap" bind "$addr"

make_tree
mkdir "$root/sys/class/block/nvme0n1/holders/dm-0"
expect "refuses a namespace held by device-mapper" 2 "/dev/nvme0n1 is held by dm-0" bind "$addr"

make_tree
echo 0x020000 >"$root/sys/bus/pci/devices/$addr/class"
expect "refuses a device that is not an NVMe controller" 2 "not an NVMe controller" bind "$addr"

make_tree
expect "refuses a malformed address" 2 "is not a PCI address" bind 00:04.0

make_tree
expect "--dry-run prints the steps" 0 \
  "echo '$addr' > $root/sys/bus/pci/drivers/nvme/unbind" bind "$addr" --dry-run
expect "--dry-run prints driver_override" 0 \
  "echo 'vfio-pci' > $root/sys/bus/pci/devices/$addr/driver_override" bind "$addr" --dry-run
if [ -s "$root/sys/bus/pci/devices/$addr/driver_override" ]; then
  echo "FAIL: --dry-run wrote driver_override"; failures=$((failures + 1)); fi

make_tree
expect "a bind the kernel did not do fails" 1 "is bound to nvme after drivers_probe, not vfio-pci" \
  bind "$addr"
grep -qx vfio-pci "$root/sys/bus/pci/devices/$addr/driver_override" ||
  { echo "FAIL: bind did not write driver_override"; failures=$((failures + 1)); }

make_tree
expect "status lists the group and the namespaces" 0 "IOMMU group 7: 1 device(s)" status "$addr"

echo "$failures failure(s)"
[ "$failures" = 0 ]
