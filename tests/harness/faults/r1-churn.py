#!/usr/bin/env python3
"""Issue 10, R1: SIGKILLs of berth daemon at random points while workloads
churn by hand; then an audit of systemd's journal and berth's records.

    r1-churn.py CT_PID KILLS RESULT.json

Two threads: the churn starts, stops and kills (SIGKILL) workloads through
systemctl, one action at a time, and notes every InvocationID it begins or
ends with the time; the killer SIGKILLs the daemon at a random point after
each new daemon process appears (so before, during and after its first
pass) and notes when each kill happened and when the next daemon was
ready. The audit (printed, and written to RESULT.json for the scenario's
checks) compares:

  - systemd's own job log (PID 1's "Starting"/"Stopping" lines per unit)
    with the starts and stops the churn made: any extra one is an action
    of the daemon;
  - berth's transition lines (BERTH_GENERATION, BERTH_ENDED_INVOCATION_ID)
    with the instances the churn ended: each exactly once, except an
    instance that lived entirely while no daemon watched (it may be never
    recorded; see berth(8), "replaced").
"""
import json
import random
import subprocess
import sys
import threading
import time

CT_PID, KILLS, RESULT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
WORKLOADS = [f"w{i:02d}" for i in range(1, 21)]
# A window of "no daemon watching": from this long before a kill (the
# daemon's lag behind systemd's signals) to this long after the next
# daemon's READY (its look at every running workload follows READY).
LAG_BEFORE_S = 0.5
SETTLE_AFTER_S = 1.0
SD_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
SD_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"


