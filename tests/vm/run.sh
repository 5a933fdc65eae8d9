#!/bin/bash
# The VM test (issue 11, section 7): boots a Debian 12 guest with systemd and QEMU's emulated NVMe
# controller (q35, software emulation: TCG) and runs tests/vm/guest_check.sh in it: install the .deb,
# start the instance with its pool on the NVMe namespace, READY and STATUS, bench --verify, devices,
# a SMART critical warning injected from here through QMP, kill -9 and SIGSTOP (watchdog) restarts,
# metrics, upgrade to a higher version (the blocks survive) and purge; then (guest_nvme.sh) the
# controller bound to vfio-pci behind QEMU's emulated IOMMU, driven by daemon/io/nvme/vfio.h. The guest's result decides:
# exit 0 only if the guest reported "RESULT PASS" through the isa-debug-exit port.
#
# Usage (as root): tests/vm/run.sh
# Environment: TUTTI_VM_CACHE  where the guest image is cached (default /var/cache/tutti-vm; built
#                              by tests/vm/build_image.sh on first use, about 110 MiB downloaded)
#              TUTTI_VM_TIMEOUT seconds the guest may run (default 1200)
#              TUTTI_VM_KEEP=1  keep the work directory (console log, images)
#              TUTTI_VM_FAULT=norestart  proves the test can fail: the guest gives the unit
#                              Restart=no, so its kill -9 check must fail (and this script exit 1)
# Needs: qemu-system-x86, qemu-utils, debootstrap, e2fsprogs, python3 (deploy/debian-packages.txt).
# Timings under emulation mean nothing; the ones printed here only say how long CI waits.
set -uo pipefail
cd "$(dirname "$0")/../.."
here=tests/vm
cache="${TUTTI_VM_CACHE:-/var/cache/tutti-vm}"
limit="${TUTTI_VM_TIMEOUT:-1200}"
t0=$(date +%s)
log() { echo "vm: $*"; }
die() { log "FAILED: $*"; exit 1; }
since() { echo "$(( $(date +%s) - $1 )) s"; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot)"
for tool in qemu-system-x86_64 qemu-img debootstrap mkfs.ext4 python3 dpkg-deb; do
  command -v "$tool" >/dev/null || die "$tool is missing (tools/install-deps.sh installs it)"
