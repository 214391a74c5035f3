#!/usr/bin/env bash
# harness-job: minutes=0.1
# Issue scenario 2: `berth.freeze` on PID 1's command line (which systemd
# treats as the kernel command line in a container) skips the autostart
# unit through its condition; nothing else of berth changes.
source "$(dirname "$0")/../lib.sh"
scenario_begin 02-freeze

ct_boot freeze "$REPO/tests/harness/config/pair" berth.freeze

check_eq "autostart skipped by its condition" "no" "$(ct_prop berth-autostart.service ConditionResult)"
check_eq "autostart never ran" "inactive" "$(ct_prop berth-autostart.service ActiveState)"
check_eq "autostart has no start timestamp" "" "$(ct_prop berth-autostart.service ExecMainStartTimestamp)"
check_contains "systemctl status names the condition" "ConditionKernelCommandLine=!berth.freeze" \
    "$(ct systemctl status berth-autostart.service --no-pager 2>&1 || true)"
check_lacks "berth autostart did not run" "adopted " "$(ct journalctl -b -u berth-autostart.service --no-pager)"
# Run by hand, berth autostart reads the flag the way systemd does (PID 1's
# command line in a container) and says why it starts nothing.
ct /usr/bin/berth autostart >/dev/null 2>&1 || true
check_contains "berth autostart by hand names the reason" "starting no workload: berth.freeze is on the kernel command line" \
    "$(ct journalctl -b -t berth --no-pager)"
check_eq "the drain is armed all the same" "active" "$(ct_prop berth-drain.service ActiveState)"
check_eq "no workload started" "" "$(ct systemctl list-units 'berth@*' --state=active --plain --no-legend)"
# An explicit start still works: a freeze is not a unit condition.
check "explicit systemctl start still works" ct systemctl start berth@a.service
check_eq "berth@a running" "active" "$(ct_prop berth@a.service ActiveState)"
ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
