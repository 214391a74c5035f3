#!/usr/bin/env bash
# Issue 13: how long an HA workload is down when its owner goes, over RUNS
# (20) runs of each, against the lease TTL. Two booted nodes (A, B) and a
# real etcd on the host, as in scenario 28; the workload is
# `ha = true, nodes = ["A", "B"]` with stop_delay_s = 1, so its stop bound
# is (0 ExecStop= + 1) x TimeoutStopSec (1 + 30) + 5 = 36 s.
#   drained power-off: the owner powers off; from its workload's stop (its
#     drain then releases the key, with a bound of zero) to the start on
#     the other node;
#   root kill: the owner's PID 1 is SIGKILLed; from the kill to the start
#     on the other node (floor: the lease's expiry, at most a TTL after
#     the last keep-alive, plus the stop bound).
# Each run: the owner powers off (the other takes), boots again (fresh
# state, a new host), then the new owner's root is killed (the first
# takes), and boots again. Before the runs, the first start of db on the
# new cluster (nobody ever owned it: no stop bound to wait), from A's join;
# after them, a whole-cluster power loss (both roots killed, both booted):
# the first start from the second node's join (the last owner booted
# since: no stop bound either). Needs root, systemd-nspawn, debootstrap
# and etcd, like the harness. RUNS=N for fewer runs.
source "$(dirname "$0")/../tests/harness/lib.sh"
SCENARIO=bench-cluster-takeover
RUNS=${RUNS:-20}
TTL=${TTL:-5}
BOUND=36

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
source "$(dirname "$0")/../tests/harness/etcd.sh"
trap 'nodes_cleanup; cluster_cleanup' EXIT

etcd_start
config_for() {
    local dir=$HARNESS_DIR/config-bench-takeover-$1
    cluster_config "$dir" "$1" "${RELAY_PORT[$1]}" "$TTL"
    printf 'exec = ["/opt/berth-test/workload", "db", "quick"]\nha = true\nnodes = ["A", "B"]\nstop_delay_s = 1\n' \
        >"$dir/workloads/db.toml"
    echo "$dir"
}
for n in A B; do relay_start "$n"; done
boot() { node_boot "$1" "$(config_for "$1")"; }
owner() {
    etcdctl get /berth/owners/db --print-value-only \
        | python3 -c 'import json, sys; t = sys.stdin.read().strip(); print(json.loads(t)["node"] if t else "")'
}
runs_on() { [ "$(on "$1" systemctl is-active berth@db.service 2>/dev/null)" = active ]; }
# last EVENT of NODE's workload log (seconds, wall clock: one kernel clock).
last() { awk -v e="$2" '$1 == e { t = $2 } END { print t }' "${NODE_DIR[$1]}/out/db.log" 2>/dev/null; }
other() { if [ "$1" = A ]; then echo B; else echo A; fi; }
# NODE has listed the owners since its join: its presence waits for no
# workload any more.
listed() {
    etcdctl get "/berth/nodes/$1" --print-value-only \
        | python3 -c 'import json, sys; t = sys.stdin.read().strip(); sys.exit(0 if t and not json.loads(t).get("waiting") else 1)'
}

# When NODE's presence appears (wall clock, polled every 50 ms).
joined_at() {
    local i
    for i in $(seq 1200); do
        if [ -n "$(etcdctl get "/berth/nodes/$1" --keys-only)" ]; then
            date +%s.%N
            return 0
        fi
        sleep 0.05
    done
    die "$1 did not join"
}

# A first: it takes db as soon as it joined (B, booted first, would take
# it as the only candidate up). A's join is timed in the background while
# B boots.
joined_at A >"$HARNESS_DIR/a-joined" &
poller=$!
boot A
boot B
wait "$poller"
a_joined=$(cat "$HARNESS_DIR/a-joined")
wait_for 30 runs_on A || die "A never started db; see ${NODE_DIR[A]}/journal"
first_boot=$(python3 -c "print(round($(last A start) - $a_joined, 3))")
log "bench: a new cluster's first start of db: $first_boot s after A joined"
owner_node=A
released=()
killed=()
log "bench: $RUNS runs (TTL $TTL s, stop bound $BOUND s)"
for i in $(seq "$RUNS"); do
    # Drained power-off of the owner.
    o=$owner_node
    t=$(other "$o")
    node_use "$o"
    ct_poweroff 60
    wait_for 30 runs_on "$t" || die "run $i: $t did not take db after $o's power-off"
    released+=("$(python3 -c "print($(last "$t" start) - $(last "$o" stop-end))")")
    boot "$o"
    # Its rejoin over (it heard its peer), before that peer is killed: a
    # node that boots while its peer is missing waits the rejoin grace.
    wait_for 30 on "$o" test -e /run/berthd/cluster-rejoined || die "run $i: $o did not finish its rejoin"
    # Root kill of the new owner.
    k=$(date +%s.%N)
    kill -9 "${NODE_PID[$t]}"
    node_use "$t"
    ct_wait_exit 30
    wait_for $((TTL + BOUND + 30)) runs_on "$o" || die "run $i: $o did not take db after $t's root kill"
    killed+=("$(python3 -c "print($(last "$o" start) - $k)")")
    boot "$t"
    # Its first listing done before the next power-off: a node that never
    # saw the owner key go waits a whole stop bound before it takes.
    wait_for 30 listed "$t" || die "run $i: $t did not list the owners after its boot"
    owner_node=$o
    log "bench: run $i: drained power-off ${released[-1]} s, root kill ${killed[-1]} s"
done

# A whole-cluster power loss: both roots killed at once, both booted.
for n in A B; do kill -9 "${NODE_PID[$n]}"; done
for n in A B; do node_use "$n"; ct_wait_exit 30; done
boot A
boot B
second_joined=$(python3 -c "print(max($(joined_at A), $(joined_at B)))")
owned() { [ -n "$(owner)" ]; }
wait_for 60 owned || die "nobody took db after the power loss"
wait_for 30 runs_on "$(owner)" || die "$(owner) did not start db after the power loss"
power_loss=$(python3 -c "print(round($(last "$(owner)" start) - $second_joined, 3))")
log "bench: after a whole-cluster power loss, db started $power_loss s after the second node joined"

python3 - "$TTL" "$BOUND" "${released[*]}" "${killed[*]}" "$first_boot" "$power_loss" <<'PY'
import math, statistics, sys
ttl, bound = float(sys.argv[1]), float(sys.argv[2])
def report(what, values, floor):
    xs = sorted(float(v) for v in values.split())
    p99 = xs[math.ceil(0.99 * len(xs)) - 1]
    med = statistics.median(xs)
    print(f"{what}: median {med:.2f} s, p99 {p99:.2f} s over {len(xs)} runs; "
          f"{med / ttl:.2f} x TTL ({ttl:.0f} s) at the median{floor}")
report("takeover after a drained power-off (owner's stop to the new start)", sys.argv[3], "")
report("takeover after a root kill (kill to the new start)", sys.argv[4],
       f"; floor: the lease's expiry plus the stop bound ({bound:.0f} s)")
print(f"first start on a new cluster: {float(sys.argv[5]):.2f} s after the first candidate joined "
      f"({float(sys.argv[5]) / bound:.3f} x the stop bound of {bound:.0f} s it no longer waits)")
print(f"first start after a whole-cluster power loss: {float(sys.argv[6]):.2f} s after both nodes joined "
      f"({float(sys.argv[6]) / bound:.3f} x the stop bound)")
PY
