#!/usr/bin/env bash
# Issue 15, scale: NODES (50) simulated nodes × WORKLOADS (20) HA workloads
# on one real etcd (Debian's etcd-server). Each node is a process of
# examples/cluster_sim.rs: berth's own configuration, join, keep-alive and
# ownership loop, with a service manager that only records starts; every
# node has every workload, each workload's candidates being all nodes in
# an order of its own. Printed:
# - decisions: over ROUNDS (40) power-offs of an owner (SIGTERM: it
#   releases its keys as the drain does), from the deletion of the owner
#   key (its revision, and when a watch on this host received the event)
#   to the start on the new owner: p50, p99, max (target: p99 <= 2 s);
#   then over CRASHES (10) crashes of an owner (SIGKILL: its keys go when
#   its lease expires), the same less the stop bound the takers must wait
#   by design (the simulation's units stop within 2 s);
# - idle: etcd writes (puts, deletes, transactions), lease keep-alives and
#   every other request (unary calls, reads included) per node per second
#   over IDLE_S (30) s with nothing happening (target: keep-alives only,
#   TTL/5 of a second apart per node; at most one other request per node
#   per second: the reconciliation asks systemd, not etcd);
# - a failed start: every node's first start of each workload fails at
#   the first boot; from that failure to the reconciliation's next start
#   of it (target: the reconcile period plus the start time);
# - etcd's CPU time and peak RSS over the whole run.
# Needs etcd, etcdctl, curl and python3; no root.
set -euo pipefail
NODES=${NODES:-50}
WORKLOADS=${WORKLOADS:-20}
ROUNDS=${ROUNDS:-40}
CRASHES=${CRASHES:-10}
# examples/cluster_sim.rs: STOP_BOUND_S.
SIM_STOP_BOUND_S=2
IDLE_S=${IDLE_S:-30}
TTL=${TTL:-5}
repo=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '%s\n' "$*" >&2; }
die() { log "bench: $*"; exit 1; }
for tool in etcd etcdctl curl python3; do
    command -v "$tool" >/dev/null || die "$tool is needed (make deps installs etcd-server and etcd-client)"
done
(cd "$repo" && cargo build --release --locked --quiet --example cluster_sim)
sim=$repo/target/release/examples/cluster_sim
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
peer=$(free_port)
url=http://127.0.0.1:$port
declare -A pid=()
etcd_pid=
watch_pid=
cleanup() {
    local p
    for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -z "$watch_pid" ] || kill "$watch_pid" 2>/dev/null || true
    # The watch's etcdctl (the pipeline's first process, not $!) retries
    # forever once etcd is gone: the wait below would never end.
    pkill -f -- "--endpoints=$url watch" 2>/dev/null || true
    [ -z "$etcd_pid" ] || kill "$etcd_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "${KEEP_WORK:-}" ] && log "bench: kept $work" || rm -rf "$work"
}
trap cleanup EXIT
ctl() { ETCDCTL_API=3 etcdctl --endpoints="$url" "$@"; }

etcd --name scale --data-dir "$work/etcd" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "scale=http://127.0.0.1:$peer" >"$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
ctl endpoint health >/dev/null 2>&1 || die "etcd did not come up; see $work/etcd.log"
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$etcd_pid/stat"; }
ticks0=$(cpu_ticks)
t0=$(date +%s.%N)

# boot NODE [UNTIL]: with UNTIL (Unix time), each workload's first start
# on NODE before then fails.
boot() {
    env ${2:+SIM_FAIL_FIRST_START_UNTIL=$2} "$sim" "$work/$1" "$1" "$NODES" "$WORKLOADS" "$url" "$TTL" \
        >>"$work/$1.out" 2>>"$work/$1.err" &
    pid[$1]=$!
}
# At the first boot every workload's first start fails (the simulated
# start job): the reconciliation starts it again.
fail_until=$(( $(date +%s) + 15 ))
for i in $(seq "$NODES"); do boot "n$i" "$fail_until"; done
owned() { [ "$(ctl get --prefix /berth/owners/ --keys-only | grep -c .)" -eq "$WORKLOADS" ]; }
for _ in $(seq 300); do owned && break; sleep 0.2; done
owned || die "not every workload was taken within 60 s; see $work/*.err"
log "bench: $NODES nodes joined, $WORKLOADS workloads owned"

