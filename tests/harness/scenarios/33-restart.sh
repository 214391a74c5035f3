#!/usr/bin/env bash
# harness-job: minutes=0.7
# Restart on failure, on the real systemd of each suite:
#  1. a crashed workload with restart = "on-failure" is started again
#     after its restart_delay_s, recorded as the exit (with its cause)
#     then systemd-restart, the count in `berth inspect`; one without
#     restart stays down;
#  2. one that keeps failing reaches its start limit and is left failed;
#  3. daemon restarts while a workload is restarted again and again by
#     systemd: no stop or start job on any workload, the supervisor never
#     takes systemd's restarts for a user's;
#  4. a crash during a drain by hand: a workload killed while an earlier
#     group stops is restarted by systemd and stopped again in its turn,
#     and nothing starts after its stop;
#  5. at a real shutdown: one waiting for its restart when the drain
#     begins gets a stop, which cancels the restart; one killed during
#     the drain is not restarted at all (systemd refuses the restart's
#     transaction once the shutdown's stop jobs are queued); every outcome
#     recorded, nothing started after its stop.
source "$(dirname "$0")/../lib.sh"
scenario_begin 33-restart

ct_boot restart "$REPO/tests/harness/config/restart"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
for w in crashy waiter trigger flappy; do
    check "berth@$w running after boot" wait_for 10 sh -c \
        "[ \"\$(nsenter -t $CT_PID -a systemctl show -P SubState berth@$w.service)\" = running ]"
done
check_eq "the drop-in sets systemd's own Restart=" "on-failure 1s" \
    "$(ct_prop berth@crashy.service Restart) $(ct_prop berth@crashy.service RestartUSec)"
check_eq "... and the start limit" "1min 3" \
    "$(ct_prop berth@looper.service StartLimitIntervalUSec) $(ct_prop berth@looper.service StartLimitBurst)"
check_eq "a workload without restart keeps the template's Restart=no" no "$(ct_prop berth@plain.service Restart)"
check_contains "berth check says what the start limit means for the drain" "reached its start limit stays failed" \
    "$(ct berth check)"

inspect() { ct berth inspect "$1" --json; }
json() { python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1], {}, {'v': v}))" "$1"; }
transitions() { # transitions NAME: the daemon's transitions of NAME, in order
    ct_journal -o json --output-fields=BERTH_WORKLOAD,BERTH_TRANSITION _SYSTEMD_UNIT=berth-daemon.service |
        python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if r.get('BERTH_WORKLOAD') == sys.argv[1] and 'BERTH_TRANSITION' in r: print(r['BERTH_TRANSITION'])
" "$1"
}

# 1. A crash restarted within its delay.
pid=$(ct_prop berth@crashy.service MainPID)
killed=$(date +%s.%N)
ct systemctl kill --signal=KILL berth@crashy.service
check "crashy is running again, another process" wait_for 10 sh -c \
    "p=\$(nsenter -t $CT_PID -a systemctl show -P MainPID berth@crashy.service); [ \"\$p\" != 0 ] && [ \"\$p\" != $pid ] && [ \"\$(nsenter -t $CT_PID -a systemctl show -P SubState berth@crashy.service)\" = running ]"
# The new instance logs its start a moment after systemd says it runs.
logged_since_kill() { awk -v k="$killed" '$1 == "start" && $2 > k { f = 1 } END { exit !f }' "$CT_DIR/out/crashy.log"; }
check "... and logged its start" wait_for 5 logged_since_kill
back=$(awk '$1 == "start" { t = $2 } END { print t }' "$CT_DIR/out/crashy.log")
check "... started again 1 s after the kill, not sooner, within 4 s ($(awk -v a="$killed" -v b="$back" 'BEGIN { printf "%.2f", b - a }') s)" \
    awk -v a="$killed" -v b="$back" 'BEGIN { exit !(b - a >= 0.9 && b - a < 4) }'
