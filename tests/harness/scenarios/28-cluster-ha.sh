#!/usr/bin/env bash
# harness-job: class=tight minutes=3
# Issue 13, HA ownership on three booted nodes (n1, n2, n3, each in
# cgroups of its own, sharing the host's network and kernel clock) and a
# real etcd on the host, each node reaching it through a relay of its own,
# while every node stays up (scenario 31: when nodes or etcd go away).
# db is `ha = true, nodes = ["n1", "n2", "n3"]` on every node:
# - the first candidate takes it (create-if-absent, on its lease) and
#   starts it; nobody else runs it; status, list, /v1/cluster and
#   /metrics show it;
# - a restart of every daemon (keys handed to a maintenance lease and
#   back), a SIGKILL of the owner's daemon, and a stop of it shorter than
#   maintenance_grace_period_s move nothing;
# - the owner's daemon stopped past the grace: the fence timer its
#   ExecStopPost= armed stops db with no berth process left; a peer starts
#   db only after the maintenance lease expired and the stop bound ran out;
# - a partition of the owner: it fences at its deadline; a peer starts db
#   only after the owner's key expired and the stop bound ran out; when
#   the partition heals the old owner leaves db alone; each daemon's
#   /metrics counts its takes and fences (promtool checks the text).
# Every start and stop of db is timestamped by the workload (one kernel
# clock), so the order of a stop and a start is read off the logs.
source "$(dirname "$0")/../lib.sh"
scenario_begin 28-cluster-ha
source "$(dirname "$0")/../etcd.sh"
source "$(dirname "$0")/../ha.sh"
trap 'rc=$?; cluster_cleanup; (exit $rc); scenario_end' EXIT

TTL=5
GRACE=15
STOP_DELAY=3
# No ExecStop=, TimeoutStopSec= is stop_delay_s + 30: (0 + 1) * 33 + 5.
BOUND=38
etcd_start
ha_boot 28

# The first candidate takes db. Nobody ever owned it (no last-owner/db):
# no stop bound to wait, it is taken as soon as n1 joined.
booted_at=$(date +%s.%N)
check "n1, db's first candidate, takes it, well within its stop bound of $BOUND s" wait_for 15 has_owner n1
log "  measured: db owned $(python3 -c "import time; print(round(time.time() - $booted_at, 2))") s after ha_boot returned"
check_eq "... on its lease" "$(lease_of /berth/nodes/n1)" "$(lease_of /berth/owners/db)"
check_eq "... with its stop bound: (ExecStop= commands + 1) x TimeoutStopSec + 5 s" "$BOUND" "$(owner_field stop_bound_s)"
check "... and starts it" wait_for 20 is_running_on n1
check_contains "... recorded as taken (ha-take)" '"last_transition_reason": "ha-take"' \
    "$(on n1 cat /var/lib/berth/records/db.json)"
check_eq "n2 and n3 took nothing" "0 0" "$(took n2) $(took n3)"
check_eq "db runs on n1 only" n1 "$(running_on)"

# What the nodes show of it: berth status, berth list, /v1/cluster.
status=$(on n2 berth status)
check_contains "berth status on n2 shows n1 as db's owner" "owner of db: n1 (lease $(lease_of /berth/nodes/n1 | xargs printf '%x'), stop bound $BOUND s" "$status"
check_contains "... n1 up, with its lease's age" "node n1: up, lease $(lease_of /berth/nodes/n1 | xargs printf '%x') renewed" "$status"
check_contains "... and n2's own fence deadline ahead" "fence deadline: in " "$status"
check "berth list on n3 has an OWNER column with n1 for db" \
    bash -c '[[ $(nsenter -t "$1" -a berth list | grep "^db ") =~ \ n1$ ]]' _ "${NODE_PID[n3]}"
api() { curl -s --max-time 5 --unix-socket "/proc/${NODE_PID[$1]}/root/run/berthd/api.sock" "http://berth$2"; }
# cluster_view EXPR: a Python expression on the view (v) that must hold.
cluster_view() {
    api n3 /v1/cluster | python3 -c 'import json, sys; v = json.load(sys.stdin); sys.exit(not eval(sys.argv[1]))' "$1"
}
check "/v1/cluster on n3 shows db owned by n1 (gathered again once read)" \
    wait_for 10 cluster_view '[(o["workload"], o["node"]) for o in v["owners"]] == [("db", "n1")]'
# db is taken at once on a new cluster (nobody ever owned it): n3 may
# join a little later.
check "... and the three peers up, each with its lease's age" \
    wait_for 10 cluster_view '[(p["node"], p["state"], p["lease_age_s"] is not None) for p in v["peers"]] == [("n1", "up", True), ("n2", "up", True), ("n3", "up", True)]'
# has_sample NODE LINE: NODE's /metrics has exactly this sample line
# (read whole first: grep -q would close the pipe on curl, which pipefail
# counts as a failure).
has_sample() { grep -Fxq -- "$2" <<<"$(api "$1" /metrics)"; }
check "/metrics on n1 counts its take" has_sample n1 'berth_cluster_takeovers_total 1'
check "... says it is joined, with its fence deadline ahead" \
    bash -c 'grep -Fxq "berth_cluster_joined 1" <<<"$1" && grep -Eq "^berth_cluster_fence_deadline_seconds [0-9]" <<<"$1"' _ "$(api n1 /metrics)"
