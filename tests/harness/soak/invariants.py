#!/usr/bin/env python3
"""The soak's invariant checker (issue 15).

  invariants.py watch SOAK_DIR     samples every root's workload cgroups
  invariants.py report SOAK_DIR    counts what the samples and the fault
                                   log show; exit 1 on a broken invariant

`watch` reads the host's view of each root (a frozen root's own systemd
cannot answer): SOAK_DIR/nodes.json maps a node to its root's cgroup on
the unified hierarchy and lists the workloads. Every 0.2 s it appends one
line to SOAK_DIR/samples.log:

  TIME frozen=n1 ha1=n1 ha2=n2,n3 web=n1,n2,n3 owners=ha1:n1,ha2:n3~

each workload followed by the nodes where its unit's cgroup is populated,
`frozen=` the roots whose cgroup is frozen, `owners=` each HA workload's
owner key as etcd has it (read through its JSON gateway, nodes.json's
`etcd`): the node it names, with `~` when the key is not on that node's
live lease (its presence's); `owners=?` when etcd did not answer within
0.15 s. It stops when SOAK_DIR/stop appears.

`report` reads samples.log and SOAK_DIR/faults.log, which the driver
writes (TIME EVENT ARGS...):

  down NODE KIND       NODE is under a fault of KIND ("all" for etcd)
  up NODE              NODE is healthy again (root booted and not
                       frozen, daemon active, presence up)
  stall NODE W...      the long freeze of NODE begins; it owns W...
  stall-thaw NODE      the long freeze of NODE ended
  drain NODE FILE      NODE's drain report, copied to FILE
  drain-missing NODE   NODE powered off without a report of that boot
  (a `down` of kind start-failures: the node's HA starts fail until its
   `up`; its reconcile may wait one more backoff step, as long again;
   failed-start is the node drained meanwhile)
  unsettled NODE       NODE did not become healthy in time
  end                  the last fault is over (the samples must reach it)

and writes the counts to SOAK_DIR/counts.json; the driver's checks judge
them. A copy runs when its cgroup is populated and its root is not frozen.
"""
import base64
import json
import os
import sys
import time
import urllib.request

INTERVAL = 0.2
# Owned here but not running: the reconcile's period (2 s) and a start
# (owner-check's transaction, the workload's READY) may pass first.
OWNED_NOT_RUNNING_ALLOW_S = 5.0


def populated(path):
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return "populated 1" in f.read()
    except OSError:
        return False


def frozen(root):
    try:
        with open(os.path.join(root, "cgroup.freeze")) as f:
            if f.read().strip() == "1":
                return True
        with open(os.path.join(root, "cgroup.events")) as f:
            return "frozen 1" in f.read()
    except OSError:
        return False


def find_slice(root):
    """The berth.slice directory under a root's cgroup (its depth depends
    on how nspawn nests the container's tree), or None."""
    for top, dirs, _ in os.walk(root):
        if "berth.slice" in dirs:
            return os.path.join(top, "berth.slice")
        if top.count(os.sep) - root.count(os.sep) >= 3:
            dirs[:] = []
    return None


# etcd is on the host's loopback: never through an http_proxy.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def etcd_range(url, prefix):
    """The keys under `prefix` as {key: (value, lease)}; raises on no answer."""
    def b64(text):
        return base64.b64encode(text.encode()).decode()
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": b64(prefix), "range_end": b64(end)}).encode()
    req = urllib.request.Request(url + "/v3/kv/range", data=body, method="POST")
    with DIRECT.open(req, timeout=0.15) as r:
        reply = json.load(r)
    out = {}
    for kv in reply.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode(errors="replace")
        value = base64.b64decode(kv.get("value", "")).decode(errors="replace")
        out[key] = (value, int(kv.get("lease", 0)))
    return out


def owners_field(url, ha):
    """`ha1:n1,ha2:n3~` (see the module's text), or `?`."""
    try:
        owners = etcd_range(url, "/berth/owners/")
        presences = etcd_range(url, "/berth/nodes/")
    except Exception:  # noqa: BLE001 (etcd down, slow or restarting)
        return "?"
    out = []
    for w in ha:
        got = owners.get(f"/berth/owners/{w}")
        if got is None:
            continue
        try:
            node = json.loads(got[0])["node"]
        except (ValueError, KeyError, TypeError):
            continue
        live = presences.get(f"/berth/nodes/{node}", (None, -1))[1]
        out.append(f"{w}:{node}" + ("" if got[1] == live else "~"))
    return ",".join(out)


