#!/bin/bash
# Dedicates an NVMe SSD to tuttid's "nvme" backend by binding it to vfio-pci, and hands it back to
# the kernel's nvme driver (docs/nvme.md). Prints every step it takes.
#
# Usage (as root):
#   tools/nvme_bind.sh bind   ADDR [--owner USER]  nvme -> vfio-pci; --owner chowns /dev/vfio/N to
#                                                  USER (tuttid without root; see docs/nvme.md)
#   tools/nvme_bind.sh unbind ADDR                 vfio-pci -> nvme (waits for /dev/nvmeX)
#   tools/nvme_bind.sh status ADDR                 driver, IOMMU group and its members, namespaces
#   --dry-run (anywhere): print the steps, change nothing.
# ADDR is the PCI address, 0000:01:00.0 (lspci -D -d ::0108 lists NVMe controllers).
#
# bind refuses (exit 2, changing nothing) a controller any of whose namespaces or partitions is
# mounted (the root filesystem included), used as swap, held by device-mapper/md/LVM (holders), or
# open by a process (when fuser is installed). It warns when another device of the IOMMU group is
# bound to a driver other than vfio-pci: vfio then refuses the group (not viable) until that device
# is bound to vfio-pci too. Exit 0 on success, 1 on a failed step, 2 on a refusal or bad usage.
# NVME_BIND_SYSFS (default /sys) and NVME_BIND_PROC (default /proc) exist for tests.
set -euo pipefail
sysfs="${NVME_BIND_SYSFS:-/sys}"
proc="${NVME_BIND_PROC:-/proc}"
dry=0
args=()
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
set -- "${args[@]+"${args[@]}"}"

say() { echo "nvme_bind: $*"; }
die() { say "FAILED: $*" >&2; exit 1; }
refuse() { say "REFUSED: $*" >&2; exit 2; }
usage() { sed -n '5,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# write VALUE FILE: prints it, then does it (not with --dry-run).
write() {
  say "echo '$1' > $2"
  [ "$dry" = 1 ] && return 0
  echo "$1" >"$2" || die "writing '$1' to $2 failed"
}

cmd="${1:-}"; addr="${2:-}"
[ -n "$cmd" ] && [ -n "$addr" ] || usage
shift 2
owner=""
while [ $# -gt 0 ]; do
  case "$1" in
    --owner) owner="${2:?--owner needs a user}"; shift 2 ;;
    *) say "unknown argument '$1'" >&2; usage ;;
  esac
done
[[ "$addr" =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]] ||
  refuse "'$addr' is not a PCI address like 0000:01:00.0 (lower-case hex)"
dev="$sysfs/bus/pci/devices/$addr"
[ -d "$dev" ] || refuse "no PCI device $addr ($dev is missing)"
class="$(cat "$dev/class")"
[ "$class" = 0x010802 ] || refuse "$addr has PCI class $class: not an NVMe controller (0x010802)"

driver_of() { [ -L "$1/driver" ] && basename "$(readlink "$1/driver")" || echo none; }
group_of() { [ -e "$dev/iommu_group" ] && basename "$(readlink "$dev/iommu_group")" || echo none; }

# The block devices of the controller: namespaces and their partitions (names under /sys/class/block).
block_devices() {
  local ns part
  for ns in "$dev"/nvme/nvme*/nvme*n*; do
    [ -e "$ns/dev" ] || continue
    echo "$(basename "$ns")"
    for part in "$ns"/"$(basename "$ns")"p*; do [ -e "$part/dev" ] && basename "$part"; done
  done
  return 0
}

# Why the controller is in use, one line per reason; nothing when it is free.
uses() {
  local b majmin
  for b in $(block_devices); do
    majmin="$(cat "$sysfs/class/block/$b/dev")"
    awk -v d="$majmin" -v b="$b" '$3 == d { print "/dev/" b " is mounted on " $5 }' \
      "$proc/self/mountinfo"
    awk -v b="/dev/$b" 'NR > 1 && $1 == b { print b " is used as swap" }' "$proc/swaps"
    if [ -n "$(ls -A "$sysfs/class/block/$b/holders" 2>/dev/null)" ]; then
      echo "/dev/$b is held by $(ls "$sysfs/class/block/$b/holders" | tr '\n' ' ')(device-mapper, md or LVM)"
    fi
    if command -v fuser >/dev/null && [ -e "/dev/$b" ] && fuser -s "/dev/$b" 2>/dev/null; then
      echo "/dev/$b is open by a process (fuser -v /dev/$b)"
    fi
  done
  return 0
}