done
work="$(mktemp -d /tmp/tutti-vm.XXXXXX)"
qemu_pid=""
cleanup() {
  [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null
  if [ "${TUTTI_VM_KEEP:-0}" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# 1. The package, twice: V2 (a higher version, same contents) tests the upgrade.
t=$(date +%s)
bazel build //daemon:tuttid //client:tuttictl //client/python:wheel >"$work/bazel.log" 2>&1 ||
  { tail -30 "$work/bazel.log"; die "bazel build failed"; }
bazel build //daemon/io/nvme:vfio_device_test //daemon/io/nvme:vfio_controller_test >>"$work/bazel.log" 2>&1 ||
  { tail -30 "$work/bazel.log"; die "bazel build of the vfio guest test failed"; }
bazel build //gpu:tutti-release >>"$work/bazel.log" 2>&1 ||
  log "note: //gpu:tutti-release did not build; the package goes without it"
base="0.1.$(git rev-list --count HEAD 2>/dev/null || echo 0)"
v1="$base" v2="$base+vmtest1"
mkdir -p "$work/payload"
for v in "$v1" "$v2"; do
  tools/make_deb.sh --no-build --version "$v" --out "$work/payload" >/dev/null 2>"$work/deb.log" ||
    { cat "$work/deb.log"; die "tools/make_deb.sh failed"; }
done
echo "$v1 $v2" >"$work/payload/versions"
[ -n "${TUTTI_VM_FAULT:-}" ] && echo "$TUTTI_VM_FAULT" >"$work/payload/fault"
install -m 0755 "$here/guest_check.sh" "$work/payload/guest_check.sh"
# The user-space NVMe phase (guest_nvme.sh): the bind tool and the vfio gtests (their libraries,
# abseil's and spdlog's, are the package's Depends, already in the image).
install -m 0644 "$here/guest_nvme.sh" "$work/payload/guest_nvme.sh"
install -m 0755 tools/nvme_bind.sh "$work/payload/nvme_bind.sh"
install -m 0755 bazel-bin/daemon/io/nvme/vfio_device_test "$work/payload/vfio_device_test"
install -m 0755 bazel-bin/daemon/io/nvme/vfio_controller_test "$work/payload/vfio_controller_test"
# tuttid and tuttictl for its "nvme" backend (the package is purged by then).
install -m 0755 bazel-bin/daemon/tuttid "$work/payload/tuttid"
install -m 0755 bazel-bin/client/tuttictl "$work/payload/tuttictl"
# io_uring passthrough (tests/vm/passthrough_check.sh, sourced by guest_check.sh): its device test.
bazel build //daemon/io:uring_cmd_device_test >>"$work/bazel.log" 2>&1 ||
  { tail -30 "$work/bazel.log"; die "bazel build of //daemon/io:uring_cmd_device_test failed"; }
install -m 0755 "$here/passthrough_check.sh" bazel-bin/daemon/io/uring_cmd_device_test "$work/payload/"
depends="$(dpkg-deb -f "$work/payload/tutti_${v1}_amd64.deb" Depends | tr -d ' ' | tr ',' ' ')"
log "packages tutti $v1 and $v2 built ($(since "$t")); Depends: $depends"

# 2. The guest image (cached), with the package's Depends in it.
t=$(date +%s)
image="$("$here/build_image.sh" "$cache" $depends | tail -1)" || die "building the guest image failed"
[ -f "$image/complete" ] || die "no guest image in '$image'"
log "guest image $image ready ($(since "$t"))"

# 3. Disks: a copy-on-write overlay over the cached root, the payload, a 1 GiB NVMe namespace.
qemu-img create -q -f qcow2 -F raw -b "$image/root.img" "$work/root.qcow2" || die "qemu-img failed"
mib=$(( $(du -sm "$work/payload" | cut -f1) + 32 ))
truncate -s "${mib}M" "$work/payload.img"
mkfs.ext4 -q -F -L payload -d "$work/payload" "$work/payload.img" || die "mkfs.ext4 of the payload failed"
truncate -s 1G "$work/nvme.img"

# 4. Boot. The guest's lines go to console.log; "VMTEST-HOST: inject-smart-warning" from the guest
# makes this side set the controller's SMART critical warning (bit 2: reliability degraded) by QMP.
t=$(date +%s)
console="$work/console.log"
# -device intel-iommu (and intel_iommu=on): the emulated IOMMU that vfio-pci needs (guest_nvme.sh);
# iommu=pt keeps the kernel's own drivers on identity mappings, as fast as without it.
qemu-system-x86_64 -machine q35 -accel tcg -cpu max -m 2G -smp 2 -device intel-iommu \
  -display none -monitor none -serial "file:$console" -no-reboot \
  -qmp "unix:$work/qmp.sock,server=on,wait=off" \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
  -append "console=ttyS0 root=/dev/vda rw panic=-1 quiet loglevel=3 systemd.show_status=0 intel_iommu=on iommu=pt" \
  -drive "file=$work/root.qcow2,if=virtio,format=qcow2" \
  -drive "file=$work/payload.img,if=virtio,format=raw,readonly=on" \
  -drive "file=$work/nvme.img,if=none,id=nvm,format=raw" \
  -device nvme,id=nvm0,serial=deadbeef,drive=nvm >"$work/qemu.log" 2>&1 &
qemu_pid=$!
log "QEMU started (pid $qemu_pid); guest output follows (its timings mean nothing: emulation)"

qmp_smart_warning() {
  python3 - "$work/qmp.sock" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
def call(cmd, **args):
    f.write(json.dumps({"execute": cmd, "arguments": args} if args else {"execute": cmd}) + "\n")
    f.flush()
    while True:
        reply = json.loads(f.readline())
        if "return" in reply or "error" in reply:
            return reply
json.loads(f.readline())  # greeting
call("qmp_capabilities")
r = call("qom-set", path="/machine/peripheral/nvm0", property="smart_critical_warning", value=4)
print("qom-set smart_critical_warning=4:", r)
sys.exit(0 if "return" in r else 1)
PY
}

shown=0 injected=0
touch "$console"
while kill -0 "$qemu_pid" 2>/dev/null; do
  n=$(wc -l <"$console")
  if [ "$n" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${n}p" "$console" | tr -d '\r' | grep -E '^(VMTEST|    \|)'
    shown=$n
  fi
  if [ "$injected" = 0 ] && grep -q 'VMTEST-HOST: inject-smart-warning' "$console"; then
    injected=1
    qmp_smart_warning | sed 's/^/vm: /' || log "the QMP qom-set failed"
  fi
  if [ $(( $(date +%s) - t )) -gt "$limit" ]; then
    log "the guest ran past ${limit} s: stopping QEMU"
    kill "$qemu_pid"
    break
  fi
  sleep 1
done
wait "$qemu_pid"; qemu_rc=$?
qemu_pid=""
sed -n "$((shown + 1)),\$p" "$console" | tr -d '\r' | grep -E '^(VMTEST|    \|)'
boot_s=$(since "$t")

# 5. The verdict: isa-debug-exit byte 0 (QEMU exit 1) and the guest's RESULT PASS line.
log "guest finished (QEMU exit $qemu_rc) after $boot_s; whole VM test $(since "$t0")"
log "timings under emulation (TCG, no KVM) mean nothing: behaviour is tested, not speed"
if [ "$qemu_rc" = 1 ] && grep -q '^VMTEST: RESULT PASS' "$console"; then
  log "PASSED"
  exit 0
fi
log "last lines of the console:"
tr -d '\r' <"$console" | grep -vE '^(VMTEST|    \|)' | tail -40
[ -s "$work/qemu.log" ] && { log "QEMU said:"; cat "$work/qemu.log"; }
die "the guest did not report RESULT PASS (QEMU exit $qemu_rc: 1 pass, 3 fail, else no report)"
