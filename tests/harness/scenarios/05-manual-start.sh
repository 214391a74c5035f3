#!/usr/bin/env bash
# harness-job: minutes=0.1
# A workload started by hand on a host where berth.target never started
# (masked here on PID 1's command line) arms the drain through the
# template's Wants=/After=, so it is still drained at power-off.
source "$(dirname "$0")/../lib.sh"
scenario_begin 05-manual-start

ct_boot manual "$REPO/tests/harness/config/pair" systemd.mask=berth.target

check_eq "berth.target masked" "masked" "$(ct_prop berth.target LoadState)"
check_eq "drain not armed at boot" "inactive" "$(ct_prop berth-drain.service ActiveState)"
check_eq "autostart did not run" "inactive" "$(ct_prop berth-autostart.service ActiveState)"
check "systemctl start berth@a" ct systemctl start berth@a.service
check_eq "starting a workload armed the drain" "active" "$(ct_prop berth-drain.service ActiveState)"
drain_active=$(ct_prop berth-drain.service ActiveEnterTimestampMonotonic)
workload_start=$(ct_prop berth@a.service ExecMainStartTimestampMonotonic)
check "the drain was armed before the workload started ($drain_active <= $workload_start)" \
    test "$drain_active" -le "$workload_start"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
check_contains "the drain's ExecStop ran at power-off" "drain done in" "$(ct_journal -u berth-drain.service)"
