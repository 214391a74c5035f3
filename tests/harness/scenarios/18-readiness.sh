#!/usr/bin/env bash
# harness-job: minutes=0.2
# Issue 11, part 3: the next start group waits for real readiness. n0 sends
# READY=1 3 s after it starts (ready = "notify"); p0 creates a file 3 s
# after it starts, which its ready_exec probe waits for; x0 never gets
# ready and fails its start after its TimeoutStartSec. Each next group
# starts only once the one before is ready (or failed).
source "$(dirname "$0")/../lib.sh"
scenario_begin 18-readiness

ct_boot readiness "$REPO/tests/harness/config/readiness"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true

prop() { ct_prop "berth@$1.service" "$2"; }
for w in n0 n1 p0 p1 x1; do check_eq "berth@$w started at boot" active "$(prop "$w" ActiveState)"; done
check_eq "the never-ready workload failed its start" "failed timeout" "$(prop x0 ActiveState) $(prop x0 Result)"
check_eq "ready = notify: Type=notify, NotifyAccess=main" "notify main" "$(prop n0 Type) $(prop n0 NotifyAccess)"
check_eq "no ready key: Type=exec" "exec" "$(prop n1 Type)"
check_contains "ready_exec is the start's ExecStartPost" "/usr/bin/test" "$(prop p0 ExecStartPost)"

began() { prop "$1" ExecMainStartTimestampMonotonic; }
ready() { prop "$1" ActiveEnterTimestampMonotonic; }
n0=$(began n0) n0_ready=$(ready n0) n1=$(began n1)
check "n0 counted as started only at its READY=1, 3 s in ($n0 + 3 s <= $n0_ready)" test "$((n0 + 3000000))" -le "$n0_ready"
check "group 10 started after n0 was ready ($n0_ready <= $n1)" test "$n0_ready" -le "$n1"
p0=$(began p0) p0_ready=$(ready p0) p1=$(began p1)
check "p0 counted as started only once its probe passed, 3 s in ($p0 + 3 s <= $p0_ready)" test "$((p0 + 3000000))" -le "$p0_ready"
check "group 30 started after p0's probe passed ($p0_ready <= $p1)" test "$p0_ready" -le "$p1"
x0=$(began x0) x1=$(began x1)
check "group 50 started after x0's start timed out ($x0 + 4 s <= $x1)" test "$((x0 + 4000000))" -le "$x1"
check_contains "the autostart reports the failed start" "berth@x0.service" \
    "$(ct journalctl -b -u berth-autostart.service --no-pager | grep -i fail)"
out=$(ct systemd-analyze verify --man=no berth@n0.service berth@p0.service berth@x0.service 2>&1) && rc=0 || rc=$?
check_eq "systemd-analyze verify of the generated units is clean" "0:" "$rc:$out"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