check_eq "systemd counts the restart" 1 "$(ct_prop berth@crashy.service NRestarts)"
check "the supervisor recorded the exit, then systemd's restart" wait_for 5 sh -c \
    "grep -q '\"systemd-restart\"' '$CT_DIR/state/records/crashy.json'"
in_order() { [ "$(transitions crashy | tail -n 2 | xargs)" = "unexpected-exit systemd-restart" ]; }
check "... in that order, in the daemon's journal" wait_for 5 in_order
check_eq "berth inspect shows the count and the reason" "1 systemd-restart" \
    "$(inspect crashy | json "'%s %s' % (v['restarts'], v['record']['last_transition_reason'])")"
check_eq "the record keeps the count" 1 "$(python3 -c "import json; print(json.load(open('$CT_DIR/state/records/crashy.json'))['restarts'])")"
check_contains "the daemon's journal names the exit's cause" "unexpected-exit (result signal" \
    "$(ct_journal -o cat _SYSTEMD_UNIT=berth-daemon.service | grep 'berth@crashy.service')"
ct systemctl start berth@plain.service
check "plain started" wait_for 5 grep -q '^start ' "$CT_DIR/out/plain.log"
ct systemctl kill --signal=KILL berth@plain.service
sleep 2.5
check_eq "a workload without restart stays down" failed "$(ct_prop berth@plain.service ActiveState)"
check_eq "... nobody started it" 1 "$(grep -c '^start ' "$CT_DIR/out/plain.log")"

# 2. The start limit: three starts within 60 s, then failed.
ct systemctl start berth@looper.service
looper_limited() { ct journalctl -u berth@looper.service -o cat --no-pager | grep -q 'Start request repeated too quickly'; }
check "looper reaches its start limit and is left failed" wait_for 15 looper_limited
check_eq "... after its 3 starts" "failed 3" \
    "$(ct_prop berth@looper.service ActiveState) $(grep -c '^start$' "$CT_DIR/out/looper.log")"
sleep 1.5
check_eq "... and stays failed" failed "$(ct_prop berth@looper.service ActiveState)"
check_eq "the record says failed" failed "$(inspect looper | json "v['record']['state']")"

# 3. Daemon restarts while flappy is restarted by systemd every 3 s.
sleep 1.1 # journalctl --since has whole seconds
since=$(ct date '+%Y-%m-%d %H:%M:%S')
crashy_before="$(ct_prop berth@crashy.service InvocationID) $(ct_prop berth@crashy.service MainPID)"
flaps_before=$(ct_prop berth@flappy.service NRestarts)
for i in 1 2 3; do
    ct systemctl restart berth-daemon.service
    sleep 2.5
done
check "flappy went on being restarted by systemd" test "$(ct_prop berth@flappy.service NRestarts)" -gt "$((flaps_before + 1))"
check_eq "crashy untouched by three daemon restarts" "$crashy_before" \
    "$(ct_prop berth@crashy.service InvocationID) $(ct_prop berth@crashy.service MainPID)"
pid1=$(ct journalctl -o cat _PID=1 --since "$since" --no-pager)
check "no job for the other workloads while the daemon restarted" \
    sh -c "! printf '%s\n' \"\$1\" | grep -E '(Stopping|Starting|Stopped|Started) berth@(crashy|waiter|trigger)'" _ "$pid1"
check_contains "... while systemd restarted flappy itself" "berth@flappy.service: Scheduled restart job" "$pid1"
flappy=$(transitions flappy | sort -u | xargs)
check_eq "the supervisor saw only exits and systemd's restarts of flappy" "systemd-restart unexpected-exit" "$flappy"

# 4. A crash during a drain by hand (no shutdown): trigger's stop kills
# crashy, systemd restarts it a second later, the drain stops it in its
# turn.
ct berth drain >/dev/null 2>&1 || true
check "by hand: outcomes, crashy restarted during the drain and stopped in its turn" python3 - "$CT_DIR" <<'PY'
import json, sys, datetime
d = sys.argv[1]
report = json.load(open(f"{d}/state/last-drain.json"))
got = {w["workload"]: w["outcome"] for w in report["workloads"]}
for name in ("trigger", "crashy", "waiter", "flappy"):
    assert got.get(name) == "GracefulOff", f"{name}: {got}"
