# io_uring NVMe passthrough in the QEMU guest (issue 13, section 3). Sourced by guest_check.sh after
# its "nvme: ... visible" check and before the namespace gets its filesystem, so it uses that
# script's check/pass/fail/skip/show/say. Needs /payload/uring_cmd_device_test (tests/vm/run.sh
# copies it there). Everything here runs as root: Debian 12's 6.1 kernel allows NVMe passthrough
# only with CAP_SYS_ADMIN. Leaves the namespace with an ext4 signature on it (the last check), which
# guest_check.sh's mkfs.ext4 -F then replaces.
PT_NG=/dev/ng0n1 PT_BLK=/dev/nvme0n1 PT_DIR=/tmp/passthru
PT_SOCK=$PT_DIR/tuttid.sock PT_BLOCKS=16 PT_SEED=11

pt_ctl() { timeout 600 tuttictl --socket "$PT_SOCK" "$@"; }
# Starts tuttid with the passthrough config in the background, logging to $1; waits until its
# operator API answers (at most 180 s of the guest's clock). Sets PT_PID.
pt_start() {
  tuttid --config="$PT_DIR/tuttid.textproto" --state_dir="$PT_DIR/state" --socket="$PT_SOCK" \
    2>"$1" &
  PT_PID=$!
  local deadline=$(( $(date +%s) + 180 ))
  while [ "$(date +%s)" -lt "$deadline" ] && kill -0 "$PT_PID" 2>/dev/null; do
    pt_ctl status >/dev/null 2>&1 && return 0
    sleep 1
  done
  return 1
}
pt_stop() { kill -TERM "$PT_PID" 2>/dev/null; wait "$PT_PID"; }

if [ ! -c "$PT_NG" ]; then
  skip "passthrough: io_uring NVMe passthrough" "no $PT_NG (a kernel without NVMe generic char devices)"
else
  mkdir -p "$PT_DIR"
  # 1. The backend against the block device, both ways, and a controller error.
  pt_out="$(TUTTI_PASSTHROUGH_DEVICE=$PT_NG TUTTI_BLOCK_DEVICE=$PT_BLK timeout 600 \
            /payload/uring_cmd_device_test 2>&1)"; pt_rc=$?
  echo "$pt_out" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]' | show
  if [ "$pt_rc" = 0 ] && ! echo "$pt_out" | grep -q '^\[  SKIPPED'; then
    pass "passthrough: uring_cmd on $PT_NG and O_DIRECT on $PT_BLK read the same bytes both ways; an out-of-range LBA is -ERANGE"
  else
    echo "$pt_out" | tail -40 | show
    fail "passthrough: uring_cmd_device_test" "exit $pt_rc"
  fi
  pt_status="$(echo "$pt_out" | grep -o 'NVMe status 0x[0-9a-f]* ([^)]*)' | head -1)"
  if echo "$pt_status" | grep -q 'SC 0x80 LBA out of range'; then
    pass "passthrough: the controller's error is logged with its NVMe status: $pt_status"
  else
    fail "passthrough: the out-of-range LBA's NVMe status in the log" "none found"
  fi

  # 2. tuttid on the raw namespace: created, bench --verify, restart keeps the blocks.
  dd if=/dev/zero of="$PT_BLK" bs=1M count=1 oflag=direct status=none  # a fresh namespace
  cat >"$PT_DIR/tuttid.textproto" <<CONF
pool { capacity_bytes: 268435456 }
dram { capacity_bytes: 0 }
io { backend: "uring_cmd" passthrough_devices: "$PT_NG" fallback: "fail" }
limits { store_staging_bytes: 67108864 retrieve_staging_bytes: 134217728 }
metrics { listen: "off" }
CONF
  if pt_start "$PT_DIR/log1"; then
    grep -E 'NVMe namespace|raw namespaces' "$PT_DIR/log1" | show
    check "passthrough: tuttid created its pool on the raw namespace $PT_NG" "no such log line" \
      grep -q "created on the raw namespaces $PT_NG" "$PT_DIR/log1"
    check "passthrough: tuttictl status says io backend uring_cmd" "another backend" \
      sh -c "timeout 60 tuttictl --socket $PT_SOCK status | grep -E 'io backend +uring_cmd'"
    check "passthrough: tuttictl bench --blocks $PT_BLOCKS --verify on the raw namespace" \
      "bench failed" pt_ctl bench --blocks "$PT_BLOCKS" --seed "$PT_SEED" --verify ||
      grep -E ' [EW] ' "$PT_DIR/log1" | tail -20 | show
    grep -E 'fixed-buffer' "$PT_DIR/log1" | show
    pt_stop
    if pt_start "$PT_DIR/log2"; then
      check "passthrough: after a restart the pool is opened and every block is found (bench --phase retrieve --verify)" \
        "blocks lost" sh -c "grep -q 'opened on the raw namespaces' $PT_DIR/log2 &&
          timeout 600 tuttictl --socket $PT_SOCK bench --blocks $PT_BLOCKS --seed $PT_SEED --phase retrieve --verify"
      pt_stop
    else
      tail -20 "$PT_DIR/log2" | show
      fail "passthrough: tuttid restarts on the raw namespace" "it did not answer"
    fi
  else
    tail -20 "$PT_DIR/log1" | show
    fail "passthrough: tuttid starts with io.backend uring_cmd on $PT_NG" "it did not answer"
  fi

  # 3. A namespace that holds a filesystem is refused and left alone.
  mkfs.ext4 -q -F "$PT_BLK"
  pt_err="$(timeout 180 tuttid --config="$PT_DIR/tuttid.textproto" --state_dir="$PT_DIR/state2" \
            --socket="$PT_SOCK" 2>&1)"; pt_rc=$?
  echo "$pt_err" | tail -1 | show
  if [ "$pt_rc" = 1 ] && echo "$pt_err" | grep -q 'holds an ext2/3/4 filesystem, not a tutti pool' &&
     dumpe2fs -h "$PT_BLK" >/dev/null 2>&1; then
    pass "passthrough: tuttid refuses a namespace holding ext4 and does not touch it"
  else
    fail "passthrough: a namespace holding ext4 is refused" "exit $pt_rc"
  fi
fi
