#!/usr/bin/env bash
# harness-job: class=tight minutes=3.8
# Issue 14 on three booted nodes and a real etcd (each node through a relay
# of its own). db is an HA workload of n1 and n2; web runs on n2 and n3.
# - freeze adoption: a cluster freeze taken while the nodes run is applied
#   at once by every daemon (a node frozen on its own keeps its freeze,
#   which covers the cluster's until berth thaw); one taken while a node's
#   daemon was down is adopted at its start (the exact journal line, scope
#   cluster, the key's frozen_at), an object freeze likewise where the
#   workload is configured; a peer's own node and instance freezes are
#   never adopted, nor a freeze already adopted (a restart, a thaw by
#   hand); cluster and object freezes thawed while the daemon was down are
#   cleared at its start;
# - rejoin: daemons restarting (all at once, or one while a peer is cut
#   off) wait for nobody; a node booted again while a peer is cut off
#   (relay stopped) takes nothing during the grace, then freezes itself
#   naming the peer, and takes nothing while frozen; `berth cluster forget`
#   removes the peer, after which a boot waits for nobody; a drained peer
#   is not waited for; berth.freeze on the kernel command line freezes the
#   node (scope node, reason kernel-cmdline) past that boot; an etcd outage
#   longer than the grace while two nodes boot freezes nobody (the grace
#   counts from the first contact with etcd).
source "$(dirname "$0")/../lib.sh"
scenario_begin 30-cluster-rejoin-freeze
source "$(dirname "$0")/../etcd.sh"
source "$(dirname "$0")/../ha.sh"
trap 'rc=$?; cluster_cleanup; (exit $rc); scenario_end' EXIT

TTL=5
REJOIN=15
# db: no ExecStop=, TimeoutStopSec= = stop_delay_s + 30: (0 + 1) * 31 + 5.
BOUND=36
etcd_start
config_for() {
    local dir=$HARNESS_DIR/config-30-$1
    cluster_config "$dir" "$1" "${RELAY_PORT[$1]}" "$TTL" maintenance_grace_period_s=10 rejoin_grace_period_s="$REJOIN"
    if [ "$1" = n1 ]; then
        printf 'exec = ["/opt/berth-test/workload", "solo"]\n' >"$dir/workloads/solo.toml"
    else
        printf 'exec = ["/opt/berth-test/workload", "web"]\n' >"$dir/workloads/web.toml"
    fi
    [ "$1" = n3 ] || printf 'exec = ["/opt/berth-test/workload", "db"]\nha = true\nnodes = ["n1", "n2"]\nstop_delay_s = 1\n' \
        >"$dir/workloads/db.toml"
    echo "$dir"
}
NODES=(n1 n2 n3)
HA_NODES=(n1 n2)
for n in "${NODES[@]}"; do
    relay_start "$n"
    node_boot "$n" "$(config_for "$n")"
done
present() { [ -n "$(lease_of "/berth/nodes/$1")" ]; }
absent() { [ -z "$(lease_of "/berth/nodes/$1")" ]; }
member() { [ -n "$(etcdctl get "/berth/members/$1" --print-value-only)" ]; }
# st NODE EXPR: a Python expression over `berth status --json` as v.
st() { on "$1" berth status --json | python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1], {}, {'v': v}))" "$2"; }
# inspect NODE NAME EXPR: likewise over `berth inspect NAME --json`.
inspect() { on "$1" berth inspect "$2" --json | python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1], {}, {'v': v}))" "$3"; }
# flag NODE EXPR: likewise over NODE's node freeze flag (fails without one).
flag() { on "$1" cat /var/lib/berth/freeze/node | python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1], {}, {'v': v}))" "$2"; }
no_node_flag() { on "$1" test ! -e /var/lib/berth/freeze/node; }
api() { curl -s --max-time 5 --unix-socket "/proc/${NODE_PID[$1]}/root/run/berthd/api.sock" "http://berth$2"; }
presence_frozen() { etcdctl get "/berth/nodes/$1" --print-value-only | grep -qF '"frozen":true'; }
scope_is() { [ "$(st "$1" "v['frozen']['frozen_scope']")" = "$2" ]; }
in_log() { daemon_log "$1" | grep -qF -- "$2"; }
# joined NODE N: NODE's daemon joined at least N times in this boot.
joined() { local n; n=$(count_in "$1" "cluster: joined as $1"); [ "$n" != unreadable ] && [ "$n" -ge "$2" ]; }
waits() { count_in "$1" 'rejoin after a boot: waiting'; }
# reboot_node NODE [KERNEL-ARG...]: power-off (a drain), then the same host boots.
reboot_node() {
    local node=$1
    shift
    node_use "$node"
    ct_poweroff 90
    CT_KEEP_STATE=1 node_boot "$node" "" "$@"
}
cut() { kill -STOP "${RELAY_PID[$1]}"; }
heal() { kill -CONT "${RELAY_PID[$1]}"; }