show_group() {
  local g m
  g="$(group_of)"
  if [ "$g" = none ]; then
    say "$addr has no IOMMU group: the IOMMU is off (boot with intel_iommu=on or amd_iommu=on)"
    return 1
  fi
  say "IOMMU group $g: $(ls "$sysfs/kernel/iommu_groups/$g/devices" | wc -l) device(s)"
  for m in "$sysfs/kernel/iommu_groups/$g/devices"/*; do
    say "  $(basename "$m") class $(cat "$m/class") driver $(driver_of "$m")"
  done
}

group_viable() {  # every device of the group on vfio-pci, pci-stub, pcieport or no driver
  local m d ok=0
  for m in "$sysfs/kernel/iommu_groups/$(group_of)/devices"/*; do
    d="$(driver_of "$m")"
    case "$d" in vfio-pci|pci-stub|pcieport|none) ;; *)
      say "WARNING: $(basename "$m") in the same IOMMU group is bound to $d: bind it to vfio-pci" \
          "too, or vfio refuses the group (docs/nvme.md)"; ok=1 ;;
    esac
  done
  return "$ok"
}

do_status() {
  say "$addr: driver $(driver_of "$dev"), driver_override '$(cat "$dev/driver_override" 2>/dev/null)'"
  show_group || true
  local b
  for b in $(block_devices); do say "  /dev/$b"; done
  uses | sed 's/^/nvme_bind:   in use: /'
}

do_bind() {
  local now reasons g
  now="$(driver_of "$dev")"
  if [ "$now" = vfio-pci ]; then say "$addr is already bound to vfio-pci"; show_group; return 0; fi
  reasons="$(uses)"
  [ -z "$reasons" ] || refuse "$addr is in use, leaving it on $now:
$(echo "$reasons" | sed 's/^/  /')"
  [ "$(group_of)" != none ] ||
    refuse "$addr has no IOMMU group: the IOMMU is off (boot with intel_iommu=on or amd_iommu=on); vfio-pci needs one"
  if [ ! -d "$sysfs/bus/pci/drivers/vfio-pci" ]; then
    say "modprobe vfio-pci"
    [ "$dry" = 1 ] || modprobe vfio-pci || die "modprobe vfio-pci failed"
  fi
  write vfio-pci "$dev/driver_override"
  [ "$now" = none ] || write "$addr" "$sysfs/bus/pci/drivers/$now/unbind"
  write "$addr" "$sysfs/bus/pci/drivers_probe"
  [ "$dry" = 1 ] && return 0
  now="$(driver_of "$dev")"
  [ "$now" = vfio-pci ] || die "$addr is bound to $now after drivers_probe, not vfio-pci"
  g="$(group_of)"
  [ -e "/dev/vfio/$g" ] || die "/dev/vfio/$g did not appear"
  say "$addr is bound to vfio-pci: /dev/vfio/$g"
  show_group
  group_viable || true
  if [ -n "$owner" ]; then
    say "chown $owner /dev/vfio/$g"
    chown "$owner" "/dev/vfio/$g" || die "chown $owner /dev/vfio/$g failed"
  fi
}

do_unbind() {
  local now
  now="$(driver_of "$dev")"
  write "" "$dev/driver_override"
  [ "$now" = none ] || [ "$now" = nvme ] || write "$addr" "$sysfs/bus/pci/drivers/$now/unbind"
  if [ "$now" != nvme ]; then
    [ -d "$sysfs/bus/pci/drivers/nvme" ] || { say "modprobe nvme"; [ "$dry" = 1 ] || modprobe nvme; }
    write "$addr" "$sysfs/bus/pci/drivers_probe"
  fi
  [ "$dry" = 1 ] && return 0
  now="$(driver_of "$dev")"
  [ "$now" = nvme ] || die "$addr is bound to $now after drivers_probe, not nvme"
  local i
  for i in $(seq 1 60); do  # the namespaces appear once the driver's async probe is done
    [ -n "$(block_devices)" ] && break
    sleep 0.5
  done
  [ -n "$(block_devices)" ] || die "$addr is on nvme but no namespace appeared within 30 s"
  say "$addr is bound to nvme again: $(block_devices | sed 's|^|/dev/|' | tr '\n' ' ')"
}

case "$cmd" in
  bind) do_bind ;;
  unbind) do_unbind ;;
  status) do_status ;;
  *) usage ;;
esac
