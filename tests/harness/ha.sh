# Helpers for the cluster scenarios' HA workload, db: where it runs, who
# owns it, what its log and the daemons' journals say. Sourced after
# lib.sh and etcd.sh; the scenario sets HA_NODES (its nodes, in order).
# shellcheck shell=bash

owner_field() {
    etcdctl get /berth/owners/db --print-value-only \
        | python3 -c 'import json, sys; t = sys.stdin.read().strip(); print(json.loads(t)[sys.argv[1]] if t else "")' "$1"
}
owner() { owner_field node; }
# running_on: the nodes (among those given, default HA_NODES) where db is active.
running_on() {
    local n out= nodes=("$@")
    [ $# -gt 0 ] || nodes=("${HA_NODES[@]}")
    for n in "${nodes[@]}"; do
        [ "$(on "$n" systemctl is-active berth@db.service 2>/dev/null)" = active ] && out="$out$n "
    done
    echo "${out% }"
}
is_running_on() { [ "$(running_on "${@:2}")" = "$1" ]; }
has_owner() { [ "$(owner)" = "$1" ]; }
db_pid() { on "$1" systemctl show -P MainPID berth@db.service; }
# ev NODE EVENT: the time of the last EVENT (start, stop-begin, stop-end) in
# NODE's db log.
ev() { awk -v e="$2" '$1 == e { t = $2 } END { print t }' "${NODE_DIR[$1]}/out/db.log" 2>/dev/null; }
# daemon_log NODE: its daemon's journal of this boot (fails when unreadable).
daemon_log() { on "$1" journalctl -b -u berth-daemon.service -o cat --no-pager; }
# count_in NODE TEXT: lines of NODE's daemon log with TEXT; "unreadable" when
# the journal cannot be read (so that a comparison fails, not passes).
count_in() {
    local log
    log=$(daemon_log "$1") || { echo unreadable; return; }
    grep -cF -- "$2" <<<"$log" || true
}
took() { count_in "$1" 'cluster: took db'; }
# db_down_on NODE: db's unit is inactive or failed there (not merely "not
# known to be active": a failed nsenter must not pass).
db_down_on() {
    case "$(on "$1" systemctl is-active berth@db.service 2>/dev/null)" in
        inactive | failed) return 0 ;;
    esac
    return 1
}
# says_more NODE TEXT BEFORE: NODE's daemon log has more lines with TEXT.
says_more() { local n; n=$(count_in "$1" "$2"); [ "$n" != unreadable ] && [ "$n" -gt "$3" ]; }

# ha_boot SCENARIO: three nodes, n1 n2 n3, each behind a relay of its own,
# booted with db (`ha = true` on the three, in that order, stop_delay_s
# STOP_DELAY) and the scenario's TTL and maintenance GRACE; with
# HA_SLOW_ON_N3=1, n3 also runs slow (order 10: drained before db, its
# stop takes 8 s).
ha_boot() {
    local n dir
    HA_NODES=(n1 n2 n3)
    for n in "${HA_NODES[@]}"; do
        relay_start "$n"
        dir=$HARNESS_DIR/config-$1-$n
        cluster_config "$dir" "$n" "${RELAY_PORT[$n]}" "$TTL" maintenance_grace_period_s="$GRACE"
        printf 'exec = ["/opt/berth-test/workload", "db"]\nha = true\nnodes = ["n1", "n2", "n3"]\nstop_delay_s = %s\n' \
            "$STOP_DELAY" >"$dir/workloads/db.toml"
        [ "$n" != n3 ] || [ "${HA_SLOW_ON_N3:-0}" != 1 ] ||
            printf 'exec = ["/opt/berth-test/workload", "slow", "slow"]\norder = 10\n' >"$dir/workloads/slow.toml"
        node_boot "$n" "$dir"
    done
}
