#!/bin/bash
# The VM test's checks, run inside the Debian 12 guest by tutti-vm-boot.service (tests/vm/guest-boot.sh)
# from the payload disk that tests/vm/run.sh makes for each boot: /payload holds this script,
# tutti_V1_amd64.deb, tutti_V2_amd64.deb (V2 > V1, same contents) and `versions` ("V1 V2").
#
# Prints one line per check on the serial console: "VMTEST: PASS: <check>",
# "VMTEST: FAIL: <check>: <why>" or "VMTEST: SKIPPED: <check>: <why>" (a feature the code does not
# have yet: no tuttid@.service, no WatchdogSec, no metrics endpoint, no `tuttictl devices`), the
# commands' output indented below, and last "VMTEST: RESULT PASS|FAIL (...)". Exit status 0 only
# when no check failed. "VMTEST-HOST: inject-smart-warning" asks the host to set the NVMe
# controller's SMART critical warning through QMP. Timings under emulation (TCG) mean nothing.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
read -r V1 V2 </payload/versions
# A fault to prove the test can fail (tests/vm/run.sh's TUTTI_VM_FAULT): "norestart" gives the
# unit Restart=no, so the kill -9 check (and those after it) must fail.
FAULT="$(cat /payload/fault 2>/dev/null)"
DEB1=/payload/tutti_${V1}_amd64.deb
DEB2=/payload/tutti_${V2}_amd64.deb
POOL=/mnt/nvme0/tutti
BLOCKS=48  # of 2 MiB (the default Llama-3-8B shape): 96 MiB stored and retrieved
SEED=7
passed=0 failed=0 skipped=0

say() { echo "VMTEST: $*"; }
pass() { say "PASS: $1"; passed=$((passed + 1)); }
fail() { say "FAIL: $1: $2"; failed=$((failed + 1)); }
skip() { say "SKIPPED: $1: $2"; skipped=$((skipped + 1)); }
show() { sed 's/^/    | /'; }  # indents a command's output under its check
# check NAME WHY-IF-FAILED COMMAND...: runs COMMAND (output shown), PASS if it exits 0.
check() {
  local name="$1" why="$2"; shift 2
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  [ -n "$out" ] && echo "$out" | show
  if [ "$rc" -eq 0 ]; then pass "$name"; else fail "$name" "$why (exit $rc)"; fi
  return "$rc"
}
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
T0=$(date +%s)

main_pid() { systemctl show -p MainPID --value "$UNIT"; }
# Waits (up to $1 s of the clock) until $UNIT is active with a main PID other than $2. Prints the
# new PID. A restart here takes a few seconds even under emulation; the bound only caps a failure.
wait_restarted() {
  local deadline=$(( $(date +%s) + $1 )) old="$2" pid
  while [ "$(date +%s)" -lt "$deadline" ]; do
    pid="$(main_pid)"
    if [ "$pid" != 0 ] && [ "$pid" != "$old" ] && [ "$(systemctl is-active "$UNIT")" = active ]; then
      echo "$pid"; return 0
    fi
    sleep 1
  done
  return 1
}
find_socket() { find /run/tutti -type s -name '*.sock' 2>/dev/null | head -1; }
tctl() { timeout 600 tuttictl --socket "$SOCK" "$@"; }
bench_retrieve() { tctl bench --blocks "$BLOCKS" --seed "$SEED" --phase retrieve --verify; }
has_command() { tuttictl help 2>&1 | grep -qE "^  $1 "; }
# GET http://127.0.0.1:$METRICS_PORT/metrics with bash's /dev/tcp (no curl in the guest).
scrape() {
  exec 3<>"/dev/tcp/127.0.0.1/$METRICS_PORT" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  timeout 30 cat <&3
  exec 3<&-
}
METRICS_PORT=9464
# A non-zero critical warning in tuttictl devices' text ("critical warning  0x04: ...") or JSON.
WARNING_SHOWN='critical.?warnings?"?[: ]+(0x0*[1-9a-f]|[1-9])'

say "guest up after $(cut -d' ' -f1 /proc/uptime) s of guest time; kernel $(uname -r)"
say "every timing in this guest is under software emulation (TCG): it means nothing"