for n in "${NODES[@]}"; do
    check "$n joins" wait_for 30 present "$n"
done
check "n1, db's first candidate, takes it" wait_for $((BOUND + 20)) has_owner n1
check "... and runs it" wait_for 20 is_running_on n1

# Restarts within a boot are maintenance, not a rejoin: every daemon at
# once, and n1's while n3 is cut off (missing), wait for nobody.
restarts=()
for n in "${NODES[@]}"; do
    on "$n" systemctl restart berth-daemon.service &
    restarts+=($!)
done
wait "${restarts[@]}"
for n in "${NODES[@]}"; do
    check "$n is back after the restart of every daemon" wait_for 30 joined "$n" 2
done
cut n3
check "n3, cut off, loses its node key" wait_for $((TTL + 10)) absent n3
on n1 systemctl restart berth-daemon.service
check "n1's daemon, restarted while n3 is missing, is back" wait_for 30 joined n1 3
sleep 2
check_eq "... no daemon waited for a peer (no rejoin within a boot)" "0 0 0" "$(waits n1) $(waits n2) $(waits n3)"
check_eq "... none is frozen" "None None None" \
    "$(st n1 "v['frozen']['frozen_scope']") $(st n2 "v['frozen']['frozen_scope']") $(st n3 "v['frozen']['frozen_scope']")"
check_eq "... db still runs on n1 only" n1 "$(running_on)"
heal n3
check "n3 is back" wait_for 30 present n3

# A cluster freeze taken while everyone runs: each daemon applies it as
# its watch brings it. n2 is frozen on its own first: its freeze stays,
# covering the cluster's.
on n2 berth freeze --reason own >/dev/null
out=$(on n1 berth freeze --cluster --reason upgrade)
check_contains "berth freeze --cluster puts the key" "key /berth/freeze/cluster" "$out"
check_contains "... taken by n1" '"taken_by":"n1"' "$(etcdctl get /berth/freeze/cluster --print-value-only)"
check "n3 applies it at once, saying so" wait_for 10 in_log n3 "the cluster was frozen by peer n1: local node has been frozen"
check "n1 applies it too" wait_for 10 scope_is n1 cluster
check_eq "n3's status: scope cluster, taken by n1, the reason" "cluster n1 upgrade" \
    "$(st n3 "' '.join([v['frozen']['frozen_scope'], v['frozen']['taken_by'], v['frozen']['reason']])")"
check "n2 keeps its own freeze, covering the cluster's" wait_for 10 in_log n2 \
    "the cluster was frozen by peer n1: local node is frozen already by a freeze of its own, which covers it"
check_eq "... its status: scope node, covering cluster" "node cluster" \
    "$(st n2 "v['frozen']['frozen_scope'] + ' ' + v['frozen']['covers']['frozen_scope']")"
check "n3's presence says frozen" wait_for 10 presence_frozen n3
freezes_api() { api n3 /v1/freezes | grep -q '"frozen_scope":"cluster"'; }
check "n3's /v1/freezes shows the cluster scope" wait_for 15 freezes_api
check_contains "... and each workload's view says what freezes it" '"frozen_scope":"cluster"' "$(api n3 /v1/workloads/web)"
check_contains "berth thaw on n2 lifts its own freeze only" "the cluster freeze taken by n1 still holds" "$(on n2 berth thaw)"
check_eq "... n2 is frozen by the cluster now" "cluster n1" "$(st n2 "v['frozen']['frozen_scope'] + ' ' + v['frozen']['taken_by']")"
check_contains "berth thaw --cluster deletes the key" "thawed: /berth/freeze/cluster deleted" "$(on n2 berth thaw --cluster)"
for n in "${NODES[@]}"; do
    check "$n drops its adopted freeze" wait_for 10 in_log "$n" "the cluster was thawed: local node's adopted freeze cleared"
done
check_eq "nobody is frozen" "None None None" \
    "$(st n1 "v['frozen']['frozen_scope']") $(st n2 "v['frozen']['frozen_scope']") $(st n3 "v['frozen']['frozen_scope']")"

# A peer's own freezes (node and instance, here by hand; a drain, a boot
# or a rejoin expiry write the same flags) are never adopted.
on n3 systemctl stop berth-daemon.service
on n2 berth freeze --reason own >/dev/null
on n2 berth freeze web --reason own >/dev/null
on n3 systemctl start berth-daemon.service
check "n3's daemon is back" wait_for 30 joined n3 3
sleep 2
check_eq "n2's own node freeze is not adopted by n3" None "$(st n3 "v['frozen']['frozen_scope']")"
check_eq "... nor its instance freeze of web" None "$(inspect n3 web "v['frozen']")"
check_eq "... n3 adopted nothing" 0 "$(count_in n3 'while this daemon was down')"
check_eq "... while n2 is frozen, scope node" node "$(st n2 "v['frozen']['frozen_scope']")"
on n2 berth thaw >/dev/null
on n2 berth thaw web >/dev/null