def watch(soak):
    with open(os.path.join(soak, "nodes.json")) as f:
        spec = json.load(f)
    nodes, workloads = spec["nodes"], spec["workloads"]
    etcd = spec.get("etcd")
    slices = {}
    stop = os.path.join(soak, "stop")
    with open(os.path.join(soak, "samples.log"), "a", buffering=1) as out:
        while not os.path.exists(stop):
            began = time.monotonic()
            now = time.time()
            where = {w: [] for w in workloads}
            cold = []
            for node, root in nodes.items():
                if frozen(root):
                    cold.append(node)
                s = slices.get(node)
                if s is None or not os.path.isdir(s):
                    s = slices[node] = find_slice(root)
                if s is None:
                    continue
                for w in workloads:
                    if populated(os.path.join(s, f"berth@{w}.service")):
                        where[w].append(node)
            line = f"{now:.3f} frozen={','.join(cold)}"
            for w in workloads:
                line += f" {w}={','.join(where[w])}"
            if etcd:
                line += f" owners={owners_field(etcd, spec['ha'])}"
            out.write(line + "\n")
            time.sleep(max(0.0, INTERVAL - (time.monotonic() - began)))


def read_samples(soak):
    samples = []
    with open(os.path.join(soak, "samples.log")) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 2:
                continue
            t = float(fields[0])
            cold = set()
            where = {}
            owners = None
            for field in fields[1:]:
                key, _, value = field.partition("=")
                names = set(value.split(",")) if value else set()
                if key == "frozen":
                    cold = names
                elif key == "owners":
                    if value != "?":
                        owners = {}
                        for pair in names:
                            w, _, node = pair.partition(":")
                            owners[w] = node
                else:
                    where[key] = names
            samples.append((t, cold, where, owners))
    return samples


def read_faults(soak):
    events = []
    with open(os.path.join(soak, "faults.log")) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2:
                events.append((float(fields[0]), fields[1], fields[2:]))
    return events


def down_intervals(events, nodes, end):
    """Per node, the [from, to] spans it was not healthy: from the start
    until its first `up`, and from each `down` to the next `up`."""
    spans = {n: [] for n in nodes}
    since = {n: 0.0 for n in nodes}
    kinds = {n: "start" for n in nodes}
    out = {n: [] for n in nodes}
    for t, event, args in events:
        if event == "down":
            who = nodes if args[0] == "all" else [args[0]]
            for n in who:
                if since[n] is None:
                    since[n] = t
                    kinds[n] = args[1] if len(args) > 1 else ""
        elif event == "up":
            n = args[0]
            if since[n] is not None:
                spans[n].append((since[n], t))
                out[n].append((since[n], t, kinds[n]))
                since[n] = None
    for n in nodes:
        if since[n] is not None:
            spans[n].append((since[n], end))
            out[n].append((since[n], end, kinds[n]))
    return spans, out


def healthy_through(spans, a, b):
    return all(to < a or since > b for since, to in spans)


def touched(spans, a, b):
    """Whether a node went down or came up within [a, b]."""
    return any(a <= since <= b or a <= to <= b for since, to in spans)


# After a node is healthy again, how long a stop may still be its fault's
# doing: the fence's look, a lease, the stop itself and some slack.
def explained_until(up, ttl, stop_delay):
    return up + ttl + stop_delay + 5


