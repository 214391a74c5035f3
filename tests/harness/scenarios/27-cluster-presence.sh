#!/usr/bin/env bash
# harness-job: class=tight minutes=0.7
# Issue 13, first slice: a node's presence in a real etcd (Debian's
# etcd-server on the host; the container shares the host's network). The
# daemon in cluster mode joins (node key on its lease, members/N and
# last-state/N persistent), wants the network and runs under a watchdog
# below the lease's TTL minus the fence margin; a crashed daemon resumes
# its lease; a reboot revokes the old lease and takes a new one; with etcd
# down the daemon keeps running (its agent retries, the watchdog is fed)
# and joins once etcd is back. HA workloads are not started by the boot
# autostart, and their unit starts only on their owner (berth
# owner-check, ExecCondition=); the fence's backstop stops one a second
# past the deadline when the daemon is gone and its fence timer too.
source "$(dirname "$0")/../lib.sh"
scenario_begin 27-cluster-presence

source "$(dirname "$0")/../etcd.sh"
trap 'rc=$?; cluster_cleanup; (exit $rc); scenario_end' EXIT
daemon_log() { ct journalctl -b -u berth-daemon.service -o cat --no-pager; }

etcd_start
config=$HARNESS_DIR/config-cluster
GRACE=8
cluster_config "$config" n1 "$ETCD_PORT" 5 maintenance_grace_period_s=$GRACE
printf 'exec = ["/opt/berth-test/workload", "web"]\n' >"$config/workloads/web.toml"
# n1 is not among db's candidates: its daemon never takes db here (the
# three-node scenario 28 takes and moves HA workloads); the owner keys
# below are put by hand.
printf 'exec = ["/opt/berth-test/workload", "db"]\nha = true\nnodes = ["n2", "n3"]\n' >"$config/workloads/db.toml"
# An HA workload systemd restarts on failure, keys put by hand too.
printf 'exec = ["/opt/berth-test/workload", "cache"]\nha = true\nnodes = ["n2", "n3"]\nrestart = "on-failure"\n' \
    >"$config/workloads/cache.toml"

ct_boot cluster "$config"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
check_eq "the daemon's watchdog is below the TTL (5 s) minus the margin (2 s)" 2s "$(ct_prop berth-daemon.service WatchdogUSec)"
check_contains "the daemon is ordered after network-online.target" network-online.target "$(ct_prop berth-daemon.service After)"
# Cluster mode's drop-ins open the network again: rated too.
check_exposure berth-daemon.service 5
check_exposure berth-drain.service 5
check_exposure berth-fence-watch.service 3
check "the daemon joins as n1" wait_for 20 sh -c "nsenter -t $CT_PID -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -q 'cluster: joined as n1'"
lease1=$(lease_of /berth/nodes/n1)
check "nodes/n1 is bound to a lease ($lease1)" test -n "$lease1" -a "$lease1" != 0
check_eq "members/n1 is persistent" 0 "$(lease_of /berth/members/n1)"
check_eq "last-state/n1 is persistent" 0 "$(lease_of /berth/last-state/n1)"
check_contains "the presence names the HA workload" '"db"' "$(etcdctl get /berth/nodes/n1 --print-value-only)"
check_eq "the autostart starts web" active "$(ct_prop berth@web.service ActiveState)"
check_eq "... and leaves the HA workload db to its owner" inactive "$(ct_prop berth@db.service ActiveState)"
check_contains "... saying why" "not starting berth@db.service: ha = true" \
    "$(ct journalctl -b -u berth-autostart.service -o cat --no-pager)"

# The unit's own guard: only the owner, on its live lease, starts it,
# whoever asks (here systemctl by hand).
start_db() { out=$(ct systemctl start berth@db.service 2>&1) && rc=0 || rc=$?; }
start_db
check "no owner: systemctl start berth@db is refused (rc $rc)" test "$rc" -ne 0
check_contains "... by berth owner-check, saying why" "berth owner-check: not starting db: no node owns it" \
    "$(ct journalctl -b -u berth@db.service -o cat --no-pager)"
