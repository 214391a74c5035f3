#!/usr/bin/env bash
# harness-job: class=tight minutes=1.6
# Issue 13, point 8: the limit, measured. No two nodes run one HA workload
# at once, except on a host that stalls past its lease: frozen, it cannot
# fence itself. db is `ha = true, nodes = ["n1", "n2"]`. n1 owns and runs
# it; its whole root (systemd, the daemon, db) is frozen in its cgroup for
# longer than its lease and db's stop bound; n2 takes db after those, as
# for any lost owner. When n1 is thawed, db runs on both until n1's fence
# (its deadline long passed) has stopped it: that is the stalled-host
# window, measured here from the thaw to n1's stop-end: the fence's look
# (0.1 s) plus db's stop (1 s after SIGTERM; stop delay 3 s).
# Only a watchdog outside the host (RuntimeWatchdogSec=, a hypervisor's)
# closes it.
source "$(dirname "$0")/../lib.sh"
scenario_begin 29-cluster-stall
source "$(dirname "$0")/../etcd.sh"
source "$(dirname "$0")/../ha.sh"
cg=
thaw() { [ -z "$cg" ] || [ ! -e "$cg/cgroup.freeze" ] || echo 0 >"$cg/cgroup.freeze" 2>/dev/null || true; }
trap 'rc=$?; thaw; cluster_cleanup; (exit $rc); scenario_end' EXIT

TTL=5
STOP_DELAY=3
# No ExecStop=, TimeoutStopSec= is stop_delay_s + 30: (0 + 1) * 33 + 5.
BOUND=38
etcd_start
config_for() {
    local dir=$HARNESS_DIR/config-29-$1
    cluster_config "$dir" "$1" "${RELAY_PORT[$1]}" "$TTL"
    printf 'exec = ["/opt/berth-test/workload", "db"]\nha = true\nnodes = ["n1", "n2"]\nstop_delay_s = %s\n' \
        "$STOP_DELAY" >"$dir/workloads/db.toml"
    echo "$dir"
}
HA_NODES=(n1 n2)
for n in "${HA_NODES[@]}"; do
    relay_start "$n"
    node_boot "$n" "$(config_for "$n")"
done

check "n1, db's first candidate, takes it and starts it" wait_for $((BOUND + 30)) is_running_on n1
check_eq "... db runs on n1 only" n1 "$(running_on)"

# The whole root of n1: every process of it is in this cgroup (the harness
# moved its nspawn there before it booted), on the unified hierarchy,
# whose cgroup.freeze freezes the subtree.
cg=/sys/fs/cgroup/unified/berth-harness-${NODE_NAME[n1]}
[ -e "$cg/cgroup.freeze" ] || cg=/sys/fs/cgroup/berth-harness-${NODE_NAME[n1]}
check "n1's root has a cgroup that can be frozen ($cg)" test -w "$cg/cgroup.freeze"
is_frozen() { grep -qx 'frozen 1' "$cg/cgroup.events"; }
froze=$(date +%s.%N)
echo 1 >"$cg/cgroup.freeze"
check "n1's root is frozen" wait_for 10 is_frozen
# Nothing may ask n1 now (its systemd does not answer): n2 alone is looked at.
check "n2 takes db once n1's lease expired and the stop bound ran out" \
    wait_for $((TTL + BOUND + 20)) is_running_on n2 n2
n2_started=$(ev n2 start)
check "... no earlier than the stop bound after the freeze ($(python3 -c "print(round($n2_started - $froze, 2))") s >= $BOUND s)" \
    python3 -c "import sys; sys.exit(not ($n2_started - $froze >= $BOUND))"
sleep 2
thawed=$(date +%s.%N)
echo 0 >"$cg/cgroup.freeze"
check "n1 thawed: its fence stops db" wait_for 30 db_down_on n1
n1_stopped=$(ev n1 stop-end)
window=$(python3 -c "print(round($n1_stopped - $thawed, 2))")
echo "stalled-host window: db ran on n1 and n2 for $window s after n1's thaw"
# The daemon's fence looks every 0.1 s; if systemd killed the daemon first
# (its watchdog ran out during the freeze), the fence timer its
# ExecStopPost= arms does it: a few seconds more at most.
check "... the double run lasted from the thaw to n1's stop: $window s (fence + stop, <= $((STOP_DELAY + 4)) s)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped - $thawed <= $STOP_DELAY + 4))"
check "... recorded as the fence's stop" wait_for 10 grep -q '"last_transition_reason": "fence"' \
    "${NODE_DIR[n1]}/state/records/db.json"
# Its daemon, or the one systemd started again (the watchdog ran out
# during the freeze), joins on a new lease: its old one expired.
check "n1 joins the cluster again" wait_for 40 says_more n1 'cluster: joined as n1' 1
sleep 3
check_eq "db runs on n2 only, owned by n2" "n2 n2" "$(running_on) $(owner)"