# --- 1. Install ----------------------------------------------------------------------------------
check "install: dpkg -i tutti $V1 (no network: the guest image holds its Depends)" \
  "dpkg -i failed" dpkg -i "$DEB1" || { say "RESULT FAIL (the package did not install)"; exit 1; }
check "install: postinst created the tutti user and group" "no tutti user" \
  sh -c 'getent passwd tutti && getent group tutti'
check "install: postinst created /var/lib/tutti (tmpfiles)" "missing or wrong owner" \
  sh -c 'stat -c "%U:%G %a %n" /var/lib/tutti && [ "$(stat -c %U /var/lib/tutti)" = tutti ]'
check "install: the Python package tutti in /usr/lib/python3/dist-packages (with its .dist-info)" \
  "missing" sh -c 'ls -d /usr/lib/python3/dist-packages/tutti/v1/kvcache_pb2.py \
    /usr/lib/python3/dist-packages/tutti/vllm/__init__.py /usr/lib/python3/dist-packages/tutti-*.dist-info'
units="$(cd /usr/lib/systemd/system && ls tuttid*.service)"
surprise=""
for u in $units; do
  case "$u" in *@.service) u="${u%@.service}@0.service" ;; esac
  state="$(systemctl is-enabled "$u" 2>/dev/null)"
  echo "$u: is-enabled=$state is-active=$(systemctl is-active "$u")" | show
  case "$state" in enabled|enabled-runtime|linked) surprise="$surprise $u" ;; esac
  [ "$(systemctl is-active "$u")" = active ] && surprise="$surprise $u(active)"
done
pgrep -x tuttid >/dev/null && surprise="$surprise tuttid-process"
if [ -z "$surprise" ]; then pass "install: nothing enabled or started by the package ($(echo $units))"
else fail "install: nothing enabled or started" "found:$surprise"; fi

# --- 2. The pool on the emulated NVMe namespace --------------------------------------------------
check "nvme: the emulated controller and namespace are visible" "no /dev/nvme0n1" \
  sh -c 'nvme list && test -b /dev/nvme0n1'
# io_uring passthrough on the raw namespace, before it gets its filesystem (passthrough_check.sh).
[ -f /payload/passthrough_check.sh ] && . /payload/passthrough_check.sh
mkdir -p /mnt/nvme0
check "nvme: mkfs.ext4 /dev/nvme0n1 and mount it on /mnt/nvme0" "mkfs or mount failed" \
  sh -c "mkfs.ext4 -q -F /dev/nvme0n1 && mount /dev/nvme0n1 /mnt/nvme0 && install -d -o tutti -g tutti -m 0750 $POOL"

# --- 3. Configure and start the instance --------------------------------------------------------
if [ -f /usr/lib/systemd/system/tuttid@.service ]; then UNIT=tuttid@0.service; else
  UNIT=tuttid.service
  say "note: no tuttid@.service in the package (helper systemd adds it): testing tuttid.service"
fi
# The instance's config file: the --config= of its ExecStart, or the packaged conffile.
CONFIG="$(systemctl show -p ExecStart --value "$UNIT" | grep -o -- '--config=[^ ;]*' | head -1 |
          cut -d= -f2)"
case "$CONFIG" in ''|*'$'*|*%*) CONFIG=/etc/tutti/tuttid.textproto ;; esac
say "unit $UNIT, config $CONFIG, pool $POOL"
# The whole file (a field given twice would stop start-up): the pool on the NVMe namespace.
cat >"$CONFIG" <<EOF
# vm-test: tuttid's config in the guest
pool { dirs: "$POOL" capacity_bytes: 268435456 }  # 256 MiB
dram { capacity_bytes: 33554432 }
EOF
cat >>/etc/tutti/tuttid.textproto <<'EOF'
# vm-test: an operator's change to the conffile (must survive the upgrade)
EOF
mkdir -p "/etc/systemd/system/$UNIT.d"
cat >"/etc/systemd/system/$UNIT.d/vm-test.conf" <<EOF
[Unit]
RequiresMountsFor=/mnt/nvme0
[Service]
ReadWritePaths=$POOL
TimeoutStartSec=600
EOF
if [ "$FAULT" = norestart ]; then
  say "fault injected on purpose: Restart=no (the kill -9 check must fail)"
  echo "Restart=no" >>"/etc/systemd/system/$UNIT.d/vm-test.conf"
