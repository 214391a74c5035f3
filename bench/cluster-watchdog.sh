#!/usr/bin/env bash
# Issue 35: takeover after a crash of a node with a watchdog, against the
# promise (TTL + the watchdog's timeout + its 3 s margin + 2 s) and
# against today's wait without one (TTL + the stop bound, 36 s here);
# and the double-run window a paused virtual machine leaves.
# A is a QEMU guest (TCG) with an emulated i6300esb and `watchdog =
# "/dev/watchdog0"`, B a container; db is `ha = true, nodes = ["A",
# "B"]`, stop_delay_s = 1 (stop bound 36 s). Each of RUNS (3) runs: A
# owns db, its QEMU is SIGKILLed (a power cut: no fence, no drain), and
# the time from the kill to db's start on B is taken; A boots again and
# takes db back (B drains and rejoins). Then A, owning db, is paused
# (QMP stop) for twice the TTL and resumed: the window is from B's start
# of db to A's stop of it, both on the host's clock (each line of A's log
# reaches the host on a serial port and is timed as it lands).
# Needs root, systemd-nspawn, debootstrap, etcd and QEMU, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
SCENARIO=bench-cluster-watchdog
RUNS=${RUNS:-3}
TTL=${TTL:-5}
WD=${WD:-5}
BOUND=36
MARGIN=3

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
source "$(dirname "$0")/../tests/harness/etcd.sh"
source "$(dirname "$0")/../tests/harness/vm.sh"
trap 'vm_cleanup; nodes_cleanup; cluster_cleanup' EXIT

etcd_start
for n in A B; do relay_start "$n"; done
config_for() {
    local node=$1 dir=$HARNESS_DIR/config-bench-watchdog-$1
    shift
    cluster_config "$dir" "$node" "${RELAY_PORT[$node]}" "$TTL" "$@"
    printf 'exec = ["/opt/berth-test/workload", "db", "quick"]\nha = true\nnodes = ["A", "B"]\nstop_delay_s = 1\n' \
        >"$dir/workloads/db.toml"
    echo "$dir"
}
a_config=$(config_for A watchdog='"/dev/watchdog0"' watchdog_timeout_s="$WD")
sed -i 's|http://127.0.0.1:|http://10.0.2.2:|' "$a_config/berth.toml"
b_config=$(config_for B)
on() {
    if [ "$1" = A ]; then
        shift
        vm_run "$*"
    else
        ct_exec "${NODE_NAME[$1]}" "${NODE_PID[$1]}" "${@:2}"
    fi
}
owner() {
    etcdctl get /berth/owners/db --print-value-only \
        | python3 -c 'import json, sys; t = sys.stdin.read().strip(); print(json.loads(t)["node"] if t else "")'
}
runs_on() { [ "$(on "$1" systemctl is-active berth@db.service 2>/dev/null)" = active ]; }
last_b() { awk -v e="$1" '$1 == e { t = $2 } END { print t }' "${NODE_DIR[B]}/out/db.log"; }
boot_a() {
    vm_boot A "$a_config"
    NODE_DIR[A]=$VM_DIR
}

boot_a
wait_for 120 runs_on A || die "A never started db"
node_boot B "$b_config"
wait_for 60 on B test -e /run/berthd/cluster-rejoined || die "B did not finish its rejoin"
crashes=()
for i in $(seq "$RUNS"); do
    [ "$(owner)" = A ] || die "run $i: A does not own db"
    k=$(date +%s.%N)
    kill -9 "$VM_PID"
    wait "$VM_PID" 2>/dev/null || true
    wait_for $((TTL + BOUND + 30)) runs_on B || die "run $i: B did not take db after A's crash"
    crashes+=("$(python3 -c "print($(last_b start) - $k)")")
    log "bench: run $i: A's crash to db's start on B: ${crashes[-1]} s"
    vm_cleanup
    boot_a
    wait_for 60 on A test -e /run/berthd/cluster-rejoined || die "run $i: A did not finish its rejoin"
    on B berth drain >/dev/null
    wait_for 60 runs_on A || die "run $i: A did not take db back"
    on B systemctl restart berth-daemon.service
    wait_for 60 on B test -e /run/berthd/cluster-rejoined || die "run $i: B did not rejoin"
    sleep 2
done

# The pause, on the host's clock.
read -r paused resumed a_stopped < <(vm_pause $((2 * TTL)))
[ "$a_stopped" != 0 ] || die "A did not stop db within 60 s of its resume"
b_started=
wait_for $((TTL + BOUND + 30)) runs_on B && b_started=$(last_b start)
python3 - "$TTL" "$WD" "$MARGIN" "$BOUND" "${crashes[*]}" "$paused" "$resumed" "$a_stopped" "${b_started:-0}" <<'PY'
import statistics, sys
ttl, wd, margin, bound = (float(x) for x in sys.argv[1:5])
xs = sorted(float(v) for v in sys.argv[5].split())
promise = ttl + wd + margin + 2
print(f"takeover after a crash of a watchdog node (kill to the new start): median {statistics.median(xs):.2f} s, "
      f"max {max(xs):.2f} s over {len(xs)} runs; promised <= TTL + timeout + margin + 2 = {promise:.0f} s "
      f"({max(xs) / promise:.2f} x at the max); without a watchdog TTL + stop bound = {ttl + bound:.0f} s "
      f"({statistics.median(xs) / (ttl + bound):.2f} x at the median)")
paused, resumed, a_stopped, b_started = (float(x) for x in sys.argv[6:10])
print(f"a pause of {resumed - paused:.1f} s (2 x TTL): A stopped db {a_stopped - resumed:.2f} s after its resume; "
      + (f"B started it {b_started - paused:.2f} s after the pause began: "
         f"double run {max(0.0, a_stopped - b_started):.2f} s" if b_started else "B did not start it"))
PY