# Idle: what etcd is asked when nothing happens.
metric() { curl -s "$url/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" { s += $2 } END { print s + 0 }'; }
counters() {
    echo "$(metric etcd_mvcc_put_total) $(metric etcd_mvcc_delete_total) $(metric etcd_mvcc_txn_total) \
$(curl -s "$url/metrics" | awk '/^grpc_server_msg_received_total/ && /LeaseKeepAlive/ { s += $2 } END { print s + 0 }') \
$(curl -s "$url/metrics" | awk '/^grpc_server_started_total/ && /grpc_type="unary"/ { s += $2 } END { print s + 0 }')"
}
# No start fails any more from here on.
while [ "$(date +%s)" -le "$fail_until" ]; do sleep 0.5; done
sleep 5
before=$(counters)
sleep "$IDLE_S"
after=$(counters)

# Decisions: the owner of one workload after another powers off.
ctl watch --prefix /berth/owners/ -w json | python3 -u -c '
import sys, time
for line in sys.stdin:
    print("%.6f %s" % (time.time(), line.strip()), flush=True)
' >"$work/watch.log" &
watch_pid=$!
sleep 1
owner_of() { ctl get "/berth/owners/$1" --print-value-only | python3 -c 'import json, sys; t = sys.stdin.read().strip(); print(json.loads(t)["node"] if t else "")'; }
for r in $(seq "$ROUNDS"); do
    w=w$(( (r - 1) % WORKLOADS + 1 ))
    o=$(owner_of "$w")
    [ -n "$o" ] || die "round $r: $w has no owner"
    kill -TERM "${pid[$o]}"
    wait "${pid[$o]}" 2>/dev/null || true
    moved() { local n; n=$(owner_of "$w"); [ -n "$n" ] && [ "$n" != "$o" ]; }
    for _ in $(seq 100); do moved && break; sleep 0.1; done
    moved || die "round $r: $w did not move from $o within 10 s; see $work/*.err"
    boot "$o"
    sleep 1
done
sleep 1
# Crashes: nobody releases; the key goes with the lease, TTL after the
# last keep-alive, and the next candidate starts the stop bound later.
crash_from=$(date +%s.%N)
for r in $(seq "$CRASHES"); do
    w=w$(( (r * 7) % WORKLOADS + 1 ))
    o=$(owner_of "$w")
    [ -n "$o" ] || die "crash $r: $w has no owner"
    kill -KILL "${pid[$o]}"
    wait "${pid[$o]}" 2>/dev/null || true
    moved() { local n; n=$(owner_of "$w"); [ -n "$n" ] && [ "$n" != "$o" ]; }
    for _ in $(seq $(( (TTL + SIM_STOP_BOUND_S + 10) * 10 ))); do moved && break; sleep 0.1; done
    moved || die "crash $r: $w did not move from $o; see $work/*.err"
    # Its other keys expire with it: let their takers start too.
    sleep $((SIM_STOP_BOUND_S + 1))
    boot "$o"
    sleep 1
done
sleep 1
t1=$(date +%s.%N)
ticks1=$(cpu_ticks)
hwm_kb=$(awk '/^VmHWM/ { print $2 }' "/proc/$etcd_pid/status")
hz=$(getconf CLK_TCK)

python3 - "$work" "$NODES" "$IDLE_S" "$TTL" "$before" "$after" "$ticks0" "$ticks1" "$hz" "$t0" "$t1" "$hwm_kb" "$ROUNDS" \
    "$crash_from" "$CRASHES" "$SIM_STOP_BOUND_S" <<'PY'
import base64, glob, json, sys
work, nodes, idle_s, ttl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
before = [float(x) for x in sys.argv[5].split()]
after = [float(x) for x in sys.argv[6].split()]
ticks0, ticks1, hz = float(sys.argv[7]), float(sys.argv[8]), float(sys.argv[9])
t0, t1, hwm_kb, rounds = float(sys.argv[10]), float(sys.argv[11]), int(sys.argv[12]), int(sys.argv[13])
crash_from, crashes, bound = float(sys.argv[14]), int(sys.argv[15]), float(sys.argv[16])

# Deletions as the host's watch received them: (arrival, workload, revision).
deletions = []
for line in open(f"{work}/watch.log"):
    at, _, text = line.partition(" ")
    try:
        doc = json.loads(text)
    except ValueError:
        continue
    for ev in doc.get("Events") or []:
        if ev.get("type") in (1, "DELETE"):
            key = base64.b64decode(ev["kv"]["key"]).decode()
            deletions.append((float(at), key.rsplit("/", 1)[1], doc["Header"]["revision"]))
starts = []
for path in glob.glob(f"{work}/n*.out"):
    for line in open(path):
        parts = line.split()
        if len(parts) == 3 and parts[0] == "start":
            starts.append((float(parts[2]), parts[1]))
starts.sort()
lat, crash_lat = [], []
for at, w, rev in deletions:
    nxt = next((t for t, sw in starts if sw == w and t > at - 1.0), None)
    if nxt is None:
        continue
    if at < crash_from:
        lat.append(max(nxt - at, 0.0))
    else:
        crash_lat.append(max(nxt - at - bound, 0.0))
lat.sort()
crash_lat.sort()
# A failed first start, to the next start of that workload on that node.
recovered = []
for path in glob.glob(f"{work}/n*.out"):
    failed, started = {}, {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 3 and parts[0] == "start-failed":
            failed.setdefault(parts[1], float(parts[2]))
        elif len(parts) == 3 and parts[0] == "start" and parts[1] in failed:
            started.setdefault(parts[1], float(parts[2]))
    recovered += [started[w] - t for w, t in failed.items() if w in started]
recovered.sort()
if len(lat) < rounds:
    sys.exit(f"bench: {len(lat)} decisions measured, {rounds} rounds run")
if len(crash_lat) < crashes:
    sys.exit(f"bench: {len(crash_lat)} decisions after crashes measured, {crashes} crashes run")
pct = lambda lat, p: lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))]
print(f"cluster scale: {nodes} nodes x {len(set(w for _, w, _ in deletions))} workloads moved, TTL {ttl:g} s, one etcd")
print(f"  decisions (owner key deleted -> new owner's start), {len(lat)} takeovers after a power-off: "
      f"p50 {pct(lat, 50):.3f} s, p99 {pct(lat, 99):.3f} s, max {lat[-1]:.3f} s (target p99 <= 2 s)")