fi
systemctl daemon-reload
check "start: systemctl start $UNIT returns (Type=notify: READY=1 sent)" "start failed" \
  systemctl start "$UNIT"
journalctl -u "$UNIT" --no-pager -n 15 | show
if [ "$(systemctl is-active "$UNIT")" = active ]; then pass "start: $UNIT is active"
else fail "start: $UNIT is active" "is $(systemctl is-active "$UNIT")"; fi
systemctl status "$UNIT" --no-pager -n 0 2>&1 | show
status_text="$(systemctl show -p StatusText --value "$UNIT")"
if [ -n "$status_text" ]; then pass "start: systemctl status shows STATUS= ($status_text)"
elif grep -aq 'STATUS=' /usr/bin/tuttid || ldd /usr/bin/tuttid | grep -q libsystemd; then fail "start: STATUS= shown" "tuttid sends STATUS= but the unit has none"
else skip "start: STATUS= shown" "tuttid sends no STATUS= yet (helper systemd adds it)"; fi
SOCK="$(find_socket)"
say "engine socket: ${SOCK:-none}"
[ -n "$SOCK" ] || { fail "start: engine socket" "no socket under /run/tutti"; SOCK=/run/tutti/tuttid.sock; }
tctl status 2>&1 | show
# The metrics address from the effective config tuttid logs at start (metrics { listen: "..." }).
addr="$(journalctl -u "$UNIT" --no-pager | grep -A1 'metrics {' | grep -o 'listen: "[^"]*"' |
        tail -1 | cut -d'"' -f2)"
case "$addr" in 127.0.0.1:[0-9]*) METRICS_PORT="${addr##*:}" ;; esac
say "metrics address from the logged config: '${addr:-none}' (scraping port $METRICS_PORT)"

# --- 4. Data path --------------------------------------------------------------------------------
check "bench: tuttictl bench --blocks $BLOCKS --verify (store, then retrieve and compare every byte)" \
  "mismatch, miss or error" tctl bench --blocks "$BLOCKS" --seed "$SEED" --verify
check "bench: the pool files are on the NVMe namespace" "no pool files in $POOL" \
  sh -c "df -h $POOL && ls -la $POOL && [ -n \"\$(ls -A $POOL)\" ]"

# --- 5. Devices ----------------------------------------------------------------------------------
echo "reference, nvme-cli (not tuttid): nvme smart-log /dev/nvme0" | show
nvme smart-log /dev/nvme0 2>&1 | show
DEVICES_BEFORE=""
if has_command devices; then
  DEVICES_BEFORE="$(tctl devices 2>&1)"; rc=$?
  echo "$DEVICES_BEFORE" | show
  if [ "$rc" -eq 0 ] && echo "$DEVICES_BEFORE" | grep -qiE 'deadbeef|QEMU'; then
    pass "devices: tuttictl devices shows the controller (QEMU NVMe, serial deadbeef)"
  else fail "devices: tuttictl devices shows the controller" "exit $rc, no QEMU/deadbeef in it"; fi
  if echo "$DEVICES_BEFORE" | grep -qiE "$WARNING_SHOWN"; then
    fail "devices: no critical warning before the injection" "devices shows one already"
  fi
else
  say "tuttictl devices: not available"
  skip "devices: tuttictl devices" "tuttictl has no devices command (helper ops adds it)"
fi

# --- 6. Metrics ----------------------------------------------------------------------------------
HAVE_METRICS=0
if page="$(scrape 2>/dev/null)" && [ -n "$page" ]; then
  HAVE_METRICS=1
  echo "$page" | grep -E '^(HTTP|# HELP tutti_)' | head -12 | show
  echo "    | ... $(echo "$page" | grep -c '^tutti_') tutti_ samples" 
  if echo "$page" | head -1 | grep -q ' 200' && echo "$page" | grep -q '^# HELP tutti_' &&
     echo "$page" | grep -q '^# TYPE tutti_'; then
    pass "metrics: 127.0.0.1:$METRICS_PORT/metrics answers 200 with tutti_* HELP and TYPE"
  else fail "metrics: scrape" "no 200 or no '# HELP tutti_' lines"; fi
