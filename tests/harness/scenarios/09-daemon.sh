#!/usr/bin/env bash
# harness-job: class=tight minutes=0.6
# Issue 4 (first slice), against the real supervisor:
#  1. SIGKILL of a workload's main process is recorded as unexpected-exit,
#     generation +1, with the signal as the cause;
#  2. restarting and kill -9 of the daemon, repeated within its start
#     limits, touch no workload (InvocationID, MainPID, no jobs); an exit
#     while the daemon is down is recorded once, dated at detection;
#  3. a second instance fails fast and touches nothing;
#  4. `systemctl stop` of a workload is stop-user, `systemctl start` start-user;
#  5. the watchdog: with the test hook the loop hangs, systemd kills and
#     restarts the daemon, workloads untouched.
source "$(dirname "$0")/../lib.sh"
scenario_begin 09-daemon

ct_boot daemon "$REPO/tests/harness/config/pair"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
check_eq "daemon running" "active" "$(ct_prop berth-daemon.service ActiveState)"
check_contains "daemon reported ready with a status" "supervising" "$(ct_prop berth-daemon.service StatusText)"

record() { cat "$CT_DIR/state/records/$1.json" 2>/dev/null; }
field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'r': r}))" "$CT_DIR/state/records/$1.json" "$2" 2>/dev/null; }
wait_for() { # wait_for SECONDS COMMAND...
    local i
    for i in $(seq $(($1 * 10))); do "${@:2}" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}

# 1. An unexpected exit, seen as it happens.
gen=$(field a "r['transition_generation']")
pid=$(ct_prop berth@a.service MainPID)
ct sh -c "kill -9 $pid"
check "the SIGKILL is recorded as unexpected-exit within 5 s" \
    wait_for 5 sh -c "grep -q '\"unexpected-exit\"' '$CT_DIR/state/records/a.json'"
check_eq "generation +1" "$((gen + 1))" "$(field a "r['transition_generation']")"
check_eq "the cause is systemd's: result signal, killed by 9" "signal killed 9" \
    "$(field a "' '.join([r['exit_cause']['result'], r['exit_cause']['code'], str(r['exit_cause']['status'])])")"
check_eq "seen by the signal, not a pass" "signal" "$(field a "r['detected_by']")"
journal_x=$(ct journalctl -x --no-pager -o short MESSAGE_ID=9b3474cb1bb844ec83bb712552acdadb BERTH_WORKLOAD=a 2>&1)
check_contains "the journal has it under unexpected-exit's MESSAGE_ID" "berth@a.service: unexpected-exit" "$journal_x"
check_contains "... and journalctl -x explains it from berth's catalog" "Workload a exited unexpectedly" "$journal_x"
check_contains "... with the exit cause as a field" "signal (killed 9)" \
    "$(ct journalctl --no-pager -o verbose MESSAGE_ID=9b3474cb1bb844ec83bb712552acdadb BERTH_WORKLOAD=a 2>&1)"

# 4. Starts and stops by others.
ct systemctl start berth@a.service
check "systemctl start is recorded as start-user" wait_for 5 sh -c "grep -q '\"start-user\"' '$CT_DIR/state/records/a.json'"
ct systemctl stop berth@a.service
check "systemctl stop is recorded as stop-user" wait_for 5 sh -c "grep -q '\"stop-user\"' '$CT_DIR/state/records/a.json'"
ct systemctl start berth@a.service
wait_for 5 sh -c "grep -q '\"start-user\"' '$CT_DIR/state/records/a.json'" || true

# 2. Daemon restarts and crashes touch no workload.
snapshot() {
    local w
    for w in a b; do
        printf '%s %s %s\n' "$w" "$(ct_prop "berth@$w.service" InvocationID)" "$(ct_prop "berth@$w.service" MainPID)"
    done
}
sleep 1.1 # journalctl --since has whole seconds
before=$(snapshot)
since=$(ct date '+%Y-%m-%d %H:%M:%S')
for i in 1 2; do
    ct systemctl restart berth-daemon.service
    sleep 2
    ct systemctl kill -s KILL berth-daemon.service
    sleep 3
done
check_eq "daemon back after restarts and kills" "active" "$(ct_prop berth-daemon.service ActiveState)"
# (a manual restart resets NRestarts; the last kill -9 counts)
check "systemd restarted the daemon after kill -9" test "$(ct_prop berth-daemon.service NRestarts)" -ge 1
check_eq "workloads untouched (invocation, pid)" "$before" "$(snapshot)"
check_eq "no start or stop job for a workload meanwhile" "" \
    "$(ct journalctl --since "$since" --no-pager | grep -E '(Starting|Stopping|Started|Stopped) berth@' || true)"

