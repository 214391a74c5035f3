#!/usr/bin/env bash
# Issue 13, HA ownership on three booted nodes (n1, n2, n3, each in
# cgroups of its own, sharing the host's network and kernel clock) and a
# real etcd on the host, each node reaching it through a relay of its own.
# db is `ha = true, nodes = ["n1", "n2", "n3"]` on every node:
# - the first candidate takes it (create-if-absent, on its lease) and
#   starts it; nobody else runs it;
# - a restart of every daemon, and a SIGKILL of the owner's daemon, move
#   nothing;
# - the owner's daemon stopped: the fence timer its ExecStopPost= armed
#   stops db with no berth process left; a peer starts db only after the
#   owner's key expired and the stop bound ran out;
# - a partition of the owner: it fences at its deadline; a peer starts db
#   only after the owner's key expired and the stop bound ran out; when
#   the partition heals the old owner leaves db alone;
# - the owner's power-off: its drain stops db, releases the key with a
#   stop bound of zero, and the next candidate starts db at once (well
#   inside a TTL);
# - the whole root of the owner killed: the last node takes db only after
#   the lease expired and the stop bound in the key ran out;
# - etcd down for everyone: the owner fences, and starts db again once
#   etcd is back and its key is confirmed; nothing moves.
# Every start and stop of db is timestamped by the workload (one kernel
# clock), so "never both running" is read off the logs of all nodes.
source "$(dirname "$0")/../lib.sh"
scenario_begin 28-cluster-ha
source "$(dirname "$0")/../etcd.sh"

TTL=5
STOP_DELAY=3
# No ExecStop=, TimeoutStopSec= is stop_delay_s + 30: (0 + 1) * 33 + 5.
BOUND=38
etcd_start
config_for() {
    local dir=$HARNESS_DIR/config-28-$1
    rm -rf "$dir"
    mkdir -p "$dir/workloads"
    cat >"$dir/berth.toml" <<EOF
[cluster]
node = "$1"
endpoints = ["http://127.0.0.1:${RELAY_PORT[$1]}"]
lease_ttl_s = $TTL
EOF
    printf 'exec = ["/opt/berth-test/workload", "db"]\nha = true\nnodes = ["n1", "n2", "n3"]\nstop_delay_s = %s\n' \
        "$STOP_DELAY" >"$dir/workloads/db.toml"
    echo "$dir"
}
for n in n1 n2 n3; do
    relay_start "$n"
    node_boot "$n" "$(config_for "$n")"
done

