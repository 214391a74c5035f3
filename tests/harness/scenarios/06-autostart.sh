#!/usr/bin/env bash
# harness-job: minutes=0.2
# Issue 3, tests 1 and 2: boot with 6 workloads in 3 order groups, one
# `autostart = false`, one instance-frozen: the right ones start, in group
# order, with the start delay; the adoption line is logged. Then
# `systemctl restart berth-autostart.service` starts and stops nothing.
source "$(dirname "$0")/../lib.sh"
scenario_begin 06-autostart

ct_seed() {
    mkdir -p "$CT_DIR/state/freeze/instance"
    echo '{"scope":"instance","target":"g1c","frozen_at":"2026-11-29T10:00:00Z","reason":"harness"}' \
        >"$CT_DIR/state/freeze/instance/g1c"
}
ct_boot autostart "$REPO/tests/harness/config/autostart"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true

active() { ct_prop "berth@$1.service" ActiveState; }
entered() { ct_prop "berth@$1.service" ActiveEnterTimestampMonotonic; }
for w in g0a g0b g1a g2a; do check_eq "berth@$w started at boot" active "$(active "$w")"; done
check_eq "autostart = false is not started" inactive "$(active g1b)"
check_eq "an instance-frozen workload is not started" inactive "$(active g1c)"
log=$(ct journalctl -b -u berth-autostart.service --no-pager)
check_contains "adoption line logged" "adopted 0 running workloads (left untouched)" "$log"
check_contains "the frozen one is skipped with its reason" "not starting berth@g1c.service: frozen since 2026-11-29T10:00:00Z: harness" "$log"
check_contains "autostart = false is said" "not starting berth@g1b.service: autostart = false" "$log"

a=$(entered g0a) b=$(entered g0b) c=$(entered g1a) d=$(entered g2a)
check "g0b waited g0a's start_delay_s = 2 after g0a started ($a + 2 s <= $b)" test "$((a + 2000000))" -le "$b"
check "group 10 began after group 0 finished ($b <= $c)" test "$b" -le "$c"
check "group 20 began after group 10 finished ($c <= $d)" test "$c" -le "$d"
check "the delay held back only 2 s, not the whole sequence ($d - $a < 4 s)" test "$((d - a))" -lt 4000000
check_contains "the start is recorded" '"last_transition_reason": "boot"' "$(cat "$CT_DIR/state/records/g1a.json")"

# Test 2: a second run starts and stops nothing.
snapshot() {
    local w
    for w in g0a g0b g1a g2a g1b g1c; do
        printf '%s %s %s %s\n' "$w" "$(active "$w")" "$(ct_prop "berth@$w.service" InvocationID)" "$(ct_prop "berth@$w.service" MainPID)"
    done
}
before=$(snapshot)
check "systemctl restart berth-autostart.service" ct systemctl restart berth-autostart.service
check_eq "nothing started or stopped (state, invocation, pid)" "$before" "$(snapshot)"
# journald may file the run's own lines after systemd's "Finished": waited
# for (read whole, then searched: grep -q would close the pipe early).
autostart_said() { grep -Fq -- "$1" <<<"$(ct journalctl -b -u berth-autostart.service --no-pager)"; }
check "the second run adopted the 4 running workloads" \
    wait_for 5 autostart_said "adopted 4 running workloads (left untouched)"
check_eq "each workload was started once" 4 "$(ct journalctl -b -u berth-autostart.service --no-pager | grep -c ' started berth@')"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