value='{"node":"n1","stop_bound_s":65,"since":"2026-12-02T00:00:00Z"}'
etcdctl put --lease="$(printf '%x' "$lease1")" /berth/owners/db "$value" >/dev/null
start_db
check_eq "owned by n1 on its lease: it starts" "0 active" "$rc $(ct_prop berth@db.service ActiveState)"
created=$(etcdctl get /berth/owners/db -w json | python3 -c 'import json, sys; print(json.load(sys.stdin)["kvs"][0]["create_revision"])')
environ=$(ct sh -c 'tr "\0" "\n" < /proc/$(systemctl show -P MainPID berth@db.service)/environ')
check_contains "... with the fencing token in its environment (the key's creation)" \
    "BERTH_OWNER_REVISION=$created" "$environ"

# The fence's backstop, berth-fence-watch.service: the daemon wants it in
# cluster mode, and nothing the daemon does stops it. The daemon stops
# (db's key goes to a maintenance lease of the grace, 8 s); the timer its
# ExecStopPost= armed is stopped by hand, as if fence-arm had failed. A
# second past the deadline (the grace less the 2 s margin) the backstop
# stops db, recorded as the fence's.
check_eq "the fence's backstop runs beside the daemon" active "$(ct_prop berth-fence-watch.service ActiveState)"
stopped_at=$(date +%s.%N)
ct systemctl stop berth-daemon.service
check_eq "... and outlives the daemon's stop" active "$(ct_prop berth-fence-watch.service ActiveState)"
ct systemctl stop berth-fence.timer
db_stopped() { case $(ct_prop berth@db.service ActiveState) in inactive | failed) ;; *) return 1 ;; esac; }
check "with the fence timer gone, the backstop stops db" wait_for $((GRACE + 10)) db_stopped
elapsed=$(python3 -c "import time; print(round(time.time() - $stopped_at, 2))")
check "... not before the deadline and a second ($elapsed s >= $((GRACE - 2 + 1)) s)" \
    python3 -c "import sys; sys.exit(not $elapsed >= $GRACE - 2 + 1)"
check "... saying so" grep -Eq "fence-watch: the lease deadline passed [0-9]+ ms ago and db still runs here" \
    <<<"$(ct journalctl -b -u berth-fence-watch.service -o cat --no-pager)"
check_contains "... recorded as the fence's stop" '"last_transition_reason": "fence"' \
    "$(ct cat /var/lib/berth/records/db.json)"
joins() { ct journalctl -b -u berth-daemon.service -o cat --no-pager | grep -c 'cluster: joined as n1' || true; }
joined_before=$(joins)
ct systemctl start berth-daemon.service
joined_again() { [ "$(joins)" -gt "$joined_before" ]; }
check "the daemon back, it joins with a new lease" wait_for 20 joined_again
lease1=$(lease_of /berth/nodes/n1)
# db's key went with the maintenance lease, or (when the daemon came back
# first) moved back onto the live lease: the daemon says which.
decided() { daemon_log | grep -Eq "fence lifted: db's owner key|db stays stopped"; }
check "... and decides on db, fenced: started again or left stopped" wait_for 10 decided
ct systemctl stop berth@db.service

etcdctl put /berth/owners/db "${value/n1/n2}" >/dev/null
start_db
check "owned by n2: refused on n1 (rc $rc)" test "$rc" -ne 0
check_contains "... saying who owns it" "not starting db: node n2 owns it" \
    "$(ct journalctl -b -u berth@db.service -o cat --no-pager)"
etcdctl del /berth/owners/db >/dev/null