owner_field() {
    etcdctl get /berth/owners/db --print-value-only \
        | python3 -c 'import json, sys; t = sys.stdin.read().strip(); print(json.loads(t)[sys.argv[1]] if t else "")' "$1"
}
owner() { owner_field node; }
# running_on: the nodes (among those given, default all three) where db is active.
running_on() {
    local n out= nodes=("$@")
    [ $# -gt 0 ] || nodes=(n1 n2 n3)
    for n in "${nodes[@]}"; do
        [ "$(on "$n" systemctl is-active berth@db.service 2>/dev/null)" = active ] && out="$out$n "
    done
    echo "${out% }"
}
is_running_on() { [ "$(running_on "${@:2}")" = "$1" ]; }
has_owner() { [ "$(owner)" = "$1" ]; }
db_pid() { on "$1" systemctl show -P MainPID berth@db.service; }
# ev NODE EVENT [N]: the time of the Nth-last EVENT (start, stop-end) in
# NODE's db log.
ev() { awk -v e="$2" '$1 == e { t = $2 } END { print t }' "${NODE_DIR[$1]}/out/db.log" 2>/dev/null; }
took() { on "$1" journalctl -b -u berth-daemon.service -o cat --no-pager | grep -c 'cluster: took db' || true; }

# The first candidate takes db. Nobody saw a previous owner let go, so it
# waits one stop bound from its join before it takes.
check "n1, db's first candidate, takes it" wait_for $((BOUND + 20)) has_owner n1
check_eq "... on its lease" "$(lease_of /berth/nodes/n1)" "$(lease_of /berth/owners/db)"
check_eq "... with its stop bound: (ExecStop= commands + 1) x TimeoutStopSec + 5 s" "$BOUND" "$(owner_field stop_bound_s)"
check "... and starts it" wait_for 20 is_running_on n1
check_contains "... recorded as taken (ha-take)" '"last_transition_reason": "ha-take"' \
    "$(on n1 cat /var/lib/berth/records/db.json)"
check_eq "n2 and n3 took nothing" "0 0" "$(took n2) $(took n3)"
check_eq "db runs on n1 only" n1 "$(running_on)"

# A restart of every daemon moves nothing: same key (same creation), same
# lease, the same db process, on n1 only.
revision=$(create_revision_of /berth/owners/db)
lease=$(lease_of /berth/owners/db)
pid=$(db_pid n1)
for n in n1 n2 n3; do on "$n" systemctl restart berth-daemon.service; done
sleep $((TTL + 2))
check_eq "a restart of every daemon: the owner key is the same one" "$revision $lease" \
    "$(create_revision_of /berth/owners/db) $(lease_of /berth/owners/db)"
check_eq "... the same db process on n1, and nowhere else" "$pid n1" "$(db_pid n1) $(running_on)"

# The owner's daemon SIGKILLed: systemd restarts it, it resumes its lease.
on n1 systemctl kill -s KILL berth-daemon.service
sleep $((TTL + 2))
check_eq "n1's daemon SIGKILLed and restarted: the owner key is the same one" "$revision $lease" \
    "$(create_revision_of /berth/owners/db) $(lease_of /berth/owners/db)"
check_eq "... the same db process on n1, and nowhere else" "$pid n1" "$(db_pid n1) $(running_on)"

# n1's daemon stopped: no berth process is left on n1, yet its
# ExecStopPost= (berth fence-arm) armed berth-fence.timer at the lease
# deadline it last saw; the timer's `berth fence` stops db, recorded as
# the fence's. n1's lease expires; n2 waits the stop bound from the
# deletion and starts db, after n1's stop by both nodes' timestamps.
on n1 systemctl stop berth-daemon.service
check_contains "n1's daemon stopped: its ExecStopPost armed the fence timer" "berth-fence.timer armed" \
    "$(on n1 journalctl -b -u berth-daemon.service -o cat --no-pager)"
check "... which stops db with no berth process left" wait_for $((TTL + STOP_DELAY + 5)) sh -c \
    "! nsenter -t ${NODE_PID[n1]} -a systemctl -q is-active berth@db.service"
check "... recorded as the fence's stop" wait_for 10 grep -q '"last_transition_reason": "fence"' \
    "${NODE_DIR[n1]}/state/records/db.json"
check "n2 takes db after n1's lease and the stop bound" wait_for $((TTL + BOUND + 20)) is_running_on n2
n1_stopped=$(ev n1 stop-end)
n2_started=$(ev n2 start)
check "... n1 had stopped db before n2 started it ($n1_stopped < $n2_started)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped < $n2_started))"
on n1 systemctl start berth-daemon.service
check "n1's daemon back: it joins with a new lease and leaves db stopped (its key is gone)" wait_for 20 sh -c \
    "nsenter -t ${NODE_PID[n1]} -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -q 'db stays stopped'"
check_eq "... db runs on n2 only, owned by n2" "n2 n2" "$(running_on) $(owner)"

# A partition of the owner, n2 (its relay stopped: its calls hang,
# nothing fails). n2 fences at its deadline (TTL - margin after the last
# acknowledged keep-alive); its key expires with its lease; n1, db's
# first candidate and up again, waits the stop bound from the deletion
# and starts db: after n2's stop, by both nodes' timestamps.
cut=$(date +%s.%N)
kill -STOP "${RELAY_PID[n2]}"
check "n2 cut off from etcd: it fences db" wait_for $((TTL + STOP_DELAY + 5)) sh -c \
    "! nsenter -t ${NODE_PID[n2]} -a systemctl -q is-active berth@db.service"
check "... recorded as the fence's stop" wait_for 10 grep -q '"last_transition_reason": "fence"' \
    "${NODE_DIR[n2]}/state/records/db.json"
check "n1 takes db after n2's lease and the stop bound" wait_for $((TTL + BOUND + 20)) is_running_on n1
fenced_at=$(ev n2 stop-begin)
n2_stopped=$(ev n2 stop-end)
n1_started=$(ev n1 start)
check "... n2 began its fence within TTL - margin + 1 s of the cut ($(python3 -c "print(round($fenced_at - $cut, 2))") s)" \
    python3 -c "import sys; sys.exit(not (0 < $fenced_at - $cut <= $TTL - 2 + 1))"
check "... n2 had stopped db before n1 started it ($n2_stopped < $n1_started)" \
    python3 -c "import sys; sys.exit(not (0 < $n2_stopped < $n1_started))"
kill -CONT "${RELAY_PID[n2]}"
check "the partition heals: n2 joins again with a new lease" wait_for 30 sh -c \
    "nsenter -t ${NODE_PID[n2]} -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -q 'joining again'"
check "... and leaves db stopped: its key is no longer on n2's lease" wait_for 20 sh -c \
    "nsenter -t ${NODE_PID[n2]} -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -q 'db stays stopped'"
sleep 2
check_eq "... db runs on n1 only, owned by n1" "n1 n1" "$(running_on) $(owner)"

# The owner (n1) powers off: its drain stops db, releases the key at once,
# and the next qualifying candidate (n2) starts db, well before n1's
# lease (5 s) would have expired.
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

# The whole root of n2 killed (its PID 1, SIGKILL): nobody releases
# anything. n3 takes db after n2's lease expired and the stop bound ran
# out: no earlier than the bound after the kill.
killed=$(date +%s.%N)
kill -9 "${NODE_PID[n2]}"
node_use n2
ct_wait_exit 30
check "n2 killed: n3 takes db" wait_for $((TTL + BOUND + 20)) is_running_on n3 n3
check_eq "... and owns it" n3 "$(owner)"
n3_started=$(ev n3 start)
after=$(python3 -c "print(round($n3_started - $killed, 2))")
check "... no earlier than the stop bound after the kill ($after s >= $BOUND s)" \
    python3 -c "import sys; sys.exit(not ($after >= $BOUND))"
check "... and no later than the TTL, the bound and 10 s ($after s <= $((TTL + BOUND + 10)) s)" \
    python3 -c "import sys; sys.exit(not ($after <= $TTL + $BOUND + 10))"
check_contains "n3 said why it waited" "the owner key of db went (last owner n2); its first qualifying candidate takes it in" \
    "$(on n3 journalctl -b -u berth-daemon.service -o cat --no-pager)"

# etcd down for the whole cluster: the owner fences; when etcd is back
# (its leader restores every lease with a fresh TTL) the owner confirms
# its key and starts db again; nothing moves.
revision=$(create_revision_of /berth/owners/db)
etcd_stop
check "etcd down: n3 fences db" wait_for $((TTL + STOP_DELAY + 5)) sh -c "! nsenter -t ${NODE_PID[n3]} -a systemctl -q is-active berth@db.service"
sleep $TTL
etcd_start
check "etcd back: n3 starts db again" wait_for 30 is_running_on n3 n3
check_eq "... its key is the same one, still n3's" "$revision n3" "$(create_revision_of /berth/owners/db) $(owner)"
check_contains "... once the key was confirmed on its lease" "fence lifted: db's owner key is still on lease" \
    "$(on n3 journalctl -b -u berth-daemon.service -o cat --no-pager)"

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

node_use n3
ct_poweroff 60
