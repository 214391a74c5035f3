#!/usr/bin/env bash
# harness-job: minutes=0.1
# Issue scenario 5: a broken host file, then a running workload whose file
# is deleted (daemon-reload in between). The drain keeps its ExecStop and
# ordering; settings in error take their defaults while valid ones apply;
# the workload stays loaded and running in berth.slice.
source "$(dirname "$0")/../lib.sh"
scenario_begin 03-broken

ct_boot broken "$REPO/tests/harness/config/broken-host"

check_contains "PID 1 reports the generator's failure" "berth-generator failed with exit status 1" \
    "$(cat "$CT_DIR/console.log")"
gen_out=$(ct /lib/systemd/system-generators/berth-generator --dry-run 2>&1 >/dev/null || true)
check_contains "the generator names file, key and reason" \
    "/etc/berth/berth.toml: drain_parallelism: must be from 1 to 4096, not 0" "$gen_out"
check_contains "the generator says which settings take defaults" "uses its built-in default" "$gen_out"
check_eq "a valid host setting in the broken file still applies (stop delay 20 + 30 s)" "50s" \
    "$(ct_prop berth@a.service TimeoutStopUSec)"

drain_checks() {
    local when=$1
    check_contains "$when: drain keeps its ExecStop" "argv[]=/usr/bin/berth drain" "$(ct_prop berth-drain.service ExecStop)"
    local after
    after=$(ct_prop berth-drain.service After)
    for u in network.target remote-fs.target local-fs.target basic.target sysinit.target; do
        check_contains "$when: drain ordered after $u" "$u" "$after"
    done
    check_contains "$when: drain conflicts with shutdown.target" "shutdown.target" "$(ct_prop berth-drain.service Conflicts)"
    check_contains "$when: drain ordered before shutdown.target" "shutdown.target" "$(ct_prop berth-drain.service Before)"
    check_eq "$when: drain deadline is the built-in 180 + 30 s" "3min 30s" "$(ct_prop berth-drain.service TimeoutStopUSec)"
    check_eq "$when: drain armed" "active" "$(ct_prop berth-drain.service ActiveState)"
}
drain_checks "broken host file"
check_eq "daemon unit keeps its packaged watchdog" "30s" "$(ct_prop berth-daemon.service WatchdogUSec)"
check_eq "daemon still wanted (default [daemon] enabled)" "active" "$(ct_prop berth-daemon.service ActiveState)"

check "start berth@a" ct systemctl start berth@a.service
check "start berth@b" ct systemctl start berth@b.service
pid=$(ct_prop berth@a.service MainPID)
inv=$(ct_prop berth@a.service InvocationID)

rm "$CT_DIR/etc-berth/workloads/a.toml"
ct systemctl daemon-reload

check_eq "deleted workload still loaded" "loaded" "$(ct_prop berth@a.service LoadState)"
check_eq "deleted workload still running" "active/running" "$(ct_prop berth@a.service ActiveState)/$(ct_prop berth@a.service SubState)"
check_eq "same main process" "$pid" "$(ct_prop berth@a.service MainPID)"
check_eq "same invocation" "$inv" "$(ct_prop berth@a.service InvocationID)"
check "its process is alive" ct test -d "/proc/$pid"
check_eq "still in berth.slice" "berth.slice" "$(ct_prop berth@a.service Slice)"
check_eq "cgroup under berth.slice" "/berth.slice/berth@a.service" "$(ct_prop berth@a.service ControlGroup)"
check_lacks "its generated drop-in is gone" "10-berth.conf" "$(ct_prop berth@a.service DropInPaths)"
check_eq "still only Requires=berth.slice" "berth.slice" "$(ct_prop berth@a.service Requires)"
check_eq "still no shutdown conflict" "" "$(ct_prop berth@a.service Conflicts)"
drain_checks "after the workload file is deleted"
check_eq "the other workload is untouched" "active" "$(ct_prop berth@b.service ActiveState)"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
drain_log=$(ct_journal -u berth-drain.service)
check_contains "the drain's ExecStop ran at power-off" "drain done in" "$drain_log"
# Issue 3, test 6: the workload whose file was deleted is drained too.
check_contains "the deleted workload was drained" "drain: berth@a.service GracefulOff" "$drain_log"