else
  skip "metrics: scrape 127.0.0.1:$METRICS_PORT" "nothing listens there (helper metrics adds the endpoint)"
fi

# --- 7. kill -9: systemd restarts tuttid, the blocks are still there -----------------------------
old="$(main_pid)"
kill -9 "$old"
if new="$(wait_restarted 120 "$old")"; then
  pass "kill -9: systemd restarted tuttid (pid $old -> $new, NRestarts=$(systemctl show -p NRestarts --value "$UNIT"))"
  SOCK="$(find_socket)"
  check "kill -9: the blocks stored before are found after (bench --phase retrieve --verify)" \
    "mismatch or miss after the restart" bench_retrieve
else
  fail "kill -9: systemd restarted tuttid" "not active again within 120 s"
  journalctl -u "$UNIT" --no-pager -n 20 | show
fi

# --- 8. SIGSTOP: the watchdog fires ------------------------------------------------------------
wd="$(systemctl show -p WatchdogUSec --value "$UNIT")"
if [ -z "$wd" ] || [ "$wd" = 0 ] || [ "$wd" = infinity ]; then
  skip "watchdog: SIGSTOP" "the unit has no WatchdogSec (helper systemd adds it)"
else
  old="$(main_pid)"; since="$(date '+%Y-%m-%d %H:%M:%S')"
  kill -STOP "$old"
  if new="$(wait_restarted 300 "$old")"; then
    journalctl -u "$UNIT" --since "$since" --no-pager | grep -i watchdog | show
    if journalctl -u "$UNIT" --since "$since" --no-pager | grep -qi 'watchdog timeout'; then
      pass "watchdog: a SIGSTOPped tuttid (WatchdogSec $wd) was killed by the watchdog and restarted (pid $old -> $new)"
    else fail "watchdog" "restarted, but the journal has no 'Watchdog timeout'"; fi
    SOCK="$(find_socket)"
    check "watchdog: the blocks are still there after it (bench --phase retrieve --verify)" \
      "mismatch or miss" bench_retrieve
  else
    fail "watchdog: SIGSTOP" "no restart within 300 s (WatchdogSec $wd)"
    kill -CONT "$old" 2>/dev/null
  fi
fi

# --- 9. A SMART critical warning injected from the host -----------------------------------------
inject_epoch="$(date +%s)"
say "asking the host to set smart_critical_warning through QMP"
echo "VMTEST-HOST: inject-smart-warning"
seen=0
for _ in $(seq 1 120); do
  cw="$(nvme smart-log /dev/nvme0 -o json 2>/dev/null | grep -o '"critical_warning" *: *[0-9]*' | grep -o '[0-9]*$')"
  if [ -n "$cw" ] && [ "$cw" != 0 ]; then seen=1; break; fi
  sleep 1
done
if [ "$seen" = 1 ]; then
  pass "smart: the warning set through QMP reaches the guest (nvme smart-log critical_warning $cw)"
else fail "smart: the warning set through QMP reaches the guest" "critical_warning still 0 after 120 s"; fi
if has_command devices; then
  after="$(tctl devices 2>&1)"
  echo "$after" | show
  if echo "$after" | grep -qiE "$WARNING_SHOWN"; then
    pass "smart: tuttictl devices shows the critical warning"
  else fail "smart: tuttictl devices shows the critical warning" "no non-zero critical warning in its output"; fi
else
  skip "smart: tuttictl devices shows the warning" "tuttictl has no devices command (helper ops adds it)"
fi
# tuttid cannot read SMART logs unprivileged: the packaged tutti-health@N.service (root) reports
# them; run it now rather than waiting for its timer.
if [ -f /usr/lib/systemd/system/tutti-health@.service ]; then
  inst="${UNIT#tuttid@}"; inst="${inst%.service}"
  if systemctl start "tutti-health@$inst.service"; then
    pass "smart: tutti-health@$inst.service reported the devices' health to tuttid"
  else fail "smart: tutti-health@$inst.service reported the devices' health to tuttid" \
    "$(systemctl status "tutti-health@$inst.service" --no-pager 2>&1 | tail -5)"; fi
