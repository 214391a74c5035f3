#!/usr/bin/env bash
# harness-job: class=tight minutes=3
# Issue 13, HA ownership on three booted nodes and a real etcd (as in
# scenario 28) when nodes or etcd go away. db is `ha = true, nodes =
# ["n1", "n2", "n3"]` on every node; n1, its first candidate, takes it:
# - the owner's power-off: its drain stops db, releases the key with a
#   stop bound of zero, and the next candidate starts db at once (well
#   inside a TTL);
# - etcd down for everyone: the owner fences, and starts db again once
#   etcd is back and its key is confirmed; the other node takes nothing;
# - the whole root of the owner killed while db's first candidate (n1,
#   booted again) has its daemon SIGKILLed every 10 s, less than a stop
#   bound: each restart lists the keys, so n1 waits a bound of its own
#   and says so in its presence (`waiting`), and the last node, which saw
#   the key go, takes db only after the lease expired and the stop bound
#   in the key ran out, not held back by n1;
# - the last owner (n3) powered off while cut off from etcd: its drain
#   stops db at the lease deadline, ahead of a slow workload the drain
#   order puts first (a peer could start db after the lease and the stop
#   bound, whatever the drain's order).
# Every start and stop of db is timestamped by the workload (one kernel
# clock), so "never both running" is read off the logs of all nodes.
source "$(dirname "$0")/../lib.sh"
scenario_begin 31-cluster-ha-loss
source "$(dirname "$0")/../etcd.sh"
source "$(dirname "$0")/../ha.sh"
trap 'rc=$?; cluster_cleanup; (exit $rc); scenario_end' EXIT

TTL=5
GRACE=15
STOP_DELAY=3
# No ExecStop=, TimeoutStopSec= is stop_delay_s + 30: (0 + 1) * 33 + 5.
BOUND=38
etcd_start
HA_SLOW_ON_N3=1 ha_boot 31

# n1, db's first candidate, takes it (one stop bound after its join).
check "n1, db's first candidate, takes it" wait_for $((BOUND + 20)) has_owner n1
check "... and starts it" wait_for 20 is_running_on n1

# The owner (n1) powers off: its drain stops db, releases the key at once,
# and the next qualifying candidate (n2) starts db, well before n1's
# lease (5 s) would have expired.
# n3 follows ownership on its API's event stream meanwhile.
curl -sN --max-time 120 --unix-socket "/proc/${NODE_PID[n3]}/root/run/berthd/api.sock" \
    http://berth/v1/events >"$HARNESS_DIR/run/31-events" 2>/dev/null &
events_pid=$!
sleep 1
node_use n1
ct_poweroff 60
check "n1 powered off: n2 takes db" wait_for 30 is_running_on n2 n2 n3
check_eq "... and owns it" n2 "$(owner)"
n1_stopped=$(ev n1 stop-end)
n2_started=$(ev n2 start)
check "... n2 started db after n1 had stopped it ($n1_stopped < $n2_started)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped < $n2_started))"
check "... within the lease TTL of n1's release ($(python3 -c "print(round($n2_started - $n1_stopped, 2))") s < $TTL s)" \
    python3 -c "import sys; sys.exit(not ($n2_started - $n1_stopped < $TTL))"
drain_log=$(ct_journal -u berth-drain.service -o cat)
check_contains "n1's drain released db" "cluster: released db: it is down" "$drain_log"
check_contains "... and announced drained" "cluster: n1 announced drained" "$drain_log"
check_contains "n1's last state is drained" '"state":"drained"' "$(etcdctl get /berth/last-state/n1 --print-value-only)"
owner_seen() { grep -A1 '^event: OWNER' "$HARNESS_DIR/run/31-events" | grep -qF '"workload":"db","owner":"n2"'; }
check "n3's /v1/events told n2's take of db" wait_for 10 owner_seen
check "... after n1's release: its key put with a stop bound of zero, then deleted" \
    python3 - "$HARNESS_DIR/run/31-events" "$BOUND" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().split("\n")
events = [json.loads(lines[i + 1][6:]) for i, line in enumerate(lines)
          if line == "event: OWNER" and i + 1 < len(lines) and lines[i + 1].startswith("data: ")]
seq = [(e["owner"], e["stop_bound_s"]) for e in events if e["workload"] == "db"]
print(seq)
assert seq[:3] == [("n1", 0), (None, None), ("n2", int(sys.argv[2]))], seq
PY
kill "$events_pid" 2>/dev/null || true

# etcd down for the whole cluster: the owner (n2) fences; when etcd is
# back (its leader restores every lease with a fresh TTL) n2 confirms its
# key and starts db again; n3, up all along, takes nothing.
revision=$(create_revision_of /berth/owners/db)
n3_took=$(took n3)
etcd_stop
check "etcd down: n2 fences db" wait_for $((TTL + STOP_DELAY + 5)) db_down_on n2
sleep $TTL
etcd_start
check "etcd back: n2 starts db again" wait_for 30 is_running_on n2 n2 n3
check_eq "... its key is the same one, still n2's; n3 took nothing" "$revision n2 $n3_took" \
    "$(create_revision_of /berth/owners/db) $(owner) $(took n3)"
