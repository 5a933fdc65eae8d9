#!/bin/sh
# Baked into the guest image as /usr/local/sbin/tutti-vm-boot and run once by tutti-vm-boot.service
# after multi-user.target: mounts the payload disk (/dev/vdb, made by tests/vm/run.sh for each boot),
# runs its guest_check.sh, and hands the result to the host through QEMU's isa-debug-exit port 0xf4:
# byte 0 (QEMU exits 1) when guest_check.sh exited 0, byte 1 (QEMU exits 3) otherwise.
mkdir -p /payload
if mount -o ro /dev/vdb /payload && [ -x /payload/guest_check.sh ]; then
  /payload/guest_check.sh
  rc=$?
else
  echo "VMTEST: FAIL payload: /dev/vdb or its guest_check.sh is missing"
  rc=99
fi
echo "VMTEST: guest script exited $rc"
sync
if [ "$rc" -eq 0 ]; then byte='\000'; else byte='\001'; fi
printf "$byte" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
# Only reached if the port did not stop QEMU: the host then sees a plain power-off, which it counts
# as a failure.
systemctl poweroff --force --force
