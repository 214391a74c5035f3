#!/usr/bin/env bash
# harness-job: class=tight minutes=0.2
# Issue 3, test 5: a deadline (5 s) shorter than the stop delays (3 x 10 s,
# one at a time): at the deadline everything still pending is forced off
# and recorded so.
source "$(dirname "$0")/../lib.sh"
scenario_begin 08-deadline

ct_boot deadline "$REPO/tests/harness/config/deadline"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
for w in s1 s2 s3; do
    check_eq "berth@$w running before power-off" active "$(ct_prop "berth@$w.service" ActiveState)"
done
ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
check "everything forced at the 5 s deadline" python3 - "$CT_DIR/state/last-drain.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
got = {w["workload"]: (w["outcome"], w.get("code")) for w in r["workloads"]}
want = {n: ("ForcedOff", "E_DRAIN_DEADLINE") for n in ("s1", "s2", "s3")}
assert got == want, f"got {got}"
assert r["deadline_reached"], r
assert 5_000 <= r["elapsed_ms"] < 5_000 + 10_000, f"drain took {r['elapsed_ms']} ms for a 5 s deadline"
late = [w for w in r["workloads"] if w["workload"] != "s1"]
assert all(w["started_ms"] >= 5_000 for w in late), "s2/s3 were attempted before the deadline"
print(f"drain took {r['elapsed_ms']} ms")
PY