check "... once the key was confirmed on its lease" says_more n2 "fence lifted: db's owner key is still on lease" 0

# n1, db's first candidate, boots again (the same host) while n2 owns db.
present() { [ -n "$(lease_of "/berth/nodes/$1")" ]; }
CT_KEEP_STATE=1 node_boot n1 ""
check "n1 boots again and joins" wait_for 60 present n1
check_eq "... db stays on n2" "n2 n2" "$(running_on) $(owner)"

# The whole root of n2 killed (its PID 1, SIGKILL): nobody releases
# anything. n3 takes db after n2's lease expired and the stop bound ran
# out: no earlier than the bound after the kill. Meanwhile n1's daemon is
# SIGKILLed every 10 s (systemd restarts it): each start lists the keys
# and waits a stop bound of its own for db, so n1 would never take db;
# it says it is waiting, and n3 takes db without waiting for it.
waited=$(count_in n3 'the owner key of db went (last owner n2)')
n1_took=$(took n1)
killed=$(date +%s.%N)
kill -9 "${NODE_PID[n2]}"
restarts=$HARNESS_DIR/run/31-n1-restarts
: >"$restarts"
(
    while sleep 10; do
        on n1 systemctl kill --signal=KILL berth-daemon.service && echo "$(date +%s.%N)" >>"$restarts"
    done
) &
restarter=$!
n1_waits() { etcdctl get /berth/nodes/n1 --print-value-only | grep -qF '"waiting":["db"]'; }
check "n1's daemon restarted after the kill: its presence says it waits for db" wait_for 40 n1_waits
node_use n2
ct_wait_exit 30
check "n2 killed: n3 takes db" wait_for $((TTL + BOUND + 20)) is_running_on n3 n1 n3
kill "$restarter" 2>/dev/null || true
wait "$restarter" 2>/dev/null || true
check "... while n1's daemon was SIGKILLed every 10 s ($(wc -l <"$restarts") times)" \
    test "$(wc -l <"$restarts")" -ge 3
check_eq "... n1 took nothing" "$n1_took" "$(took n1)"
check_eq "... and owns it" n3 "$(owner)"
n3_started=$(ev n3 start)
after=$(python3 -c "print(round($n3_started - $killed, 2))")
check "... no earlier than the stop bound after the kill ($after s >= $BOUND s)" \
    python3 -c "import sys; sys.exit(not ($after >= $BOUND))"
check "... and no later than the TTL, the bound and 10 s ($after s <= $((TTL + BOUND + 10)) s)" \
    python3 -c "import sys; sys.exit(not ($after <= $TTL + $BOUND + 10))"
check "n3 said why it waited" says_more n3 'the owner key of db went (last owner n2)' "$waited"

# Never both running: every run of db on every node, from its start to its
# stop-end (a run with none ended with its root's kill, or runs still),
# one kernel clock; no two overlap.
never_both() {
    python3 - "$killed" "${NODE_DIR[n1]}/out/db.log" "${NODE_DIR[n2]}/out/db.log" "${NODE_DIR[n3]}/out/db.log" <<'PY'
import sys, time
killed, logs = float(sys.argv[1]), sys.argv[2:]
runs = []
for i, path in enumerate(logs):
    start = None
    for line in open(path):
        event, t = line.split()
        if event == "start":
            assert start is None, f"{path}: two starts without a stop"
            start = float(t)
        elif event == "stop-end" and start is not None:
            runs.append((start, float(t), path))
            start = None
    if start is not None:
        # n2's last run ended with its root's kill; n3's still runs.
        runs.append((start, killed if "/n2/" in path else time.time(), path))
runs.sort()
print(f"{len(runs)} runs of db")
for a, b in zip(runs, runs[1:]):
    assert a[1] < b[0], f"overlap: {a} and {b}"
PY
}
check "db never ran on two nodes at once (every run on every node, by timestamps)" never_both

# n3, db's owner, powers off cut off from etcd. Its drain stops slow first
# (order 10, 8 s) and db after it, but db's key expires with n3's lease
# whatever the drain's order: db is stopped at the lease deadline, while
# slow is still stopping.
node_use n3
cut=$(date +%s.%N)
kill -STOP "${RELAY_PID[n3]}"
ct_poweroff 90
db_stop=$(ev n3 stop-begin)
slow_end=$(awk '$1 == "stop-end" { t = $2 } END { print t }' "${NODE_DIR[n3]}/out/slow.log" 2>/dev/null || true)
check "n3 powered off cut off from etcd: its drain stopped db within TTL - margin + 1 s of the cut ($(python3 -c "print(round($db_stop - $cut, 2))") s)" \
    python3 -c "import sys; sys.exit(not (0 < $db_stop - $cut <= $TTL - 2 + 1))"
check "... ahead of the drain order: slow, drained first, was still stopping ($db_stop < ${slow_end:-none})" \
    python3 -c "import sys; sys.exit(not ($db_stop < ${slow_end:-0}))"
check_contains "... and said so" "fence: the lease deadline passed with no keep-alive acknowledged; stopping db" \
    "$(ct_journal -u berth-drain.service -o cat)"
