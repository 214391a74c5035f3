#!/usr/bin/env bash
# harness-job: minutes=0.2
# Issue 11, part 1: an existing unit as a workload (`unit =`). A plain
# service berth did not write (legacy-db.service, from tests/harness/units)
# is started by the autostart in its order, followed by the daemon, left
# alone by a daemon restart, judged by `check --live`, and drained
# gracefully at power-off with its process tree inside its own cgroup. A
# running service added later (`berth add --unit`) gets a note that its
# slice applies at its next start; one that a PartOf= chain ties to the
# shutdown is a problem naming its file. A frozen boot starts nothing.
source "$(dirname "$0")/../lib.sh"
scenario_begin 20-existing-units

field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'r': r}))" "$CT_DIR/state/records/$1.json" "$2" 2>/dev/null; }
run() { out=$(ct "$@" 2>&1) && rc=0 || rc=$?; }

ct_boot existing "$REPO/tests/harness/config/existing"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true

check_eq "the autostart started the existing unit" active "$(ct_prop legacy-db.service ActiveState)"
check_eq "... and the workload after it" active "$(ct_prop berth@app.service ActiveState)"
check_eq "... and one with an escaped name" active "$(ct_prop 'legacy\x2descaped.service' ActiveState)"
db_start=$(ct_prop legacy-db.service ExecMainStartTimestampMonotonic)
app_start=$(ct_prop berth@app.service ExecMainStartTimestampMonotonic)
check "... in order: legacy-db ($db_start) before app ($app_start)" test "$db_start" -lt "$app_start"
check_eq "the drop-in put it in berth.slice" berth.slice "$(ct_prop legacy-db.service Slice)"
check_eq "... where it runs" /berth.slice/legacy-db.service "$(ct_prop legacy-db.service ControlGroup)"
check_lacks "no default Conflicts=shutdown.target" shutdown.target "$(ct_prop legacy-db.service Conflicts)"
check_contains "ordered after the drain" berth-drain.service "$(ct_prop legacy-db.service After)"
check_eq "isolate leaves it alone" yes "$(ct_prop legacy-db.service IgnoreOnIsolate)"
check_eq "its stop timeout is berth's: stop_delay_s 20 + 30" 50s "$(ct_prop legacy-db.service TimeoutStopUSec)"
# The process tree: its main process and each child, by /proc (the
# container's cgroup layout depends on the host's). The workload's sleep
# is a new process every second: a child that ends between the listing
# and the read is skipped, and the tree is read again until it has both
# (seen in CI: "cat: /proc/41/cgroup: No such file or directory").
tree_cgroups() {
    local pid=$1 child
    ct cat "/proc/$pid/cgroup" 2>/dev/null | sed -n 's/^0:://p' || true
    for child in $(ct cat "/proc/$pid/task/$pid/children" 2>/dev/null || true); do tree_cgroups "$child"; done
}
for _ in 1 2 3 4 5; do
    cgroups=$(tree_cgroups "$(ct_prop legacy-db.service MainPID)")
    [ "$(printf '%s\n' "$cgroups" | grep -c .)" -lt 2 ] || break
    sleep 0.3
done
check "its process tree (the shell and its sleep) is in its cgroup: $(echo $cgroups)" \
    test "$(printf '%s\n' "$cgroups" | sort -u)" = /berth.slice/legacy-db.service -a "$(printf '%s\n' "$cgroups" | wc -l)" -ge 2

run berth check --live
check_eq "check --live: exit 0" 0 "$rc"
check_contains "... 3 workload units keep the invariants" "live: the drain, berth.slice and 3 workload unit(s) keep the lifecycle invariants" "$out"
run berth inspect db --json
check_contains "inspect names the existing unit" '"unit": "legacy-db.service"' "$out"
check_contains "... running" '"active_state": "active"' "$out"
check "the daemon keeps its record: running" test "$(field db "r['state']")" = running
check_contains "the daemon's API names the unit" '"unit":"legacy-db.service"' \
    "$(curl -s --unix-socket "/proc/$CT_PID/root/run/berthd/api.sock" http://berth/v1/workloads/db)"

# Stopped and started by hand: the daemon notices, as for any workload.
ct systemctl stop legacy-db.service
check "systemctl stop is recorded as stop-user" wait_for 5 sh -c "grep -q '\"stop-user\"' '$CT_DIR/state/records/db.json'"
ct systemctl start legacy-db.service
check "systemctl start is recorded as start-user" wait_for 5 sh -c "grep -q '\"start-user\"' '$CT_DIR/state/records/db.json'"

# A daemon restart touches no workload.
pid=$(ct_prop legacy-db.service MainPID)
inv=$(ct_prop legacy-db.service InvocationID)
ct systemctl restart berth-daemon.service
ct systemctl is-active --wait berth-daemon.service >/dev/null 2>&1 || true
check_eq "a daemon restart left it running: same MainPID" "$pid" "$(ct_prop legacy-db.service MainPID)"
check_eq "... same invocation" "$inv" "$(ct_prop legacy-db.service InvocationID)"

# Enabled on its own, systemd would start it at boot outside berth's order.
ct systemctl enable legacy-db.service >/dev/null 2>&1
run berth check --live
check_eq "enabled by the admin: check --live exits 1" 1 "$rc"
check_contains "... naming its file and who wants it" \
    "legacy-db.service (/etc/systemd/system/legacy-db.service) is wanted or triggered by multi-user.target" "$out"
ct systemctl disable legacy-db.service >/dev/null 2>&1