# Cluster and object freezes taken while n3's daemon was down are adopted
# at its start.
on n3 systemctl stop berth-daemon.service
on n1 berth freeze --cluster --reason "kernel upgrade" >/dev/null
on n1 berth freeze web --cluster --force --reason migration >/dev/null
key_at=$(etcdctl get /berth/freeze/cluster --print-value-only | python3 -c 'import json,sys; print(json.load(sys.stdin)["frozen_at"])')
sleep 2
on n3 systemctl start berth-daemon.service
check "n3 adopts the cluster freeze, saying exactly so" wait_for 30 sh -c \
    "nsenter -t ${NODE_PID[n3]} -a journalctl -b -u berth-daemon.service -o cat --no-pager | grep -qxF 'the cluster was frozen while this daemon was down (peer n1 frozen): local node has been frozen'"
check "... and the object freeze of web" wait_for 10 in_log n3 \
    "workload web was frozen cluster-wide while this daemon was down (peer n1 frozen): local instance has been frozen"
check_eq "n3's node freeze: scope cluster, the key's frozen_at ($key_at)" "cluster $key_at" \
    "$(st n3 "v['frozen']['frozen_scope'] + ' ' + v['frozen']['frozen_at']")"
check_eq "berth inspect web on n3: scope object, taken by n1" "object n1" \
    "$(inspect n3 web "v['frozen']['frozen_scope'] + ' ' + v['frozen']['taken_by']")"
list=$(on n3 berth list)
check_contains "berth list on n3 notes the node's freeze" "note: the node is frozen: cluster since $key_at, taken by n1: kernel upgrade" "$list"
check_contains "... and web's" "note: berth@web.service is frozen: object since" "$list"
check_eq "the flag records where it came from" "/berth/freeze/cluster n1" \
    "$(flag n3 "v['adopted']['key'] + ' ' + v['adopted']['taken_by']")"
check_eq "n1's daemon applied the cluster freeze: solo's view says so" cluster "$(inspect n1 solo "v['frozen']['frozen_scope']")"
lines() { count_in n3 'the cluster was frozen while this daemon was down'; }
# Not adopted twice: a restart, then a thaw by hand and a restart.
on n3 systemctl restart berth-daemon.service
check "n3's daemon is back" wait_for 30 joined n3 5
sleep 2
check_eq "an adopted freeze is not adopted again at a restart" 1 "$(lines)"
on n3 berth thaw >/dev/null
on n3 systemctl restart berth-daemon.service
check "n3's daemon is back" wait_for 30 joined n3 6
sleep 2
check_eq "a node thawed by hand stays thawed: the key was processed (no node freeze; web's object freeze left)" \
    "1 instance" "$(lines) $(st n3 "v['frozen']['frozen_scope']")"

# Taken again (a new revision): adopted again while running. Then both
# keys thawed while n3's daemon is down: both adopted freezes cleared.
on n1 berth freeze --cluster --reason again >/dev/null
check "n3 adopts the cluster freeze taken again" wait_for 10 scope_is n3 cluster
on n3 systemctl stop berth-daemon.service
on n1 berth thaw --cluster >/dev/null
on n1 berth thaw web --cluster >/dev/null
on n3 systemctl start berth-daemon.service
check "n3 clears its adopted node freeze at its start" wait_for 30 in_log n3 \
    "the cluster was thawed while this daemon was down: local node's adopted freeze cleared"
check "... and web's" wait_for 10 in_log n3 \
    "workload web was thawed cluster-wide while this daemon was down: local instance's adopted freeze cleared"
check_eq "... n3 and web are not frozen" "None None" "$(st n3 "v['frozen']['frozen_scope']") $(inspect n3 web "v['frozen']")"
both_thawed() { no_node_flag n1 && no_node_flag n2; }
check "n1 and n2 thawed with the key" wait_for 10 both_thawed

# Rejoin: n3 cut off until its lease expired; n1 boots again (its drain
# hands db to n2) and waits the grace for n3.
cut n3
check "n3's node key expires" wait_for $((TTL + 10)) absent n3
reboot_node n1
check "n1's drain handed db to n2" wait_for 20 is_running_on n2
check "n1, booted again, waits for n3" wait_for 30 in_log n1 "rejoin after a boot: waiting up to"
check_contains "... naming it" "for peer(s) n3" "$(daemon_log n1)"
# n2 powers off (drained): db is released, and n1 is its only candidate.
node_use n2
ct_poweroff 90
check_eq "n2's last state is drained" drained "$(etcdctl get /berth/last-state/n2 --print-value-only | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"
check_eq "during the grace db is released and n1 takes nothing (owner, takes, running)" "-0 " "-$(owner)$(took n1) $(running_on n1)"
check "at the grace's expiry n1 freezes itself, naming n3" wait_for $((REJOIN + 15)) in_log n1 \
    "rejoin grace of $REJOIN s passed with peer(s) n3 not heard"