def report(soak):
    with open(os.path.join(soak, "nodes.json")) as f:
        spec = json.load(f)
    nodes = list(spec["nodes"])
    ha = spec["ha"]  # workload -> candidates
    bound = spec["unowned_bound_s"]
    stop_delay = spec["stop_delay_s"]
    ttl = spec["ttl_s"]
    samples = read_samples(soak)
    events = read_faults(soak)
    counts = {}
    if not samples:
        print("no samples")
        counts["samples"] = 0
        with open(os.path.join(soak, "counts.json"), "w") as f:
            json.dump(counts, f)
        return 1
    end = samples[-1][0]
    spans, labelled = down_intervals(events, nodes, end)
    # The checker ran from before the first fault to after the last.
    faults_at = [t for t, e, _ in events if e in ("down", "end")]
    counts["samples_cover_the_run"] = bool(
        faults_at and samples[0][0] <= min(faults_at) and samples[-1][0] >= max(faults_at))

    def running(sample, w):
        _, cold, where, _ = sample
        return where.get(w, set()) - cold

    # Double runs: episodes with an HA workload running on two nodes.
    thaws = [(t, args[0]) for t, e, args in events if e == "stall-thaw"]
    stall_owned = {args[0]: set(args[1:]) for _, e, args in events if e == "stall"}
    doubles, stalled = [], []
    for w in ha:
        open_at, who = None, set()
        for s in samples:
            r = running(s, w)
            if len(r) >= 2:
                if open_at is None:
                    open_at, who = s[0], set()
                who |= r
            elif open_at is not None:
                doubles.append((w, open_at, s[0], sorted(who)))
                open_at = None
        if open_at is not None:
            doubles.append((w, open_at, end, sorted(who)))
    # A double run is the stalled host's only when it owned that workload
    # when it froze, began at the thaw, and its copy stopped within the
    # fence's bound after the thaw (stop_delay_s + 4 s): the stale one must
    # not survive. Judged by a sample in that bound without it, not by the
    # end of the double run: another fault may end the peer's copy first,
    # and the stalled host may then take the workload again, rightly, once
    # its stale copy is gone (the peer's new boot revoked its old lease).
    outside, survivors = [], 0
    stale_bound = stop_delay + 4
    for d in doubles:
        w, a, b, who = d
        thaw = next(((t, n) for t, n in thaws if n in who and w in stall_owned.get(n, ())
                     and t - 0.5 <= a <= t + 5), None)
        if thaw is not None:
            t, n = thaw
            window = [s for s in samples if t <= s[0] <= t + stale_bound] or [samples[-1]]
            if all(n in running(s, w) for s in window):
                survivors += 1
                print(f"STALE COPY SURVIVED: {w} ran on {n} throughout the {stale_bound} s "
                      f"after the thaw at {t:.1f}")
            stalled.append((w, t, b, who))
        else:
            outside.append(d)
    counts["double_runs"] = len(outside)
    counts["stale_copies_survived"] = survivors
    for w, a, b, who in outside:
        print(f"DOUBLE RUN: {w} on {'+'.join(who)} from {a:.1f} for {b - a:.1f} s")
    if thaws:
        if stalled:
            for w, thaw, b, who in stalled:
                print(f"stalled-host window: {w} ran on {'+'.join(who)} for {b - thaw:.2f} s after the thaw")
            counts["stalled_window_s"] = round(max(b - t for _, t, b, _ in stalled), 2)
        else:
            print("stalled-host window: no double run after the long freeze (nobody had taken over)")
            counts["stalled_window_s"] = 0.0

    # Unowned (the rule, judged): no running copy through
    # [t - bound, t] while some candidate was healthy through it, whatever
    # the others did. Also counted, for comparison with the first
    # version: the narrower rule that excuses a window in which a
    # candidate before the healthy one went down or came up (before
    # placement passed over a waiting candidate, a first candidate that
    # kept restarting held a workload back).
    overdue, strict, longest, moves = 0, 0, 0.0, 0
    for w, candidates in ha.items():
        gap_since, flagged, flagged_strict, last = None, False, False, None
        for s in samples:
            t = s[0]
            r = running(s, w)
            if r:
                if gap_since is not None:
                    longest = max(longest, t - gap_since)
                if last is not None and r != last:
                    moves += 1
                gap_since, flagged, flagged_strict, last = None, False, False, r
                continue
            if gap_since is None:
                gap_since = t
            if t - gap_since < bound:
                continue
            healthy = [c for c in candidates if healthy_through(spans[c], t - bound, t)]
            if not flagged_strict and healthy:
                strict += 1
                flagged_strict = True
                print(f"UNOWNED: {w} has run nowhere since {gap_since:.1f} ({t - gap_since:.0f} s) "
                      f"while {','.join(healthy)} was up throughout")
            if flagged:
                continue
            up = []
            for i, c in enumerate(candidates):
                if any(touched(spans[p], t - bound, t) for p in candidates[:i]):
                    break
                if healthy_through(spans[c], t - bound, t):
                    up.append(c)
            if up:
                overdue += 1
                flagged = True
    counts["unowned_past_bound"] = overdue
    counts["unowned_past_bound_any_candidate"] = strict
    # For the note: the longest time an HA workload ran nowhere, whatever
    # the faults, and how often one came back on another set of nodes.
    counts["longest_nowhere_s"] = round(longest, 1)
    counts["moves"] = moves

    # Stops: a copy that goes from running to not populated, put down to
    # the node's latest fault when it came before the node was healthy
    # again plus a lease, the stop and slack. By a daemon restart (kill or
    # stop within the grace): none may stop. An HA copy stops only under a
    # fault of its node (or etcd's); a non-HA one only when its root powers
    # off or dies.
    restart_kinds = {"daemon-kill", "daemon-stop-within-grace"}
    # What stops every workload of the node: its root going, or a drain.
    root_kinds = {"poweroff-boot", "root-kill-boot", "start", "manual-drain", "failed-start"}
    by_restart, non_ha, unexplained = [], [], []
    for prev, cur in zip(samples, samples[1:]):
        t = cur[0]
        for w in cur[2]:
            for n in prev[2][w] - cur[2][w]:
                if n in prev[1] or n in cur[1]:
                    continue
                latest = None
                for a, b, k in labelled[n]:
                    if a <= t:
                        latest = (a, b, k)
                kind = latest[2] if latest and t <= explained_until(latest[1], ttl, stop_delay) else None
                if kind in restart_kinds:
                    by_restart.append((w, n, t, kind))
                if w not in ha and kind not in root_kinds:
                    non_ha.append((w, n, t, kind))
                if w in ha and kind is None:
                    unexplained.append((w, n, t, kind))
    for w, n, t, k in by_restart:
        print(f"STOPPED BY A DAEMON RESTART: {w} on {n} at {t:.1f} ({k})")
    for w, n, t, k in non_ha:
        print(f"NON-HA STOP: {w} on {n} at {t:.1f} (fault: {k or 'none'})")
    for w, n, t, k in unexplained:
        print(f"HA STOP WITHOUT A FAULT: {w} on {n} at {t:.1f}")
    counts["stops_by_daemon_restart"] = len(by_restart)
    counts["non_ha_stops"] = len(non_ha)
    counts["ha_stops_without_a_fault"] = len(unexplained)

    # Owned but not running: an owner key on its node's live lease while
    # that node is healthy (and no start failure was injected there, nor
    # one backoff step after) and the workload does not run there, for
    # longer than the reconcile period plus a start.
    excused = {n: [] for n in nodes}
    for n in nodes:
        for a, b, k in labelled[n]:
            excused[n].append((a, b + (b - a if k in ("failed-start", "start-failures") else 0.0)))

    def excused_at(n, t):
        return any(a <= t <= b for a, b in excused.get(n, ()))

    stuck, stuck_longest = 0, 0.0
    for w in ha:
        since, owner, flagged = None, None, False
        for s in samples:
            t, cold, _, owners = s
            if owners is None:
                continue
            o = owners.get(w)
            if o is None or o.endswith("~") or o in cold or excused_at(o, t) or o in running(s, w):
                since, owner, flagged = None, None, False
                continue
            if since is None or owner != o:
                since, owner, flagged = t, o, False
            stuck_longest = max(stuck_longest, t - since)
            if not flagged and t - since > OWNED_NOT_RUNNING_ALLOW_S:
                stuck += 1
                flagged = True
                print(f"OWNED, NOT RUNNING: {w} owned by {o} since {since:.1f}, not running there "
                      f"for more than {OWNED_NOT_RUNNING_ALLOW_S:.0f} s while it was healthy")
    counts["owned_not_running"] = stuck
    counts["owned_not_running_longest_s"] = round(stuck_longest, 2)
    counts["owner_samples"] = sum(1 for s in samples if s[3] is not None)

    # Drains: every outcome, tallied; anything but a graceful stop (or a
    # workload that was not running) is a failure.
    tally, bad = {}, 0
    drains = [args for _, e, args in events if e == "drain"]
    for node, path in drains:
        with open(path) as f:
            rep = json.load(f)
        outcomes = []
        for entry in rep.get("workloads", []):
            o = entry.get("outcome")
            tally[o] = tally.get(o, 0) + 1
            outcomes.append(f"{entry.get('workload')}={o}")
            if o not in ("GracefulOff", "AlreadyOff"):
                bad += 1
        print(f"drain on {node}: {rep.get('elapsed_ms')} ms, {' '.join(outcomes)}")
    counts["drains"] = len(drains)
    counts["drain_outcomes"] = tally
    counts["drain_outcomes_not_graceful"] = bad
    counts["drains_missing"] = sum(1 for _, e, _ in events if e == "drain-missing")
    counts["unsettled"] = sum(1 for _, e, _ in events if e == "unsettled")
    # The final state: every HA workload on one node, the non-HA one on all.
    last = samples[-1]
    counts["final_ha_running_once"] = all(len(running(last, w)) == 1 for w in ha)
    counts["final_non_ha_everywhere"] = all(running(last, w) == set(nodes) for w in spec["workloads"] if w not in ha)
    counts["samples"] = len(samples)
    gaps = [b[0] - a[0] for a, b in zip(samples, samples[1:])]
    counts["longest_sample_gap_s"] = round(max(gaps), 2) if gaps else 0.0
    counts["stop_delay_s"] = stop_delay
    with open(os.path.join(soak, "counts.json"), "w") as f:
        json.dump(counts, f, indent=1, sort_keys=True)
    print(json.dumps(counts, sort_keys=True))
    # The fault log, in seconds from the first event.
    if events:
        t0 = events[0][0]
        for t, e, args in events:
            if e != "drain":
                print(f"fault log  +{t - t0:7.1f}  {e} {' '.join(args)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("watch", "report"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(watch(sys.argv[2]) if sys.argv[1] == "watch" else report(sys.argv[2]))