def ct(*args, check=True):
    r = subprocess.run(["nsenter", "-t", CT_PID, "-a", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{args}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout.strip()


def prop(unit, name):
    return ct("systemctl", "show", "-P", name, unit)


def unit(w):
    return f"berth@{w}.service"


random.seed(int(time.time()))
done = threading.Event()
errors = []

# --- the churn ---------------------------------------------------------------
running = {w: prop(unit(w), "InvocationID") for w in WORKLOADS}
began = {w: (0.0, inv) for w, inv in running.items()}  # boot instances
ended = []  # (workload, invocation, how, began_at, ended_at)
starts = {w: 1 for w in WORKLOADS}  # the boot autostart's
stops = {w: 0 for w in WORKLOADS}
actions = 0


def churn():
    global actions
    try:
        while not done.is_set():
            w = random.choice(WORKLOADS)
            inv = running[w]
            if inv:
                how = random.choice(["stop", "kill"])
                if how == "stop":
                    ct("systemctl", "stop", unit(w))
                    stops[w] += 1
                else:
                    ct("systemctl", "kill", "-s", "KILL", unit(w))
                    for _ in range(200):
                        if prop(unit(w), "ActiveState") in ("failed", "inactive"):
                            break
                        time.sleep(0.02)
                    else:
                        raise RuntimeError(f"{w} still up 4 s after SIGKILL")
                ended.append((w, inv, how, began[w][0], time.time()))
                running[w] = ""
            else:
                t = time.time()
                ct("systemctl", "start", unit(w))
                new = prop(unit(w), "InvocationID")
                starts[w] += 1
                running[w] = new
                began[w] = (t, new)
            actions += 1
            # Busy, not a flood: journald (and with it every logger) on
            # two cores is what a faster churn measures.
            time.sleep(0.1)
    except Exception as e:  # noqa: BLE001 - reported, then the run fails
        errors.append(f"churn: {e}")
        done.set()


# --- the killer --------------------------------------------------------------
windows = []  # [kill time - lag, next READY + settle]
kills = 0
kills_before_ready = 0


def daemon_pid():
    return prop("berth-daemon.service", "MainPID")


def killer():
    global kills, kills_before_ready
    try:
        last = None
        while kills < KILLS and not done.is_set():
            # The next daemon process (systemd restarts it after RestartSec).
            for _ in range(1000):
                pid = daemon_pid()
                if pid not in ("0", last):
                    break
                time.sleep(0.01)
            else:
                raise RuntimeError("no new daemon process within 10 s")
            # One kill in five as soon as the process is seen (before READY,
            # in its first pass), the others anywhere in the next 2 s.
            time.sleep(0.0 if random.random() < 0.2 else random.uniform(0.0, 2.0))
            state = prop("berth-daemon.service", "ActiveState")
            t = time.time()
            ct("sh", "-c", f"kill -9 {pid}", check=False)
            kills += 1
            if state != "active":
                kills_before_ready += 1
            last = pid
            windows.append([t - LAG_BEFORE_S, None])
        # Every window closes at the next READY.
        for _ in range(1000):
            if prop("berth-daemon.service", "ActiveState") == "active" and daemon_pid() not in ("0", last):
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("the daemon did not come back after the last kill")
    except Exception as e:  # noqa: BLE001
        errors.append(f"killer: {e}")
    finally:
        done.set()


def journal(*match):
    out = ct("journalctl", "-o", "json", "--no-pager", *match)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


began_at = time.time()
threads = [threading.Thread(target=churn), threading.Thread(target=killer)]
for th in threads:
    th.start()
for th in threads:
    th.join()
churn_s = time.time() - began_at
time.sleep(3)  # the last daemon's look after READY, then a pass

# READY times, from systemd's own log: "Started berth supervisor" lines.
ready = sorted(
    int(e["__REALTIME_TIMESTAMP"]) / 1e6
    for e in journal("_PID=1", "UNIT=berth-daemon.service", "MESSAGE_ID=39f53479d3a045ac8e11786248231fbf")
)
for wdw in windows:
    later = [r for r in ready if r > wdw[0] + LAG_BEFORE_S]
    wdw[1] = (later[0] if later else time.time()) + SETTLE_AFTER_S


def unwatched(t0, t1):
    return any(a <= t0 and t1 <= b for a, b in windows)


def in_window(t):
    return any(a <= t <= b for a, b in windows)


# --- the audit ---------------------------------------------------------------
problems = list(errors)
got_starts = {w: 0 for w in WORKLOADS}
got_stops = {w: 0 for w in WORKLOADS}
for e in journal("_PID=1", f"MESSAGE_ID={SD_STARTING}"):
    w = e.get("UNIT", "")[len("berth@"):-len(".service")]
    if w in got_starts:
        got_starts[w] += 1
for e in journal("_PID=1", f"MESSAGE_ID={SD_STOPPING}"):
    w = e.get("UNIT", "")[len("berth@"):-len(".service")]
    if w in got_stops:
        got_stops[w] += 1
extra_jobs = {
    w: (got_starts[w] - starts[w], got_stops[w] - stops[w])
    for w in WORKLOADS
    if (got_starts[w], got_stops[w]) != (starts[w], stops[w])
}
if extra_jobs:
    problems.append(f"start/stop jobs the churn did not make (starts, stops): {extra_jobs}")
final_ids = {w: prop(unit(w), "InvocationID") if running[w] else "" for w in WORKLOADS}
changed = [w for w in WORKLOADS if running[w] and final_ids[w] != running[w]]
if changed:
    problems.append(f"running instances replaced behind the churn: {changed}")

events = [e for e in journal("SYSLOG_IDENTIFIER=berth-daemon") if "BERTH_TRANSITION" in e]
by_workload = {w: [] for w in WORKLOADS}
for e in events:
    if e["BERTH_WORKLOAD"] in by_workload:
        by_workload[e["BERTH_WORKLOAD"]].append(e)
# A line is sent before its record is written: a daemon killed in between
# sends it again, with the same generation (berth(8)). One transition per
# distinct generation; its repeats must say the same.
repeated = 0
for w, es in by_workload.items():
    first = {}
    kept = []
    for e in es:
        g = e["BERTH_GENERATION"]
        if g in first:
            repeated += 1
            if first[g].get("BERTH_ENDED_INVOCATION_ID") != e.get("BERTH_ENDED_INVOCATION_ID"):
                problems.append(f"{w}: generation {g} logged for two different exits")
            continue
        first[g] = e
        kept.append(e)
    by_workload[w] = kept
events = [e for es in by_workload.values() for e in es]
gaps = []
for w, es in by_workload.items():
    gens = [int(e["BERTH_GENERATION"]) for e in es]
    if any(b != a + 1 for a, b in zip(gens, gens[1:])):
        gaps.append((w, gens))
    with open(f"/proc/{CT_PID}/root/var/lib/berth/records/{w}.json") as f:
        record = json.load(f)
    if gens and record["transition_generation"] != gens[-1]:
        gaps.append((w, "record", record["transition_generation"], "last line", gens[-1]))
    if running[w] and record.get("invocation_id") != final_ids[w]:
        problems.append(f"{w}: record invocation_id {record.get('invocation_id')} != live {final_ids[w]}")
    if record["state"] not in (("running",) if running[w] else ("stopped", "failed")):
        problems.append(f"{w}: record state {record['state']}, running={bool(running[w])}")
if gaps:
    problems.append(f"generations not +1 per line, or not the record's: {gaps}")

named = {}
for e in events:
    inv = e.get("BERTH_ENDED_INVOCATION_ID")
    if inv:
        named.setdefault(inv, []).append(e)
churn_ended = {inv for (_, inv, _, _, _) in ended}
invented = [inv for inv in named if inv not in churn_ended]
if invented:
    problems.append(f"exits recorded for instances the churn did not end: {invented}")
checked = tolerated = tolerated_recorded = 0
twice, missing, misread = [], [], []
expect = {"stop": "stop-user", "kill": "unexpected-exit"}
reasons = {}
for w, inv, how, t0, t1 in ended:
    n = len(named.get(inv, []))
    if n > 1:
        twice.append((w, inv, n))
    if unwatched(t0, t1):
        tolerated += 1
        tolerated_recorded += n
        continue
    checked += 1
    if n == 0:
        missing.append((w, inv, how, round(t0 - began_at, 2), round(t1 - began_at, 2)))
        continue
    e = named[inv][0]
    reasons[e["BERTH_TRANSITION"]] = reasons.get(e["BERTH_TRANSITION"], 0) + 1
    if e.get("BERTH_DETECTED_BY") == "signal" and not in_window(t1) and e["BERTH_TRANSITION"] != expect[how]:
        misread.append((w, how, e["BERTH_TRANSITION"]))
if twice:
    problems.append(f"exits recorded more than once: {twice}")
if missing:
    problems.append(f"exits never recorded: {missing}")
if misread:
    problems.append(f"exits seen by a signal with the wrong reason: {misread}")

result = {
    "kills": kills,
    "kills_before_ready": kills_before_ready,
    "churn_seconds": round(churn_s, 1),
    "churn_actions": actions,
    "exits": len(ended),
    "exits_checked": checked,
    "exits_unwatched": tolerated,
    "exits_unwatched_recorded": tolerated_recorded,
    "transitions": len(events),
    "lines_repeated": repeated,
    "reasons": reasons,
    "extra_jobs": len(extra_jobs),
    "problems": problems,
}
print(json.dumps(result, indent=1))
with open(RESULT, "w") as f:
    json.dump(result, f)
