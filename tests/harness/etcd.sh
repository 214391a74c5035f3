# Sourced by the cluster scenarios after lib.sh: a real etcd (Debian's
# etcd-server) on the host's loopback at free ports; the containers share
# the host's network. Per node, a relay the scenario controls
# (tests/harness/bin/relay): SIGSTOP of it is a partition of that node.
# The caller's EXIT trap runs cluster_cleanup (SCENARIO names the run).
command -v etcd >/dev/null && command -v etcdctl >/dev/null \
    || die "etcd and etcdctl are needed (make deps installs etcd-server and etcd-client)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ETCD_PORT=$(free_port)
ETCD_PEER=$(free_port)
ETCD_DIR=$HARNESS_DIR/run/etcd-$SCENARIO
rm -rf "$ETCD_DIR"
mkdir -p "$ETCD_DIR"
ETCD_PID=
etcd_start() {
    etcd --name h --data-dir "$ETCD_DIR/data" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
        --initial-cluster "h=http://127.0.0.1:$ETCD_PEER" >>"$ETCD_DIR/etcd.log" 2>&1 &
    ETCD_PID=$!
    wait_for 20 etcdctl endpoint health || die "etcd did not come up; see $ETCD_DIR/etcd.log"
}
etcd_stop() { kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; }
etcdctl() { ETCDCTL_API=3 command etcdctl --endpoints="http://127.0.0.1:$ETCD_PORT" "$@"; }
# lease_of KEY: the lease (decimal) a key is bound to; empty when absent.
lease_of() {
    etcdctl get "$1" -w json | python3 -c 'import json, sys; kvs = json.load(sys.stdin).get("kvs", []); print(kvs[0].get("lease", 0) if kvs else "")'
}
# create_revision_of KEY: when the key was created; empty when absent.
create_revision_of() {
    etcdctl get "$1" -w json | python3 -c 'import json, sys; kvs = json.load(sys.stdin).get("kvs", []); print(kvs[0].get("create_revision", 0) if kvs else "")'
}

# relay_start NODE: a relay to etcd for NODE; its port in RELAY_PORT[NODE].
declare -A RELAY_PORT=() RELAY_PID=()
relay_start() {
    local port=${RELAY_PORT[$1]:-$(free_port)}
    "$REPO/tests/harness/bin/relay" "$port" "$ETCD_PORT" >>"$ETCD_DIR/relay-$1.log" 2>&1 &
    RELAY_PID[$1]=$!
    RELAY_PORT[$1]=$port
}
relays_stop() {
    local n
    for n in "${!RELAY_PID[@]}"; do
        kill -CONT "${RELAY_PID[$n]}" 2>/dev/null || true
        kill "${RELAY_PID[$n]}" 2>/dev/null || true
    done
}
cluster_cleanup() { relays_stop; etcd_stop; }

# cluster_config DIR NODE PORT TTL [KEY=VALUE...]: DIR made afresh, with an
# empty workloads/ and a berth.toml of only a [cluster] section: NODE, its
# etcd at 127.0.0.1:PORT (the node's relay, or etcd itself), lease_ttl_s
# TTL, and each further KEY = VALUE as given (TOML: quote strings).
cluster_config() {
    local dir=$1 node=$2 port=$3 ttl=$4 setting
    shift 4
    rm -rf "$dir"
    mkdir -p "$dir/workloads"
    {
        printf '[cluster]\nnode = "%s"\nendpoints = ["http://127.0.0.1:%s"]\nlease_ttl_s = %s\n' "$node" "$port" "$ttl"
        for setting in "$@"; do printf '%s = %s\n' "${setting%%=*}" "${setting#*=}"; done
    } >"$dir/berth.toml"
}
