#!/usr/bin/env bash
# harness-job: minutes=0.2
# Issue 4, the rest of the supervisor: the health event after the first
# pass, the heartbeat status file, a definition changed while running shown
# as a pending restart, and the record sweep.
source "$(dirname "$0")/../lib.sh"
scenario_begin 11-daemon-extras

ct_boot daemon-extras "$REPO/tests/harness/config/daemon-extras"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
wait_for() {
    local i
    for i in $(seq $(($1 * 10))); do "${@:2}" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}
# The daemon may have passed before the autostart finished; restart it for a
# settled first pass.
ct systemctl restart berth-daemon.service
check_contains "the first pass logs the health aggregate" "daemon.healthy: 0 failed [], 0 not converged []" \
    "$(ct journalctl -b -u berth-daemon.service --no-pager | tail -n 5)"

status=/proc/$CT_PID/root/run/berthd/status.json
check "the status file is written" test -f "$status"
first=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['heartbeat_at'])" "$status")
sleep 6
second=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['heartbeat_at'])" "$status")
check "the heartbeat advances every pass ($first -> $second)" test "$first" != "$second"
check_contains "... with the health" '"health": "healthy"' "$(cat "$status")"

# A definition changed while it runs applies at the next start.
printf '\n[environment]\nNEW = "1"\n' >>"$CT_DIR/etc-berth/workloads/a.toml"
ct systemctl daemon-reload
check_contains "berth list says a restart is pending" "berth@a.service runs an older definition" "$(ct /usr/bin/berth list)"
check_contains "berth inspect --json too" '"restart_pending": true' "$(ct /usr/bin/berth inspect a --json)"
check_contains "the other one is not pending" '"restart_pending": false' "$(ct /usr/bin/berth inspect b --json)"
ct systemctl restart berth@a.service
check "after the restart nothing is pending" wait_for 5 sh -c \
    "nsenter -t $CT_PID -a /usr/bin/berth inspect a --json | grep -q '\"restart_pending\": false'"

# The sweep removes records of workloads neither configured nor loaded.
echo '{"name":"ghost","state":"stopped","transition_generation":1,"last_transition_reason":"drain","last_transition_at":"x"}' \
    >"$CT_DIR/state/records/ghost.json"
check "the ghost's record is swept (gc_interval_s = 2)" wait_for 8 test ! -e "$CT_DIR/state/records/ghost.json"
check "the configured ones stay" test -e "$CT_DIR/state/records/b.json"
check_contains "the sweep is logged" "swept the record of ghost" "$(ct journalctl -b -u berth-daemon.service --no-pager)"

# Issue 31, items 1 and 2: [daemon] socket names what is not berth's.
# A regular file there: no API, and the file survives the daemon's stops.
ct sh -c 'printf notes >/run/notes.txt'
printf '[daemon]\ngc_interval_s = 2\nsocket = "/run/notes.txt"\n' >"$CT_DIR/etc-berth/berth.toml"
ct systemctl daemon-reload
ct systemctl restart berth-daemon.service
check_contains "a file at the socket path: the daemon runs without the API" "no API: cannot serve on /run/notes.txt" \
    "$(ct journalctl -b -u berth-daemon.service --no-pager | tail -n 20)"
ct systemctl restart berth-daemon.service
ct systemctl stop berth-daemon.service
check_eq "... and its stops leave the file alone" "notes" "$(ct cat /run/notes.txt)"
# Another program's live socket there: left to it, named in the journal.
# (The service it activates holds the socket without ever accepting.)
ct systemd-run --quiet --unit=theirs --socket-property=ListenStream=/run/theirs.sock /bin/sleep infinity
printf '[daemon]\ngc_interval_s = 2\nsocket = "/run/theirs.sock"\n' >"$CT_DIR/etc-berth/berth.toml"
ct systemctl daemon-reload
ct systemctl start berth-daemon.service
check_contains "a live socket of another program at the path is not taken over" \
    "no API: cannot serve on /run/theirs.sock: a live socket of another program answers there" \
    "$(ct journalctl -b -u berth-daemon.service --no-pager | tail -n 20)"
ct systemctl stop berth-daemon.service
check_eq "... and stays theirs" "active" "$(ct systemctl is-active theirs.socket)"
check "... its socket still there" test -S "/proc/$CT_PID/root/run/theirs.sock"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
