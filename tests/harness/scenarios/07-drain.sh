#!/usr/bin/env bash
# harness-job: class=tight minutes=0.3
# Issue 3, test 4: `systemctl poweroff` with graceful workloads, one that
# ignores SIGTERM (ForcedOff at its stop delay), one with force-off disabled
# (TimedOut, and the power-off still completes), one power_off (PoweredOff)
# and one stopped (AlreadyOff). Reverse group order, at most
# drain_parallelism = 2 stopping at once, outcomes and codes in the journal
# and the report, the whole drain inside the 30 s deadline.
source "$(dirname "$0")/../lib.sh"
scenario_begin 07-drain

ct_boot drain "$REPO/tests/harness/config/drain"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
for w in base slow n1 n2 n3 stubborn patient zap; do
    check_eq "berth@$w running before power-off" active "$(ct_prop "berth@$w.service" ActiveState)"
done
check_eq "the drain unit takes STATUS= from its ExecStop" exec "$(ct_prop berth-drain.service NotifyAccess)"
ct_poweroff 120
check "power-off completed although one workload was left running" test -z "$CT_PID"

ct_journal -o json --output-fields=MESSAGE,MESSAGE_ID,BERTH_WORKLOAD,BERTH_OUTCOME,BERTH_CODE,BERTH_ELAPSED_MS \
    >"$CT_DIR/journal.json"
check "outcomes, codes, journal records, order and parallelism" python3 - "$CT_DIR" <<'PY'
import json, sys, os
d = sys.argv[1]
report = json.load(open(f"{d}/state/last-drain.json"))
got = {w["workload"]: (w["outcome"], w.get("code")) for w in report["workloads"]}
want = {
    "base": ("GracefulOff", None), "n1": ("GracefulOff", None), "n2": ("GracefulOff", None),
    "n3": ("GracefulOff", None), "stubborn": ("ForcedOff", "E_DRAIN_FORCED_OFF"),
    "patient": ("TimedOut", "E_DRAIN_GUEST_TIMEOUT"), "zap": ("PoweredOff", None),
    "idle": ("AlreadyOff", None), "slow": ("GracefulOff", None),
}
assert got == want, f"report outcomes:\n got  {got}\n want {want}"
assert report["elapsed_ms"] <= 30_000, f"drain took {report['elapsed_ms']} ms, deadline 30 s"
forced = next(w for w in report["workloads"] if w["workload"] == "stubborn")
assert 3_000 <= forced["elapsed_ms"] < 13_000, f"stubborn forced after {forced['elapsed_ms']} ms, stop delay 3 s"

ids = {"GracefulOff": "a0ddea6ee36c427990a5421dd1040be6", "PoweredOff": "089fe267674d4f0ebf8dde1c34946cf4",
       "AlreadyOff": "5fcdcfa2011b4cf1963341c3862f35f2", "ForcedOff": "d74ad424d3bf40c6bf0b97994b7ba6a6",
       "TimedOut": "77846b70b9fa45779ccea3898efdb420"}
records = [json.loads(l) for l in open(f"{d}/journal.json") if l.strip()]
per = {r["BERTH_WORKLOAD"]: r for r in records if "BERTH_WORKLOAD" in r and "BERTH_OUTCOME" in r}
for name, (outcome, code) in want.items():
    r = per.get(name)
    assert r, f"no journal record for {name}"
    assert r["MESSAGE_ID"] == ids[outcome] and r["BERTH_OUTCOME"] == outcome, (name, r)
    assert r.get("BERTH_CODE") == code, (name, r.get("BERTH_CODE"), code)
    assert int(r["BERTH_ELAPSED_MS"]) >= 0
assert any(r.get("MESSAGE_ID") == "61e222e9096b43169c2ddfd80dc89fbb" for r in records), "no summary record"

# Reverse group order: group 10 is done before group 0 (base) begins.
w = {x["workload"]: x for x in report["workloads"]}
group10_end = max(x["started_ms"] + x["elapsed_ms"] for n, x in w.items() if n not in ("base", "slow"))
assert w["base"]["started_ms"] >= group10_end, f"base began at {w['base']['started_ms']} ms, group 10 ended at {group10_end} ms"
# Never more than 2 stopping at once (the drain's own clock) ...
edges = sorted([(x["started_ms"], 1) for x in report["workloads"]] + [(x["started_ms"] + x["elapsed_ms"], -1) for x in report["workloads"]], key=lambda e: (e[0], e[1]))
level = peak = 0
for _, step in edges:
    level += step; peak = max(peak, level)
assert peak <= 2, f"{peak} stops in flight at once"
# ... and by the workloads' own clocks: stop-begin .. stop-end of the graceful ones.
def events(name):
    ev = {}
    for line in open(f"{d}/out/{name}.log"):
        k, t = line.split(); ev[k] = float(t)
    return ev
# The most stopping at one instant (a sweep over the spans' ends, an end
# before a begin at the same time): two spans that each overlap a third
# need not overlap each other.
spans = [(events(n)["stop-begin"], events(n)["stop-end"]) for n in ("n1", "n2", "n3")]
level = most = 0
for _, step in sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans]):
    level += step; most = max(most, level)
assert most <= 2, f"{most} graceful stops at once by the workloads' clocks: {spans}"
assert events("base")["stop-begin"] >= max(e for _, e in spans), "base stopped before group 10 was done"
print(f"drain took {report['elapsed_ms']} ms; peak parallelism {peak}")
PY
check_contains "the report file is written" '"deadline_s": 30' "$(cat "$CT_DIR/state/last-drain.json")"
# The drain's stops reach systemd as transactions of a transient unit
# that conflicts with them, not as a StopUnit each.
together=$(ct_journal -o cat _PID=1 | grep -E '^Starting berth-stop-[0-9]+-[0-9]+\.service - berth: [0-9]+ stops? together' || true)
check "the drain's stops were queued as transactions" test -n "$together"
check_lacks "... every one of which systemd accepted and ran" "Failed to start berth-stop-" "$(ct_journal -o cat _PID=1)"
# Issue 11, part 4: the drain's progress on the console. slow stops 8 s
# after its group began (5 s or more into the drain): the waiting line of
# the 10th second names it.
sed 's/\x1b\[[0-9;]*m//g' "$CT_DIR/console.log" | tr -d '\r' >"$CT_DIR/console.txt"
console=$(cat "$CT_DIR/console.txt")
check_contains "the console shows each stop as it ends" "berth: berth@stubborn.service ForcedOff after" "$console"
check_contains "the console counts the stops" "(8 of 8 done)" "$console"
check "the console shows what is waited for, and the time left" grep -qE \
    'berth: waiting for 1 workload, (19|20) s left before the deadline \(stopping: berth@slow\.service\)' "$CT_DIR/console.txt"
check_lacks "nothing is said of the workload that was not running" "berth@idle.service AlreadyOff" "$console"