# Running before berth knew it: the slice moves at its next start.
ct systemctl start legacy-late.service
run berth add late --unit legacy-late.service --stop-delay 5
check_eq "berth add --unit: exit 0" 0 "$rc"
check_eq "the drop-in is loaded: Slice=berth.slice" berth.slice "$(ct_prop legacy-late.service Slice)"
check_eq "... but it still runs in system.slice" /system.slice/legacy-late.service "$(ct_prop legacy-late.service ControlGroup)"
run berth check --live
check_eq "a unit not yet moved is no problem: exit 0" 0 "$rc"
check_contains "... but a note" \
    "live: note: legacy-late.service still runs in /system.slice/legacy-late.service: Slice=berth.slice applies from its next start" "$out"
ct systemctl restart legacy-late.service
check_eq "restarted, it runs in berth.slice" /berth.slice/legacy-late.service "$(ct_prop legacy-late.service ControlGroup)"
run berth remove late
check_eq "remove of a running existing unit: exit 0 (it goes back to its own rules)" 0 "$rc"
check_eq "... still running" active "$(ct_prop legacy-late.service ActiveState)"
check_contains "... with its default dependencies again" shutdown.target "$(ct_prop legacy-late.service Conflicts)"
ct systemctl stop legacy-late.service

# Refused before anything is written: a unit the network needs (an
# ordering cycle with the drain), an alias (systemd lists no alias).
run berth add net --unit legacy-net.service
check_eq "a unit ordered before network.target is refused" 1 "$rc"
check_contains "... naming the cycle" \
    "legacy-net.service has Before=network.target, and berth-drain.service is After=network.target" "$out"
ct ln -s /etc/systemd/system/legacy-db.service /etc/systemd/system/legacy-alias.service
ct systemctl daemon-reload
run berth add al --unit legacy-alias.service
check_eq "an alias is refused" 1 "$rc"
check_contains "... naming the unit it stands for" "legacy-alias.service is an alias of legacy-db.service" "$out"
check "... leaving nothing behind" test ! -e "$CT_DIR/etc-berth/workloads/net.toml" -a ! -e "$CT_DIR/etc-berth/workloads/al.toml"

# A file written by hand and `systemctl daemon-reload`, no SIGHUP: the
# daemon follows the new existing unit from the end of the reload.
printf 'unit = "legacy-late.service"\n' >"$CT_DIR/etc-berth/workloads/late2.toml"
ct systemctl daemon-reload
check "the daemon read the definitions at the end of the reload" \
    wait_for 5 sh -c "journalctl --directory='$(find "$CT_DIR/journal" -mindepth 1 -maxdepth 1 -type d | head -n1)' -u berth-daemon.service -o cat | grep -q 'reloaded the workload definitions'"
ct systemctl start legacy-late.service
check "its start is recorded as start-user" wait_for 5 sh -c "grep -q '\"start-user\"' '$CT_DIR/state/records/late2.json'"
ct systemctl stop legacy-late.service
rm "$CT_DIR/etc-berth/workloads/late2.toml"
ct systemctl daemon-reload

# A stop that reaches the unit through PartOf= cannot be removed by a drop-in.
run berth add part --unit legacy-part.service
check_eq "berth add --unit legacy-part: exit 0" 0 "$rc"
run berth check --live
check_eq "a PartOf= chain to the shutdown: exit 1" 1 "$rc"
check_contains "... the chain, naming the files" \
    "legacy-part.service is stopped by the shutdown transaction itself (legacy-part.service (/etc/systemd/system/legacy-part.service) has PartOf=legacy-group.service, and legacy-group.service (/etc/systemd/system/legacy-group.service) has Conflicts=shutdown.target)" "$out"
run berth remove part
check_eq "removed again" 0 "$rc"
run berth add dup --unit legacy-db.service
check_eq "a second workload for one unit is refused" 1 "$rc"
check_contains "... naming file, key and reason" "dup.toml: unit: legacy-db.service is already the unit of workload db" "$out"
check "... leaving nothing behind" test ! -e "$CT_DIR/etc-berth/workloads/dup.toml"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
check "the drain stopped it gracefully, after app (last-drain.json, its log)" python3 - "$CT_DIR" <<'PY'
import json, sys
d = sys.argv[1]
report = json.load(open(f"{d}/state/last-drain.json"))
got = {w["workload"]: w["outcome"] for w in report["workloads"]}
# esc was listed as running although its name holds a backslash.
assert got == {"db": "GracefulOff", "app": "GracefulOff", "esc": "GracefulOff"}, got
w = {x["workload"]: x for x in report["workloads"]}
assert w["db"]["started_ms"] >= w["app"]["started_ms"] + w["app"]["elapsed_ms"], \
    f"db (order 0) stop began before app (order 10) was down: {w}"
# Its own log, since its last start: the stop ran its graceful end.
# KillMode=control-group (a plain unit's default) signals every process of
# the unit, a `date` just forked by the trap included, so a line may have
# lost its time: the event names are what counts.
lines = open(f"{d}/out/legacy-db.log").read().split("\n")
last = max(i for i, l in enumerate(lines) if l.startswith("start"))
seen = [l.split()[0] for l in lines[last:] if l.strip()]
assert seen == ["start", "stop-begin", "stop-end"], f"legacy-db since its last start: {seen}"
PY
check_contains "the drain names the unit" "drain: legacy-db.service GracefulOff" "$(ct_journal -u berth-drain.service)"

# A frozen boot starts nothing, existing units included.
CT_KEEP_STATE=1 ct_boot existing "" berth.freeze
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
check_eq "berth.freeze: the existing unit stays down" inactive "$(ct_prop legacy-db.service ActiveState)"
ct_poweroff 120