began = datetime.datetime.fromisoformat(report["started_at"].replace("Z", "+00:00")).timestamp()
crashy = [(k, float(t)) for k, t in (l.split() for l in open(f"{d}/out/crashy.log"))]
starts = [t for k, t in crashy if k == "start"]
assert len(starts) == 3 and starts[-1] > began, f"crashy started {len(starts)} times: {crashy}"
assert crashy[-1][0] == "stop-end", f"crashy's last event: {crashy[-1]}"
print(f"crashy restarted {starts[-1] - began:.2f} s into a drain of {report['elapsed_ms']} ms")
PY
sleep 2
for w in crashy waiter trigger flappy; do
    check_eq "... berth@$w stays down after the drain" inactive "$(ct_prop berth@$w.service ActiveState)"
done
check_eq "... crashy: systemd's restart job after the kill" 2 \
    "$(ct journalctl -u berth@crashy.service -o cat --no-pager | grep -c 'Scheduled restart job')"

# 5. A real shutdown. waiter is killed just before it: its restart waits
# 30 s when the drain begins.
ct systemctl start berth@crashy.service berth@waiter.service berth@trigger.service berth@flappy.service
check "workloads running again" wait_for 10 sh -c \
    "[ \"\$(nsenter -t $CT_PID -a systemctl show -P SubState berth@waiter.service berth@crashy.service berth@trigger.service | grep -v '^\$' | sort -u)\" = running ]"
ct systemctl kill --signal=KILL berth@waiter.service
check "waiter waits for its restart" wait_for 5 sh -c \
    "[ \"\$(nsenter -t $CT_PID -a systemctl show -P SubState berth@waiter.service)\" = auto-restart ]"
log "  measured: waiting for its restart, waiter shows ActiveState $(ct_prop berth@waiter.service ActiveState)"
ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
check "outcomes, and nothing started after its stop" python3 - "$CT_DIR" <<'PY'
import json, sys, datetime
d = sys.argv[1]
report = json.load(open(f"{d}/state/last-drain.json"))
got = {w["workload"]: (w["outcome"], w.get("found")) for w in report["workloads"]}
want = {
    "trigger": ("GracefulOff", "running"),
    # Killed during trigger's stop; its restart was refused.
    "crashy": ("GracefulOff", "running"),
    # Waiting for its restart: the drain's stop canceled it.
    "waiter": ("GracefulOff", "restarting"),
    "looper": ("AlreadyOff", "failed"),
    "plain": ("AlreadyOff", "failed"),
}
for name, outcome in want.items():
    assert got.get(name) == outcome, f"{name}: got {got.get(name)}, want {outcome}; report: {got}"
assert got["flappy"][0] == "GracefulOff", got["flappy"]
began = datetime.datetime.fromisoformat(report["started_at"].replace("Z", "+00:00")).timestamp()
def events(name):
    return [(k, float(t)) for k, t in (l.split() for l in open(f"{d}/out/{name}.log"))]
# Nothing started after the drain began (its start time has whole
# seconds: 1 s of margin).
for name in ("crashy", "waiter", "trigger", "flappy"):
    late = [round(t - began, 2) for k, t in events(name) if k == "start" and t > began + 1]
    assert not late, f"{name} started {late} s into the drain"
assert [k for k, _ in events("waiter")].count("start") == 2, events("waiter")
print(f"drain of {report['elapsed_ms']} ms")
PY
pid1=$(ct_journal -o cat _PID=1 --boot)
check_contains "systemd refused crashy's restart during the shutdown" \
    "berth@crashy.service: Failed to schedule restart job: Transaction for berth@crashy.service" "$pid1"
check_lacks "... and never scheduled waiter's" "berth@waiter.service: Failed to schedule restart job" "$pid1"