check "... and its own node key up (the view gathered again once read)" \
    wait_for 10 has_sample n1 'berth_cluster_node_state{state="up"} 1'
check "/metrics on n3: db owned by n1, as n3 saw it" wait_for 10 has_sample n3 'berth_cluster_ha_owner{workload="db",node="n1"} 1'
check_eq "... and n3 took nothing" 'berth_cluster_takeovers_total 0' "$(api n3 /metrics | grep '^berth_cluster_takeovers_total')"

# A restart of every daemon moves nothing: each hands its keys to a
# maintenance lease on the way out and takes them back at its join. The
# same key (same creation), now on n1's new live lease; the same db
# process on n1 only.
revision=$(create_revision_of /berth/owners/db)
pid=$(db_pid n1)
for n in n1 n2 n3; do on "$n" systemctl restart berth-daemon.service; done
sleep $((TTL + 2))
check_contains "a restart of every daemon: n1's keys went to a maintenance lease" "cluster: maintenance: 1 owner keys moved to lease" \
    "$(on n1 journalctl -b -u berth-daemon.service -o cat --no-pager)"
check_contains "... and came back at its join" "1 owner keys taken back from maintenance" \
    "$(on n1 journalctl -b -u berth-daemon.service -o cat --no-pager)"
check_eq "... the owner key is the same one, on n1's live lease" "$revision $(lease_of /berth/nodes/n1)" \
    "$(create_revision_of /berth/owners/db) $(lease_of /berth/owners/db)"
check_eq "... the same db process on n1, and nowhere else" "$pid n1" "$(db_pid n1) $(running_on)"

# The owner's daemon SIGKILLed: no hand-over; systemd restarts it and it
# resumes its lease before the deadline (its ExecStopPost armed the fence
# timer; the daemon back disarmed it).
lease=$(lease_of /berth/owners/db)
on n1 systemctl kill -s KILL berth-daemon.service
sleep $((TTL + 2))
check_eq "n1's daemon SIGKILLed and restarted: the owner key is the same one, on the same lease" "$revision $lease" \
    "$(create_revision_of /berth/owners/db) $(lease_of /berth/owners/db)"