# An exit while the daemon is down: recorded once, dated at detection.
ct systemctl stop berth-daemon.service
gen=$(field b "r['transition_generation']")
ct sh -c "kill -9 $(ct_prop berth@b.service MainPID)"
sleep 1
ct systemctl start berth-daemon.service
check "the exit while down is found by the first pass" \
    wait_for 5 sh -c "grep -q '\"unexpected-exit\"' '$CT_DIR/state/records/b.json'"
check_eq "... marked as found by a scan" "scan" "$(field b "r['detected_by']")"
sleep 6 # more than one reconcile pass (5 s)
check_eq "... and recorded once" "$((gen + 1))" "$(field b "r['transition_generation']")"

# 3. A second instance fails fast.
out=$(ct timeout 5 /usr/bin/berth daemon 2>&1) && rc=0 || rc=$?
check_eq "a second berth daemon exits 1" 1 "$rc"
check_contains "... saying why" "another berth daemon is running" "$out"

# 5. Watchdog: the test hook hangs the loop; systemd kills and restarts it.
ct mkdir -p /run/systemd/system/berth-daemon.service.d
ct sh -c 'printf "[Service]\nEnvironment=BERTH_DAEMON_FAULT=hang\nWatchdogSec=2\n" >/run/systemd/system/berth-daemon.service.d/99-fault.conf'
ct systemctl daemon-reload
before=$(snapshot)
ct systemctl restart berth-daemon.service
# READY is sent, then the loop hangs at its first watchdog tick.
hang_began=$(date +%s%N)
hung=$(ct_prop berth-daemon.service MainPID)
check "systemd's watchdog killed the hung daemon" \
    wait_for 15 sh -c "nsenter -t $CT_PID -a journalctl -u berth-daemon.service --no-pager | grep -q 'Watchdog timeout'"
relaunched() { [ "$(ct_prop berth-daemon.service MainPID)" != "$hung" ] && [ "$(ct_prop berth-daemon.service NRestarts)" -ge 1 ]; }
check "and restarted it" wait_for 10 relaunched
# Issue 10, R6: the bound follows from the configuration (WatchdogSec=2,
# RestartSec=1): killed and running again within WatchdogSec + 5 s.
back_ms=$(( ($(date +%s%N) - hang_began) / 1000000 ))
log "  measured: hung loop -> killed and restarted in ${back_ms} ms (WatchdogSec=2 s)"
check "R6: within WatchdogSec + 5 s of the hang (${back_ms} ms)" test "$back_ms" -le 7000
check_eq "workloads untouched by the watchdog restarts" "$before" "$(snapshot)"
ct rm /run/systemd/system/berth-daemon.service.d/99-fault.conf
ct systemctl daemon-reload
# The hung loop cannot answer SIGTERM either: kill it rather than wait 90 s.
ct systemctl kill -s KILL berth-daemon.service
check "the daemon comes back" wait_for 10 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl is-active berth-daemon.service)\" = active ]"

# 5 (issue test 5). A corrupt record is moved aside and rebuilt.
echo '{garbage' >"$CT_DIR/state/records/a.json"
check "the corrupt record is quarantined within a pass" wait_for 8 test -f "$CT_DIR/state/records/a.json.corrupt"
check_eq "... and rebuilt from the live state" "running" "$(field a "r['state']")"
check_eq "the daemon keeps running" "active" "$(ct_prop berth-daemon.service ActiveState)"

# 6. A change of watchdog_s: SIGHUP, systemd reloaded, exit 75, relaunched
# under the new WatchdogSec, never marked failed.
pid=$(ct_prop berth-daemon.service MainPID)
printf '[daemon]\nwatchdog_s = 7\n' >"$CT_DIR/etc-berth/berth.toml"
ct systemctl kill -s HUP berth-daemon.service
relaunched() {
    local now
    now=$(ct_prop berth-daemon.service MainPID)
    [ "$now" != 0 ] && [ "$now" != "$pid" ] && [ "$(ct_prop berth-daemon.service ActiveState)" = active ]
}
check "relaunched after exit 75" wait_for 10 relaunched
check_eq "under the new WatchdogSec" "7s" "$(ct_prop berth-daemon.service WatchdogUSec)"
check_eq "never marked failed" "active success" "$(ct_prop berth-daemon.service ActiveState) $(ct_prop berth-daemon.service Result)"
check_contains "exit 75 logged as a success" "Deactivated successfully" "$(ct journalctl -u berth-daemon.service --no-pager | tail -n 20)"

# berth list / inspect show the same data.
check_contains "berth list shows the workloads" "unexpected-exit" "$(ct /usr/bin/berth list)"
check_contains "berth inspect --json shows the record" '"exit_cause"' "$(ct /usr/bin/berth inspect b --json)"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