# An HA workload with restart = "on-failure": systemd restarts it on its
# owner, every start passing owner-check again; once another node owns it,
# no restart runs it here (each ends at owner-check, until the start limit
# or the reconciliation's fence ends the attempts).
etcdctl put --lease="$(printf '%x' "$lease1")" /berth/owners/cache "$value" >/dev/null
ct systemctl start berth@cache.service
check_eq "cache, owned here, runs" active "$(ct_prop berth@cache.service ActiveState)"
ct systemctl kill --signal=KILL berth@cache.service
cache_restarted() {
    [ "$(ct_prop berth@cache.service NRestarts)" = 1 ] && [ "$(ct_prop berth@cache.service SubState)" = running ]
}
check "killed on its owner, systemd restarts it" wait_for 10 cache_restarted
etcdctl put /berth/owners/cache "${value/n1/n2}" >/dev/null
ct systemctl kill --signal=KILL berth@cache.service
cache_down() { case "$(ct_prop berth@cache.service SubState)" in failed | dead) ;; *) return 1 ;; esac; }
# Down, and still down 3 s later: no restart pending.
cache_stays_down() { cache_down && sleep 3 && cache_down; }
check "owned by n2, killed again: its restarts end at owner-check, it stays down" wait_for 30 cache_stays_down
check_eq "... and never ran again: two starts in all" 2 "$(grep -c '^start ' "$CT_DIR/out/cache.log")"
check_contains "... refused by owner-check, naming the owner" "not starting cache: node n2 owns it" \
    "$(ct journalctl -b -u berth@cache.service -o cat --no-pager)"
etcdctl del /berth/owners/cache >/dev/null
ct systemctl reset-failed berth@cache.service 2>/dev/null || true

# A daemon that crashed (SIGKILL; systemd restarts it) resumes the lease
# of this boot. (A clean stop or restart hands over to a maintenance
# lease instead: scenario 28.)
ct systemctl kill -s KILL berth-daemon.service
check "the restarted daemon resumes its lease" wait_for 20 sh -c "nsenter -t $CT_PID -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -q 'resumed: same boot'"
check_eq "... the same lease" "$lease1" "$(lease_of /berth/nodes/n1)"
sleep 6
check_eq "... kept alive past its 5 s TTL" "$lease1" "$(lease_of /berth/nodes/n1)"

# etcd down: the daemon keeps running (its agent retries; the watchdog,
# 2 s, is fed) and joins when etcd is back.
joined_before=$(joins)
etcd_stop
ct systemctl restart berth-daemon.service
pid=$(ct_prop berth-daemon.service MainPID)
sleep 8
check_eq "with etcd down the daemon is not killed by its watchdog (same MainPID after 4 watchdog periods)" \
    "$pid" "$(ct_prop berth-daemon.service MainPID)"
check_contains "... and says it cannot join yet" "cannot join as n1 yet" "$(daemon_log)"
etcd_start
check "... and joins once etcd is back" wait_for 30 joined_again

# A drain by hand: from its start, owner-check refuses every HA start on
# this node (a `systemctl start` racing it cannot run a workload whose key
# the drain then releases to a peer), until the daemon joins again.
ct berth drain >/dev/null 2>&1 || true
etcdctl put --lease="$(printf '%x' "$(lease_of /berth/nodes/n1)")" /berth/owners/db "$value" >/dev/null
start_db
check "after berth drain, a start of db, owned here, is refused (rc $rc)" test "$rc" -ne 0
check_contains "... saying the node was drained" "not starting db: berth drain ran on this node in this boot" \
    "$(ct journalctl -b -u berth@db.service -o cat --no-pager)"
joined_before=$(joins)
ct systemctl restart berth-daemon.service
check "the daemon restarted, it joins again" wait_for 20 joined_again
start_db
check_eq "... and db, owned here, starts again" "0 active" "$rc $(ct_prop berth@db.service ActiveState)"
ct systemctl stop berth@db.service
etcdctl del /berth/owners/db >/dev/null

# A reboot: a new lease; the old one is gone (revoked at the join, or
# expired during the reboot: the unit test tells the two apart).
lease2=$(lease_of /berth/nodes/n1)
ct_poweroff 60
CT_KEEP_STATE=1 ct_boot cluster ""
check "after a reboot the daemon joins with a new lease" wait_for 20 sh -c "nsenter -t $CT_PID -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -q 'joined as n1 .*new'"
lease3=$(lease_of /berth/nodes/n1)
check "... a new lease ($lease2 -> $lease3)" test -n "$lease3" -a "$lease3" != "$lease2"
check_contains "... and the old one is gone" "already expired" \
    "$(etcdctl lease timetolive "$(printf '%x' "$lease2")" 2>&1)"
ct_poweroff 60