check_eq "... the same db process on n1, and nowhere else" "$pid n1" "$(db_pid n1) $(running_on)"
# How long before its fence deadline the daemon was back (2 to 3 s after
# the kill at TTL 5, RestartSec=1 included): the figure to read when the
# check above fails on a slow machine.
back_ms=$(on n1 journalctl -b -u berth-daemon.service -o short-monotonic --no-pager | python3 -c '
import re, sys
deadline = back = None
for line in sys.stdin:
    m = re.match(r"\[\s*([0-9.]+)\]", line)
    if not m:
        continue
    t = float(m.group(1))
    armed = re.search(r"stop in (\d+) ms unless", line)
    if armed:
        deadline, back = t + int(armed.group(1)) / 1000, None
    elif "disarmed berth-fence.timer" in line and deadline is not None:
        back = t
print("%d ms" % ((deadline - back) * 1000) if back is not None else "(not found)")') ||
    back_ms="(journal unreadable)"
log "  measured: n1's daemon, SIGKILLed, disarmed its fence timer $back_ms before the deadline (negative: after it)"

# n1's daemon stopped for less than the grace (15 s): its key waits on
# the maintenance lease, n1 is in maintenance; nothing moves, nothing
# stops; back, it takes the key onto its live lease.
on n1 systemctl stop berth-daemon.service
check_contains "n1's daemon stopped: n1 is in maintenance" '"state":"maintenance"' \
    "$(etcdctl get /berth/nodes/n1 --print-value-only)"
check "... as n3's /metrics says" \
    wait_for 10 has_sample n3 'berth_cluster_peer_state{node="n1",state="maintenance",member="true"} 1'
maintenance_lease=$(lease_of /berth/owners/db)
check "... its key is on the maintenance lease ($maintenance_lease, not $lease)" \
    test -n "$maintenance_lease" -a "$maintenance_lease" != "$lease"
sleep $((TTL + 3))
check_eq "... past its live lease's TTL: db still runs on n1 only, the same process" "$pid n1" "$(db_pid n1) $(running_on)"
on n1 systemctl start berth-daemon.service
owner_lease_is_not() { [ "$(lease_of /berth/owners/db)" != "$1" ]; }
check "n1's daemon back within the grace: its key leaves the maintenance lease" wait_for 10 owner_lease_is_not "$maintenance_lease"
# The owner key may leave the maintenance lease a moment before n1's
# presence is back on the live lease: both are waited for.
owner_on_live_lease() {
    local node
    node=$(lease_of /berth/nodes/n1)
    [ -n "$node" ] && [ "$node" = "$(lease_of /berth/owners/db)" ]
}
check "... onto its live lease, the one n1's presence is on" wait_for 10 owner_on_live_lease
check_eq "... the same key, and the same db process on n1 only" \
    "$revision $pid n1" \
    "$(create_revision_of /berth/owners/db) $(db_pid n1) $(running_on)"
fence_timer_gone() { ! on n1 systemctl -q is-active berth-fence.timer; }
check "... and the fence timer its ExecStopPost armed is disarmed" wait_for 5 fence_timer_gone

# n1's daemon stopped past the grace: no berth process is left on n1, yet
# its ExecStopPost= (berth fence-arm) armed berth-fence.timer at the
# maintenance lease's deadline; the timer's `berth fence` stops db,
# recorded as the fence's. The maintenance lease expires; n2 waits the
# stop bound from the deletion and starts db, after n1's stop by both
# nodes' timestamps.
stopped_at=$(date +%s.%N)
on n1 systemctl stop berth-daemon.service
check_eq "n1's daemon stopped: its ExecStopPost armed the fence timer" active "$(on n1 systemctl is-active berth-fence.timer)"
# Its clocks: OnActiveSec= is CLOCK_MONOTONIC, which a suspend pauses;
# the OnCalendar= trigger at the same moment counts across one.
calendar=$(on n1 systemctl show -P TimersCalendar berth-fence.timer)
next_wall=$(date -d "$(on n1 systemctl show -P NextElapseUSecRealtime berth-fence.timer)" +%s 2>/dev/null || echo 0)
check "... with a wall-clock trigger too, which a suspend does not pause ($calendar)" \
    python3 -c "import sys; sys.exit('OnCalendar=' not in sys.argv[1])" "$calendar"
check "... due with the maintenance deadline ($next_wall - $stopped_at within 0..$GRACE s)" \
    python3 -c "import sys; d = $next_wall - $stopped_at; sys.exit(not (0 <= d <= $GRACE))"
check "... which stops db with no berth process left" wait_for $((GRACE + STOP_DELAY + 5)) db_down_on n1
fenced_at=$(ev n1 stop-begin)
check "... not before the grace minus the margin ($(python3 -c "print(round($fenced_at - $stopped_at, 2))") s >= $((GRACE - 2 - 1)) s)" \
    python3 -c "import sys; sys.exit(not ($fenced_at - $stopped_at >= $GRACE - 2 - 1))"
check "... recorded as the fence's stop" wait_for 10 grep -q '"last_transition_reason": "fence"' \
    "${NODE_DIR[n1]}/state/records/db.json"
check "n2 takes db after the grace and the stop bound" wait_for $((GRACE + BOUND + 20)) is_running_on n2
n1_stopped=$(ev n1 stop-end)
n2_started=$(ev n2 start)
check "... n1 had stopped db before n2 started it ($n1_stopped < $n2_started)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped < $n2_started))"
on n1 systemctl start berth-daemon.service
check "n1's daemon back: it joins with a new lease and leaves db stopped (its key is gone)" wait_for 20 says_more n1 'db stays stopped' 0
check_eq "... db runs on n2 only, owned by n2" "n2 n2" "$(running_on) $(owner)"

# A partition of the owner, n2 (its relay stopped: its calls hang,
# nothing fails). n2 fences at its deadline (TTL - margin after the last
# acknowledged keep-alive); its key expires with its lease; n1, db's
# first candidate and up again, waits the stop bound from the deletion
# and starts db: after n2's stop, by both nodes' timestamps.
cut=$(date +%s.%N)
kill -STOP "${RELAY_PID[n2]}"
check "n2 cut off from etcd: it fences db" wait_for $((TTL + STOP_DELAY + 5)) db_down_on n2
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
joins=$(count_in n2 'cluster: joined as n2')
kill -CONT "${RELAY_PID[n2]}"
check "the partition heals: n2 joins again" wait_for 30 says_more n2 'cluster: joined as n2' "$joins"
check "... and leaves db stopped: its key is no longer on n2's lease" wait_for 20 says_more n2 'db stays stopped' 0
sleep 2
check_eq "... db runs on n1 only, owned by n1" "n1 n1" "$(running_on) $(owner)"

# What each daemon counted of this (since it started: n2's before its
# take, n1's after its stop past the grace).
check "/metrics on n2 counts its fence at the deadline" \
    has_sample n2 'berth_cluster_fenced_workloads_total{cause="deadline"} 1'
check "... and its take" has_sample n2 'berth_cluster_takeovers_total 1'
check "... joined again" has_sample n2 'berth_cluster_joined 1'
check "... with db's fence in its record's transitions" \
    bash -c 'grep -Eq "^berth_workload_transitions_total\{workload=\"db\",reason=\"fence\"\} [1-9]" <<<"$1"' _ "$(api n2 /metrics)"
check "/metrics on n1 counts its take after the partition, and no fence" \
    bash -c 'grep -Fxq "berth_cluster_takeovers_total 1" <<<"$1" && grep -Fxq "berth_cluster_fenced_workloads_total{cause=\"deadline\"} 0" <<<"$1"' _ "$(api n1 /metrics)"
check "promtool finds nothing wrong with a cluster node's metrics" \
    bash -c 'promtool check metrics <<<"$1"' _ "$(api n2 /metrics)"
