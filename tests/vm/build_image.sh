#!/bin/bash
# Builds (once) the Debian 12 guest that tests/vm/run.sh boots: a debootstrap root filesystem with
# systemd, udev, nvme-cli, the kernel and the runtime libraries of the tutti package, made into a
# raw ext4 disk image, plus the kernel and initrd to boot it directly.
#
# Usage: tests/vm/build_image.sh CACHE_DIR [EXTRA_PACKAGE...]
# Output: CACHE_DIR/guest-KEY/{root.img,vmlinuz,initrd.img,rootfs/}, KEY a hash of this script and
# the package list. An existing complete image is reused; EXTRA_PACKAGEs (the .deb's Depends) missing
# from it are installed into its rootfs with apt in a chroot and root.img is made again.
# Prints the image directory on its last line of stdout. Needs root and Debian's mirror.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:?usage: build_image.sh CACHE_DIR [EXTRA_PACKAGE...]}"
shift
extra=("$@")
mirror="${TUTTI_VM_MIRROR:-http://deb.debian.org/debian}"

# The guest's base: what FACTS.md's recipe boots, plus the runtime libraries tutti links today and
# those the issue-11 work adds (libsystemd0 comes with systemd; prometheus-cpp for the metrics).
base=(systemd systemd-sysv udev kmod iproute2 procps e2fsprogs nvme-cli linux-image-amd64
      initramfs-tools
      libgrpc++1.51 libprotobuf32 libabsl20220623 libspdlog1.10 libfmt9 liburing2 libxxhash0
      libnvme1 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0)
key="$( (cat "$0" "$here/guest-boot.sh" "$here/tutti-vm-boot.service"; printf '%s\n' "${base[@]}") |
        sha256sum | cut -c1-16)"
dir="$cache/guest-$key"
log() { echo "build_image: $*" >&2; }

chroot_run() {
  local root="$1"; shift
  mount --bind /proc "$root/proc"; mount --bind /sys "$root/sys"; mount --bind /dev "$root/dev"
  local rc=0
  LC_ALL=C DEBIAN_FRONTEND=noninteractive chroot "$root" "$@" >&2 || rc=$?
  umount "$root/dev" "$root/sys" "$root/proc"
  return "$rc"
}

make_disk() {  # rootfs -> root.img (no loop mount: mkfs.ext4 -d copies the tree, owners included)
  rm -f "$dir/root.img.new"
  local mib=$(( $(du -sm "$dir/rootfs" | cut -f1) + 768 ))
  truncate -s "${mib}M" "$dir/root.img.new"
  mkfs.ext4 -q -F -L root -d "$dir/rootfs" "$dir/root.img.new"
  mv "$dir/root.img.new" "$dir/root.img"
}

if [ ! -f "$dir/complete" ]; then
  log "building the guest image in $dir (debootstrap; minutes)"
  rm -rf "$dir"; mkdir -p "$dir"
  include="$(IFS=,; echo "${base[*]}")"
  debootstrap --variant=minbase --include="$include" bookworm "$dir/rootfs" "$mirror" >&2
  r="$dir/rootfs"
  printf 'virtio_pci\nvirtio_blk\next4\n' >>"$r/etc/initramfs-tools/modules"
  echo 'MODULES=list' >"$r/etc/initramfs-tools/conf.d/tutti-vm"
  echo tutti-vm >"$r/etc/hostname"
  printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$r/etc/fstab"
  # The boot unit: mounts the payload disk (/dev/vdb) and runs its guest script.
  install -m 0755 "$here/guest-boot.sh" "$r/usr/local/sbin/tutti-vm-boot"
  install -m 0644 "$here/tutti-vm-boot.service" "$r/etc/systemd/system/tutti-vm-boot.service"
  ln -sf /etc/systemd/system/tutti-vm-boot.service \
    "$r/etc/systemd/system/multi-user.target.wants/tutti-vm-boot.service"
  # Nothing else on the serial console; nothing that waits for a network.
  ln -sf /dev/null "$r/etc/systemd/system/serial-getty@ttyS0.service"
  ln -sf /dev/null "$r/etc/systemd/system/getty@tty1.service"
  ln -sf /dev/null "$r/etc/systemd/system/systemd-timesyncd.service"
  ln -sf /dev/null "$r/etc/systemd/system/apt-daily.timer"
  ln -sf /dev/null "$r/etc/systemd/system/apt-daily-upgrade.timer"
  chroot_run "$r" update-initramfs -u -k all
  cp -L "$r/vmlinuz" "$dir/vmlinuz"; cp -L "$r/initrd.img" "$dir/initrd.img"
  chroot_run "$r" apt-get clean
  make_disk
  touch "$dir/complete"
fi

missing=()
for p in "${extra[@]}"; do
  dpkg-query --admindir="$dir/rootfs/var/lib/dpkg" -W -f='${Status}\n' "$p" 2>/dev/null |
    grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing into the cached guest: ${missing[*]}"
  cp /etc/resolv.conf "$dir/rootfs/etc/resolv.conf"
  chroot_run "$dir/rootfs" apt-get update -q
  chroot_run "$dir/rootfs" apt-get install -y -q --no-install-recommends "${missing[@]}"
  chroot_run "$dir/rootfs" apt-get clean
  make_disk
fi
echo "$dir"