print(f"  after a crash (key expired with the lease), {len(crash_lat)} takeovers, less the stop bound of "
      f"{bound:g} s: p50 {pct(crash_lat, 50):.3f} s, p99 {pct(crash_lat, 99):.3f} s, max {crash_lat[-1]:.3f} s")
if recovered:
    print(f"  a failed start of an owned workload, started again by the reconciliation, {len(recovered)} times: "
          f"p50 {pct(recovered, 50):.3f} s, p99 {pct(recovered, 99):.3f} s, max {recovered[-1]:.3f} s "
          f"(target: the reconcile period, 2 s, plus the start time)")
d = [a - b for a, b in zip(after, before)]
per = lambda x: x / nodes / idle_s
print(f"  idle {idle_s:g} s: per node per second: {per(d[0]):.4f} puts, {per(d[1]):.4f} deletes, "
      f"{per(d[2]):.4f} transactions, {per(d[3]):.3f} lease keep-alives "
      f"(one every {1 / per(d[3]) if d[3] else float('inf'):.2f} s; TTL/5 = {ttl / 5:g} s)")
print(f"  idle: requests beyond the keep-alives (every unary call: reads, writes, transactions): "
      f"{per(d[4]):.4f} per node per second (target <= 1)")
cpu = (ticks1 - ticks0) / hz
print(f"  etcd: {cpu:.2f} s CPU over {t1 - t0:.1f} s ({100 * cpu / (t1 - t0):.1f} % of a core), peak RSS {hwm_kb / 1024:.1f} MiB")
PY
