#!/usr/bin/env bash
# harness-job: class=tight minutes=0.2
# Issue 10, R2: a power-off drain against two hung workloads (SIGTERM
# ignored), one whose force-off is disabled, two whose locks are held by
# another process for the whole drain, and a bus that stops answering:
# dbus-daemon is SIGSTOPped for 4 s once the drain has begun, then let go
# so the power-off can finish. The drain finishes inside its 15 s
# deadline, exits 0, logs an outcome for every workload and writes its
# report.
source "$(dirname "$0")/../lib.sh"
scenario_begin 22-r2-drain-stalled-bus

ct_boot r2 "$REPO/tests/harness/config/stall"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
workloads="q1 q2 q3 q4 h1 h2 p1"
for w in $workloads; do
    check_eq "berth@$w running before power-off" active "$(ct_prop "berth@$w.service" ActiveState)"
done
# Locks held until after the drain (stopped after it: Before=).
for w in q1 q2; do
    ct systemd-run --quiet --unit="hold-$w" -p Before=berth-drain.service \
        flock -x "/run/berthd/locks/workloads/$w" sleep infinity
done
check "the two locks are held" wait_for 5 sh -c "nsenter -t $CT_PID -a flock -n /run/berthd/locks/workloads/q1 true; [ \$? -ne 0 ]"
dbus=$(ct_prop dbus.service MainPID)
check "dbus-daemon found" test "$dbus" -gt 0

ct systemctl poweroff --no-block
draining() { [ "$(ct_prop berth-drain.service ActiveState)" = deactivating ]; }
check "the drain begins" wait_for 30 draining
stopped_at=$(date +%s%N)
ct sh -c "kill -STOP $dbus"
sleep 4
ct sh -c "kill -CONT $dbus" || true
log "  dbus-daemon stopped for $(( ($(date +%s%N) - stopped_at) / 1000000 )) ms during the drain"
ct_wait_exit 120
check "power-off completed" test -z "$CT_PID"

drain_log=$(ct_journal -u berth-drain.service -o cat)
check_contains "the drain exited 0" "berth-drain.service: Deactivated successfully." "$drain_log"
check_lacks "... not a failure" "Failed with result" "$drain_log"
ct_journal -o json --output-fields=BERTH_WORKLOAD,BERTH_OUTCOME,BERTH_ELAPSED_MS,SYSLOG_IDENTIFIER >"$CT_DIR/journal.json"
check "every outcome logged and reported, inside the deadline" python3 - "$CT_DIR" $workloads <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
report = json.load(open(f"{d}/state/last-drain.json"))
got = {w["workload"]: w["outcome"] for w in report["workloads"]}
assert sorted(got) == sorted(names), f"report lists {sorted(got)}"
logged = {}
for line in open(f"{d}/journal.json"):
    r = json.loads(line)
    if "BERTH_OUTCOME" in r and "BERTH_WORKLOAD" in r:
        logged[r["BERTH_WORKLOAD"]] = r["BERTH_OUTCOME"]
assert logged == got, f"journal {logged} != report {got}"
assert report["elapsed_ms"] <= report["deadline_s"] * 1000, f"{report['elapsed_ms']} ms for a {report['deadline_s']} s deadline"
print(f"drain took {report['elapsed_ms']} ms (deadline {report['deadline_s']} s): {got}")
PY
r2() { python3 -c "import json; r=json.load(open('$CT_DIR/state/last-drain.json')); print($1)"; }
log "  measured: drain with a 4 s bus stall and held locks took $(r2 "r['elapsed_ms']") ms of its $(r2 "r['deadline_s']") s deadline; outcomes $(r2 "sorted((w['workload'], w['outcome']) for w in r['workloads'])")"
