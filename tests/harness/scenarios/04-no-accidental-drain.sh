#!/usr/bin/env bash
# harness-job: minutes=0.2
# Issue scenario 6: `systemctl stop|restart berth-drain`, `systemctl
# stop|restart berth.slice`, `systemctl restart berth.target`, `isolate
# rescue.target` and `isolate emergency.target` stop no workload and never
# run the drain's ExecStop.
source "$(dirname "$0")/../lib.sh"
scenario_begin 04-no-accidental-drain

ct_boot accidents "$REPO/tests/harness/config/pair"
check "start berth@a" ct systemctl start berth@a.service
check "start berth@b" ct systemctl start berth@b.service

snapshot() {
    local u
    for u in berth@a.service berth@b.service berth-drain.service; do
        printf '%s %s %s %s\n' "$u" "$(ct_prop "$u" ActiveState)" "$(ct_prop "$u" InvocationID)" "$(ct_prop "$u" MainPID)"
    done
}
before=$(snapshot)

settle() {
    # Wait until the manager has no jobs left (isolate queues many).
    local i
    for i in $(seq 60); do
        [ -z "$(ct systemctl list-jobs --no-legend 2>/dev/null)" ] && return 0
        sleep 0.5
    done
}

after_each() {
    local what=$1
    settle
    check_eq "$what: workloads and drain untouched (state, invocation, pid)" "$before" "$(snapshot)"
    check_lacks "$what: the drain's ExecStop never ran" "drain done in" "$(ct journalctl -b --no-pager)"
    check_eq "$what: systemd stopped no workload" "" "$(ct journalctl -b --no-pager | grep -E 'Stopp(ing|ed) berth@' || true)"
}

out=$(ct systemctl stop berth-drain.service 2>&1) && rc=0 || rc=$?
check_eq "systemctl stop berth-drain is refused (exit 4)" 4 "$rc"
check_contains "… with systemd's reason" "refused" "$out"
after_each "stop berth-drain"

out=$(ct systemctl restart berth-drain.service 2>&1) && rc=0 || rc=$?
check_eq "systemctl restart berth-drain is refused (exit 4)" 4 "$rc"
after_each "restart berth-drain"

autostart_runs() { ct journalctl -b -u berth-autostart.service --no-pager | grep -c 'adopted [0-9]* running workloads (left untouched)' || true; }
check_eq "autostart ran once at boot" 1 "$(autostart_runs)"

for verb in stop restart; do
    out=$(ct systemctl "$verb" berth.slice 2>&1) && rc=0 || rc=$?
    check_eq "systemctl $verb berth.slice is refused (exit 4)" 4 "$rc"
    after_each "$verb berth.slice"
done

check "systemctl restart berth.target" ct systemctl restart berth.target
after_each "restart berth.target"
check_eq "restarting berth.target does not re-run the autostart" 1 "$(autostart_runs)"

ct systemctl isolate --no-block rescue.target
after_each "isolate rescue.target"
check_eq "rescue.target reached" "active" "$(ct_prop rescue.target ActiveState)"

ct systemctl isolate --no-block emergency.target
after_each "isolate emergency.target"
check_eq "emergency.target reached" "active" "$(ct_prop emergency.target ActiveState)"
check_eq "sysinit.target was stopped by the isolate" "inactive" "$(ct_prop sysinit.target ActiveState)"

ct systemctl isolate --no-block multi-user.target
after_each "isolate back to multi-user.target"
check_eq "returning to multi-user.target does not re-run the autostart" 1 "$(autostart_runs)"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
# After the emergency isolate the journal's bind mount is unmounted while
# the drain runs, so read systemd's own console lines instead.
check "a real power-off still stops (runs) the drain" \
    grep -qE 'Stopping .*berth host-shutdown drain' <(sed 's/\x1b\[[0-9;]*m//g' "$CT_DIR/console.log")