check_eq "... scope node, reason rejoin-grace-expired" "node rejoin-grace-expired" \
    "$(st n1 "v['frozen']['frozen_scope'] + ' ' + v['frozen']['reason']")"
check "... and its presence says frozen" wait_for 10 presence_frozen n1
joined_at=$(on n1 journalctl -b -u berth-daemon.service -o short-unix --no-pager | awk '/cluster: joined as n1/ {print $1; exit}')
froze_at=$(on n1 journalctl -b -u berth-daemon.service -o short-unix --no-pager | awk '/rejoin grace of/ {print $1; exit}')
check "... not before the grace ($REJOIN s) after the join ($(python3 -c "print(round($froze_at - $joined_at, 1))") s)" \
    python3 -c "import sys; sys.exit(not ($froze_at - $joined_at >= $REJOIN - 0.5))"
sleep 3
check_eq "frozen, n1 takes nothing: db stays unowned (owner, takes, running)" "-0 " "-$(owner)$(took n1) $(running_on n1)"

# berth cluster forget: a node present is refused; n3 (gone) is forgotten.
out=$(on n1 berth cluster forget n1 2>&1) && rc=0 || rc=$?
check_eq "berth cluster forget n1 (present) is refused" 1 "$rc"
check_contains "... saying why" "n1 is present" "$out"
check_contains "berth cluster forget n3 deletes its member key" "forgot n3" "$(on n1 berth cluster forget n3)"
check_eq "... members/n3 is gone" "" "$(etcdctl get /berth/members/n3 --print-value-only)"
on n1 berth thaw >/dev/null
# Its take loop listed db unowned (released before it listed): it waits
# one stop bound from that listing.
check "thawed, n1 takes db" wait_for $((BOUND + 20)) is_running_on n1
# Booted again with n3 forgotten and n2 drained: nobody to wait for.
reboot_node n1
check "n1 booted again joins" wait_for 30 in_log n1 "cluster: joined as n1"
check "... takes db again, with nobody to wait for (n3 forgotten, n2 drained)" wait_for $((BOUND + 20)) is_running_on n1
check_eq "... and waited for nobody" 0 "$(waits n1)"
heal n3
check "n3, heard again, is a member again" wait_for 30 member n3
check "... and present" wait_for 30 present n3

# berth.freeze on the kernel command line: the node freezes itself (scope
# node, reason kernel-cmdline), and the flag outlives that boot.
CT_KEEP_STATE=1 node_boot n2 "" berth.freeze
check "n2 booted with berth.freeze joins" wait_for 30 present n2
check_eq "n2's node flag: scope node, reason kernel-cmdline, with a time" "node kernel-cmdline True" \
    "$(flag n2 "v['scope'] + ' ' + v['reason'] + ' ' + str(bool(v['frozen_at']))")"
check "... and its presence says frozen" wait_for 10 presence_frozen n2
reboot_node n2
check "n2 booted again without it joins" wait_for 30 present n2
check_eq "... still frozen by the flag" "node kernel-cmdline" "$(st n2 "v['frozen']['frozen_scope'] + ' ' + v['frozen']['reason']")"
check_contains "... until berth thaw" "thawed: the node" "$(on n2 berth thaw)"

# An etcd outage longer than the grace while n1 and n3 boot again. Both
# are cut off for a while after etcd is back, so that their old keys
# expire: n1 then waits for n3, from its first contact, and hears it.
etcd_stop
reboot_node n1
reboot_node n3
sleep $((REJOIN + 5))
cut n1
cut n3
etcd_start
sleep $((TTL + 3))
heal n1
check "n1 joins once it reaches etcd" wait_for 30 in_log n1 "cluster: joined as n1"
check "... and waits for n3, whose old key expired" wait_for 10 in_log n1 "rejoin after a boot: waiting up to"
sleep 3
heal n3
check "n3 joins" wait_for 30 in_log n3 "cluster: joined as n3"
check "n1 hears it and takes part" wait_for 15 in_log n1 "cluster: rejoin: every peer is heard"
sleep $((REJOIN + 3))
for n in n1 n3; do
    check_eq "... $n did not freeze" "0 None" "$(count_in "$n" 'rejoin grace of') $(st "$n" "v['frozen']['frozen_scope']")"
done
check_eq "n2, whose daemon ran through the outage, did not freeze" "0 None" "$(count_in n2 'rejoin grace of') $(st n2 "v['frozen']['frozen_scope']")"