fi
if grep -aqi 'critical warning' /usr/bin/tuttid; then
  sleep 15  # tuttid's health poll gets its chance
  logged="$(journalctl -u "$UNIT" --since "@$inject_epoch" --no-pager | grep -iE 'critical|smart')"
  echo "$logged" | show
  if [ -n "$logged" ]; then pass "smart: tuttid's log names the critical warning"
  else fail "smart: tuttid's log names the critical warning" "nothing about it in the journal"; fi
else
  skip "smart: tuttid's log names the warning" "tuttid has no NVMe health watch (no 'critical warning' text in it)"
fi
if [ "$HAVE_METRICS" = 1 ]; then
  page="$(scrape 2>/dev/null)"
  m="$(echo "$page" | grep -E '^tutti_[a-z_]*(critical|warning)[a-z_]*(\{[^}]*\})? ')"
  echo "$m" | show
  if echo "$m" | grep -qE ' [1-9][0-9.e+]*$'; then pass "smart: the metrics show the critical warning"
  elif ! echo "$page" | grep -qiE '^# HELP tutti_[a-z_]*(nvme|smart|critical)'; then
    skip "smart: the metrics show the warning" "no NVMe health family (tutti_*nvme*/smart*/critical*) in the page"
  else fail "smart: the metrics show the critical warning" "no non-zero tutti_*critical*/*warning* sample"; fi
else
  skip "smart: the metrics show the warning" "no metrics endpoint"
fi

# --- 10. Upgrade: the pool and index survive ---------------------------------------------------
old="$(main_pid)"
check "upgrade: dpkg -i tutti $V2 over $V1 (the instance running)" "dpkg -i failed" dpkg -i "$DEB2"
check "upgrade: the installed version is $V2" "version differs" \
  sh -c "dpkg-query -W -f='\${Version}\n' tutti | tee /dev/stderr | grep -qx '$V2'"
check "upgrade: the operator's conffile change is kept" "the change is gone" \
  grep -q 'vm-test: an operator' /etc/tutti/tuttid.textproto
if new="$(wait_restarted 120 "$old")"; then
  pass "upgrade: the running instance was restarted on the new binary (pid $old -> $new)"
else fail "upgrade: the running instance restarted" "pid unchanged or not active (is $(systemctl is-active "$UNIT"))"; fi
# (Started again if the restart failed, so the pool's survival is checked on its own.)
[ "$(systemctl is-active "$UNIT")" = active ] || systemctl start "$UNIT"
SOCK="$(find_socket)"
check "upgrade: the blocks stored before the upgrade are found after (bench --phase retrieve --verify)" \
  "mismatch or miss after the upgrade" bench_retrieve

# --- 11. Purge -----------------------------------------------------------------------------------
check "purge: dpkg --purge tutti" "dpkg --purge failed" dpkg --purge tutti
check "purge: no tuttid left running" "a tuttid process remains" sh -c '! pgrep -a -x tuttid'
check "purge: binaries, units, Python package, /etc/tutti, /etc/default/tuttid, /var/lib/tutti gone" \
  "something remains" sh -c '
    left=""
    for p in /usr/bin/tuttid /usr/bin/tuttictl /usr/lib/systemd/system/tuttid.service \
             /etc/tutti /etc/default/tuttid /var/lib/tutti /usr/lib/python3/dist-packages/tutti; do
      [ -e "$p" ] && left="$left $p"
    done
    [ -z "$left" ] || { echo "left:$left"; exit 1; }'
say "note: after purge the pool directory $POOL (outside /var/lib/tutti) and the tutti user stay, by design"

# --- 12. User-space NVMe: the controller on vfio-pci (guest_nvme.sh; issue 13) -------------------
if [ -f /payload/guest_nvme.sh ]; then . /payload/guest_nvme.sh
else skip "vfio: the user-space NVMe phase" "no guest_nvme.sh in the payload"; fi

say "guest checks took $(elapsed) (emulated: means nothing)"
if [ "$failed" -eq 0 ]; then
  say "RESULT PASS ($passed passed, $failed failed, $skipped skipped)"; exit 0
fi
say "RESULT FAIL ($passed passed, $failed failed, $skipped skipped)"; exit 1
