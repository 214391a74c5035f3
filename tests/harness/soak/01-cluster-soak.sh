#!/usr/bin/env bash
# harness-job: class=tight minutes=6 timeout=60
# Issue 15: the cluster under random faults. Three booted roots (n1, n2,
# n3), a real etcd on the host, a relay per node; five HA workloads with
# different candidate lists and a non-HA one (web) on every node.
#
# The driver injects SOAK_FAULTS faults (default 100; `make soak`) one
# after another, each on a node chosen at random (mostly the owner of a
# random HA workload), from SOAK_SEED (printed, so a run can be repeated):
#   daemon-kill                 SIGKILL of the daemon (systemd restarts it)
#   daemon-stop-within-grace    systemctl stop, start again inside the grace
#   daemon-stop-past-grace      stopped past the grace: fence, takeover
#   partition                   the node's relay SIGSTOPped, then CONTinued
#   relay-kill                  the relay killed, then started again
#   etcd-restart                etcd stopped for a while (every node)
#   poweroff-boot               a real power-off (the drain), then a boot
#   root-kill-boot              the root's PID 1 SIGKILLed, then a boot
#   root-freeze                 the root's cgroup frozen for less than a lease
#   latency-spike               etcd's replies to the node held in its relay
#                               for 0.5 to 4 s (its requests go through)
#   key-delete                  the owner key of a workload the node runs,
#                               deleted by hand: the node fences it, a peer
#                               takes it after the node's stop bound
#   manual-drain                `berth drain` by hand on the node, and a
#                               `systemctl start` of one of its HA workloads
#                               racing it; then the node's daemon restarted
#                               and its non-HA workload started again
#   failed-start                the same drain while every other node fails
#                               its HA starts (the workload exits before it
#                               is ready) for 2 to 8 s: the takers' starts
#                               fail and are tried again
# The first thirteen faults are the thirteen kinds in a random order, so
# that a short run (CI's) meets each; halfway, the owner of an HA workload is
# frozen past its lease and the stop bound, until a peer runs what it owned
# (the stalled-host window, issue 13). After each fault the driver waits
# until every node is healthy again (booted, daemon active, presence up)
# and 5 to 8 s more: faults do not pile up, but takeovers still under way
# when the next one starts are fair game.
#
# tests/harness/soak/invariants.py samples every root's workload cgroups
# from the host every 200 ms and reports: double runs outside the
# stalled-host window (which it measures), HA workloads that ran nowhere
# for longer than lease + stop bound + grace while a candidate was healthy,
# stops caused by a daemon restart, HA stops under no fault of their node,
# stops of the non-HA workload other than its root's power-off or death,
# and every drain's outcomes; it prints the fault log. From etcd (its JSON
# gateway) it samples the owner keys too, and counts HA workloads owned by
# a healthy node on its live lease that do not run there for longer than
# the reconcile period plus a start. Each count is a
# check; a failure keeps the run (journals, samples, fault log) in
# target/harness/soak-failed-*.
source "$(dirname "$0")/../lib.sh"
scenario_begin 01-cluster-soak
source "$(dirname "$0")/../etcd.sh"

FAULTS=${SOAK_FAULTS:-100}
[ "$FAULTS" -ge 13 ] 2>/dev/null || die "SOAK_FAULTS must be at least 13 (one fault of each kind), not '$FAULTS'"
SEED=${SOAK_SEED:-$((($(date +%s) + $$) % 32768))}
# Every random number is drawn in this shell (bash seeds RANDOM afresh in
# a subshell), so that the seed repeats the faults, their nodes and times.
RANDOM=$SEED
TTL=5
# The fence of a stopped daemon comes two keep-alives (2 s) before the
# grace ends: a stop "within the grace" lasts at most grace - 6 s.
MAINTENANCE_GRACE=12
REJOIN_GRACE=15
STOP_DELAY=2
# No ExecStop=: TimeoutStopSec= is stop_delay_s + 30, the bound that plus 5.
BOUND=$((STOP_DELAY + 30 + 5))
# lease + stop bound + the longer grace.
UNOWNED_BOUND=$((TTL + BOUND + (MAINTENANCE_GRACE > REJOIN_GRACE ? MAINTENANCE_GRACE : REJOIN_GRACE)))
NODES=(n1 n2 n3)
declare -A CANDIDATES=([ha1]="n1 n2 n3" [ha2]="n2 n3 n1" [ha3]="n3 n1 n2" [ha4]="n1 n3" [ha5]="n2 n1")
HA=(ha1 ha2 ha3 ha4 ha5)

SOAK=$HARNESS_DIR/run/soak
rm -rf "$SOAK"
mkdir -p "$SOAK/drains"
FAULT_LOG=$SOAK/faults.log
: >"$FAULT_LOG"
note() { printf '%s %s\n' "$(date +%s.%N)" "$*" >>"$FAULT_LOG"; }
say() { printf '  soak  %s%s\n' "$PREFIX" "$*"; }
PREFIX=

CHECKER_PID=
FROZEN_CG=
soak_cleanup() {
    local rc=$?
    [ -z "$FROZEN_CG" ] || echo 0 >"$FROZEN_CG/cgroup.freeze" 2>/dev/null || true
    touch "$SOAK/stop"
    [ -z "$CHECKER_PID" ] || wait "$CHECKER_PID" 2>/dev/null || true
    cluster_cleanup
    if [ "$rc" -ne 0 ] || [ "$FAILED" -ne 0 ]; then
        local keep
        keep=$HARNESS_DIR/soak-failed-$(date +%Y%m%d-%H%M%S)
        mkdir -p "$keep"
        cp -a "$SOAK" "$keep/" 2>/dev/null || true
        local n
        for n in "${NODES[@]}"; do [ -z "${NODE_DIR[$n]:-}" ] || cp -a "${NODE_DIR[$n]}" "$keep/" 2>/dev/null || true; done
        cp -a "$ETCD_DIR"/*.log "$keep/" 2>/dev/null || true
        log "soak: kept the journals, samples and fault log in $keep"
    fi
    (exit "$rc")
    scenario_end
}
trap soak_cleanup EXIT

etcd_start
config_for() {
    local dir=$HARNESS_DIR/config-soak-$1 w
    cluster_config "$dir" "$1" "${RELAY_PORT[$1]}" "$TTL" \
        maintenance_grace_period_s="$MAINTENANCE_GRACE" rejoin_grace_period_s="$REJOIN_GRACE"
    for w in "${HA[@]}"; do
        case " ${CANDIDATES[$w]} " in *" $1 "*) ;; *) continue ;; esac
        local list
        list=$(printf '"%s", ' ${CANDIDATES[$w]})
        # Ready at once, or a failed start while the fault's flag is there.
        printf 'exec = ["/opt/berth-test/workload", "%s", "notify"]\nready = "notify"\nha = true\nnodes = [%s]\nstop_delay_s = %s\n' \
            "$w" "${list%, }" "$STOP_DELAY" >"$dir/workloads/$w.toml"
    done
    printf 'exec = ["/opt/berth-test/workload", "web"]\nstop_delay_s = %s\n' "$STOP_DELAY" >"$dir/workloads/web.toml"
    echo "$dir"
}

root_cgroup() {
    local cg=/sys/fs/cgroup/unified/berth-harness-${NODE_NAME[$1]}
    [ -d "$cg" ] || cg=/sys/fs/cgroup/berth-harness-${NODE_NAME[$1]}
    echo "$cg"
}

for n in "${NODES[@]}"; do
    relay_start "$n"
    node_boot "$n" "$(config_for "$n")"
done
python3 - "$SOAK/nodes.json" "$UNOWNED_BOUND" "$STOP_DELAY" "$TTL" "${HA[@]}" <<EOF
import json, sys
out, bound, delay, ttl, ha = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
candidates = {$(for w in "${HA[@]}"; do printf '"%s": "%s".split(), ' "$w" "${CANDIDATES[$w]}"; done)}
nodes = {$(for n in "${NODES[@]}"; do printf '"%s": "%s", ' "$n" "$(root_cgroup "$n")"; done)}
json.dump({"nodes": nodes, "workloads": ha + ["web"], "ha": {w: candidates[w] for w in ha},
           "unowned_bound_s": bound, "stop_delay_s": delay, "ttl_s": ttl,
           "etcd": "http://127.0.0.1:$ETCD_PORT"}, open(out, "w"), indent=1)
EOF
python3 "$REPO/tests/harness/soak/invariants.py" watch "$SOAK" &
CHECKER_PID=$!

# --- health ----------------------------------------------------------------
presence_up() {
    etcdctl get "/berth/nodes/$1" --print-value-only 2>/dev/null \
        | python3 -c 'import json, sys; p = json.loads(sys.stdin.read() or "{}"); sys.exit(not (p.get("state") == "up" and not p.get("frozen")))'
}
healthy() {
    kill -0 "${NODE_NSPAWN[$1]}" 2>/dev/null || return 1
    [ "$(cat "$(root_cgroup "$1")/cgroup.freeze" 2>/dev/null)" != 1 ] || return 1
    [ "$(on "$1" systemctl is-active berth-daemon.service 2>/dev/null)" = active ] || return 1
    presence_up "$1"
}
# settle [LIMIT]: waits until every node is healthy, noting each as it
# comes up; a node that does not within LIMIT s is noted "unsettled".
declare -A IS_UP=([n1]=0 [n2]=0 [n3]=0)
settle() {
    local limit=${1:-180} deadline n pending
    deadline=$(($(date +%s) + limit))
    while :; do
        pending=0
        for n in "${NODES[@]}"; do
            [ "${IS_UP[$n]}" = 1 ] && continue
            if healthy "$n"; then IS_UP[$n]=1; note up "$n"; else pending=1; fi
        done
        [ "$pending" = 1 ] || return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            for n in "${NODES[@]}"; do
                [ "${IS_UP[$n]}" = 1 ] || { note unsettled "$n"; say "$n did not become healthy in $limit s"; }
            done
            return 1
        fi
        sleep 0.3
    done
}
mark_down() { IS_UP[$1]=0; note down "$1" "$2"; }
# repair: what an operator would do for a node that did not come back
# (counted as unsettled already): boot it, start its daemon, thaw it.
# A node still not healthy after that ends the run.
repair() {
    local n
    for n in "${NODES[@]}"; do
        [ "${IS_UP[$n]}" = 1 ] && continue
        if ! kill -0 "${NODE_NSPAWN[$n]}" 2>/dev/null; then
            boot_again "$n"
        else
            on "$n" systemctl reset-failed berth-daemon.service || true
            on "$n" systemctl start berth-daemon.service || true
            on "$n" berth thaw || true
        fi
        say "repaired $n"
    done
    settle 120 || die "a node did not come back after a repair"
}

# --- faults ----------------------------------------------------------------
# pick WORD...: one of them, in P. rand LOW HIGH: an integer in [LOW, HIGH],
# in R. Never called in a subshell (see RANDOM above).
pick() { P=${@:$((RANDOM % $# + 1)):1}; }
rand() { R=$(($1 + RANDOM % ($2 - $1 + 1))); }
owner_of() {
    etcdctl get "/berth/owners/$1" --print-value-only 2>/dev/null \
        | python3 -c 'import json, sys; t = sys.stdin.read().strip(); print(json.loads(t)["node"] if t else "")' \
        || true
}
# target: mostly the owner of a random HA workload, else any node; in T.
target() {
    local o= roll=$((RANDOM % 10))
    pick "${HA[@]}"
    [ "$roll" -ge 7 ] || o=$(owner_of "$P")
    pick "${NODES[@]}"
    case " ${NODES[*]} " in *" $o "*) [ -n "$o" ] && { T=$o; return; } ;; esac
    T=$P
}
boot_again() { CT_KEEP_STATE=1 node_boot "$1" ""; }
# owned_by NODE: an HA workload NODE owns, else a random one; in W.
owned_by() {
    local w
    pick "${HA[@]}"
    W=$P
    for w in "${HA[@]}"; do
        [ "$(owner_of "$w")" != "$1" ] || { W=$w; return; }
    done
}
# an_owner NODE: NODE when it owns an HA workload, else the owner of one
# (NODE when nobody owns any); in T, what it owns in W.
an_owner() {
    local w o
    T=$1
    owned_by "$T"
    [ "$(owner_of "$W")" != "$T" ] || return 0
    for w in "${HA[@]}"; do
        o=$(owner_of "$w")
        [ -z "$o" ] || { T=$o; W=$w; return 0; }
    done
}
# drain_by_hand NODE [RACE]: `berth drain` on NODE; with RACE, a start of
# W on NODE RACE seconds after the drain began. Then the node back in
# service, as an admin would: its daemon restarted (a drained presence
# takes nothing), its non-HA workload started.
drain_by_hand() {
    local n=$1 race=${2:-} pid
    on "$n" berth drain >/dev/null 2>&1 &
    pid=$!
    if [ -n "$race" ]; then
        sleep "$race"
        on "$n" systemctl start --no-block "berth@$W.service" || true
    fi
    wait "$pid" || say "berth drain on $n failed"
}
back_in_service() {
    on "$1" systemctl restart berth-daemon.service || say "daemon restart on $1 failed"
    on "$1" systemctl start berth@web.service || say "web start on $1 failed"
}
# keep_drain NODE BOOT-ID: the drain report of the boot that just ended,
# noted for the report (a report of an earlier boot is not counted).
DRAINS=0
keep_drain() {
    local f=${NODE_DIR[$1]}/state/last-drain.json copy
    DRAINS=$((DRAINS + 1))
    copy=$SOAK/drains/$DRAINS-$1.json
    if [ -f "$f" ] && cp "$f" "$copy" && grep -q "\"boot_id\": \"$2\"" "$copy"; then
        note drain "$1" "$copy"
    else
        note drain-missing "$1"
        say "no drain report of boot $2 on $1"
    fi
}

fault() {
    local kind=$1 n=$2 d
    case "$kind" in
        daemon-kill)
            mark_down "$n" "$kind"
            # MainPID is 0 while systemd waits to restart it: kill(0) would
            # reach the caller's process group.
            on "$n" sh -c 'p=$(systemctl show -P MainPID berth-daemon.service); [ "$p" -gt 1 ] && kill -KILL "$p"' \
                || say "no daemon to SIGKILL"
            say "$kind $n"
            ;;
        daemon-stop-within-grace)
            rand 1 $((MAINTENANCE_GRACE - 6))
            d=$R
            mark_down "$n" "$kind"
            on "$n" systemctl stop berth-daemon.service || say "stop failed"
            sleep "$d"
            on "$n" systemctl start berth-daemon.service || say "start failed"
            say "$kind $n ${d}s"
            ;;
        daemon-stop-past-grace)
            rand $((MAINTENANCE_GRACE + 2)) $((MAINTENANCE_GRACE + TTL + 4))
            d=$R
            mark_down "$n" "$kind"
            on "$n" systemctl stop berth-daemon.service || say "stop failed"
            sleep "$d"
            on "$n" systemctl start berth-daemon.service || say "start failed"
            say "$kind $n ${d}s"
            ;;
        partition)
            rand 1 $((3 * TTL))
            d=$R
            mark_down "$n" "$kind"
            kill -STOP "${RELAY_PID[$n]}"
            sleep "$d"
            kill -CONT "${RELAY_PID[$n]}"
            say "$kind $n ${d}s"
            ;;
        relay-kill)
            rand 1 $((3 * TTL))
            d=$R
            mark_down "$n" "$kind"
            kill "${RELAY_PID[$n]}"
            wait "${RELAY_PID[$n]}" 2>/dev/null || true
            sleep "$d"
            relay_start "$n"
            say "$kind $n ${d}s"
            ;;
        etcd-restart)
            rand 1 $((3 * TTL))
            d=$R
            for n in "${NODES[@]}"; do IS_UP[$n]=0; done
            note down all "$kind"
            etcd_stop
            sleep "$d"
            etcd_start
            say "$kind ${d}s"
            ;;
        poweroff-boot)
            rand 0 5
            d=$R
            mark_down "$n" "$kind"
            local boot
            boot=$(on "$n" cat /proc/sys/kernel/random/boot_id)
            node_use "$n"
            ct_poweroff 120
            keep_drain "$n" "$boot"
            sleep "$d"
            boot_again "$n"
            say "$kind $n (off ${d}s)"
            ;;
        root-kill-boot)
            rand 0 5
            d=$R
            mark_down "$n" "$kind"
            kill -9 "${NODE_PID[$n]}"
            node_use "$n"
            ct_wait_exit 60
            sleep "$d"
            boot_again "$n"
            say "$kind $n (off ${d}s)"
            ;;
        root-freeze)
            # 0.5 to 3 s, in tenths: less than the lease, which can end 4 s
            # after the freeze (keep-alives are 1 s apart).
            rand 5 30
            d=$((R / 10)).$((R % 10))
            mark_down "$n" "$kind"
            FROZEN_CG=$(root_cgroup "$n")
            echo 1 >"$FROZEN_CG/cgroup.freeze"
            sleep "$d"
            echo 0 >"$FROZEN_CG/cgroup.freeze"
            FROZEN_CG=
            say "$kind $n ${d}s"
            ;;
        latency-spike)
            rand 5 40
            d=$((R / 10)).$((R % 10))
            mark_down "$n" "$kind"
            kill -USR1 "${RELAY_PID[$n]}"
            sleep "$d"
            kill -USR2 "${RELAY_PID[$n]}"
            say "$kind $n ${d}s"
            ;;
        key-delete)
            owned_by "$n"
            local o
            o=$(owner_of "$W")
            if [ -z "$o" ]; then
                say "$kind: $W has no owner; nothing deleted"
            else
                mark_down "$o" "$kind"
                etcdctl del "/berth/owners/$W" >/dev/null
                say "$kind $W (owned by $o)"
            fi
            ;;
        manual-drain)
            an_owner "$n"
            n=$T
            rand 0 15
            d=$((R / 10)).$((R % 10))
            mark_down "$n" "$kind"
            drain_by_hand "$n" "$d"
            back_in_service "$n"
            say "$kind $n, a start of $W ${d}s after it began"
            ;;
        failed-start)
            an_owner "$n"
            n=$T
            rand 2 8
            d=$R
            local p began
            began=$(date +%s.%N)
            mark_down "$n" "$kind"
            for p in "${NODES[@]}"; do
                [ "$p" != "$n" ] || continue
                on "$p" touch /run/berth-test-fail-start
                # Not a root fault: nothing of the peer may stop.
                mark_down "$p" start-failures
            done
            drain_by_hand "$n"
            sleep "$(python3 -c "print(max(0.0, $d - ($(date +%s.%N) - $began)))")"
            for p in "${NODES[@]}"; do on "$p" rm -f /run/berth-test-fail-start || true; done
            d=$(python3 -c "print(round($(date +%s.%N) - $began, 1))")
            back_in_service "$n"
            say "$kind: starts failed on every node but $n for ${d}s, $n drained"
            ;;
        *) die "no fault $kind" ;;
    esac
}

# The long freeze: the owner of a random HA workload, past its lease and
# the stop bound, until a peer runs each workload it owned.
runs_elsewhere() {
    local w=$1 n=$2 p
    for p in ${CANDIDATES[$w]}; do
        [ "$p" != "$n" ] || continue
        [ "$(on "$p" systemctl is-active "berth@$w.service" 2>/dev/null)" = active ] && return 0
    done
    return 1
}
long_stall() {
    local w n owned=() began
    wait_for "$UNOWNED_BOUND" all_owned || say "not every HA workload has an owner before the long freeze"
    pick "${HA[@]}"
    n=$(owner_of "$P")
    [ -n "$n" ] || { pick "${NODES[@]}"; n=$P; }
    for w in "${HA[@]}"; do [ "$(owner_of "$w")" != "$n" ] || owned+=("$w"); done
    mark_down "$n" long-stall
    note stall "$n" "${owned[@]}"
    began=$(date +%s)
    FROZEN_CG=$(root_cgroup "$n")
    echo 1 >"$FROZEN_CG/cgroup.freeze"
    sleep $((TTL + BOUND))
    for w in "${owned[@]}"; do
        wait_for 60 runs_elsewhere "$w" "$n" || say "$w did not start elsewhere during the long freeze"
    done
    sleep 1
    echo 0 >"$FROZEN_CG/cgroup.freeze"
    FROZEN_CG=
    note stall-thaw "$n"
    say "long-stall $n $(($(date +%s) - began))s (owner of ${owned[*]})"
}

KINDS=(daemon-kill daemon-stop-within-grace daemon-stop-past-grace partition relay-kill etcd-restart
    poweroff-boot root-kill-boot root-freeze latency-spike key-delete manual-drain failed-start)
say "seed $SEED, $FAULTS faults (SOAK_SEED=$SEED SOAK_FAULTS=$FAULTS repeats this run)"
all_owned() {
    local w
    for w in "${HA[@]}"; do [ -n "$(owner_of "$w")" ] || return 1; done
}
if settle 120; then ok "every node is healthy after the first boot"; else not_ok "every node is healthy after the first boot"; fi
check "... and every HA workload has an owner" wait_for 60 all_owned

order=("${KINDS[@]}")
# Fisher-Yates, in this shell.
for i in "${!order[@]}"; do
    j=$((RANDOM % (i + 1)))
    tmp=${order[$i]}
    order[$i]=${order[$j]}
    order[$j]=$tmp
done
stall_at=$((FAULTS / 2))
started=$(date +%s)
declare -A INJECTED=()
for i in $(seq 1 "$FAULTS"); do
    if [ "$i" -le ${#order[@]} ]; then kind=${order[$((i - 1))]}; else pick "${KINDS[@]}"; kind=$P; fi
    INJECTED[$kind]=$((${INJECTED[$kind]:-0} + 1))
    PREFIX=$(printf '%3d/%d  ' "$i" "$FAULTS")
    target
    fault "$kind" "$T"
    settle 180 || repair
    # Quiet: what the fault set going (a fence at a thaw) ends before the
    # next one, so that a stop is put down to the right fault.
    rand 5 8
    sleep "$R"
    if [ "$i" = "$stall_at" ]; then
        PREFIX='        '
        long_stall
        settle 180 || repair
    fi
done
PREFIX=
note end
# Let takeovers under way finish before the checker stops.
sleep $((UNOWNED_BOUND + 5))
check "the checker ran to the end" kill -0 "$CHECKER_PID"
touch "$SOAK/stop"
checker_rc=0
wait "$CHECKER_PID" || checker_rc=$?
CHECKER_PID=
check_eq "... and exited cleanly" 0 "$checker_rc"
say "$FAULTS faults in $(($(date +%s) - started)) s: $(for k in "${KINDS[@]}"; do printf '%s=%s ' "$k" "${INJECTED[$k]:-0}"; done)"

python3 "$REPO/tests/harness/soak/invariants.py" report "$SOAK" | sed 's/^/  soak  /' || true
say "fault log (with times): $FAULT_LOG; samples: $SOAK/samples.log"
count() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$SOAK/counts.json" "$1"; }
check_eq "the samples cover every fault" True "$(count samples_cover_the_run)"
check_eq "no HA workload ran on two nodes outside the stalled-host window" 0 "$(count double_runs)"
check "the stalled-host window was measured: $(count stalled_window_s) s (the fence's look and the workload's stop, <= stop_delay_s + 4 = $((STOP_DELAY + 4)) s)" \
    python3 -c "import sys; sys.exit(not (0 < $(count stalled_window_s) <= $STOP_DELAY + 4))"
check_eq "... and it ended with the stalled host's copy stopped, never the peer's" 0 "$(count stale_copies_survived)"
check_eq "no HA workload ran nowhere past lease + stop bound + grace ($UNOWNED_BOUND s) while a candidate was up (narrower rule: $(count unowned_past_bound))" \
    0 "$(count unowned_past_bound_any_candidate)"
check_eq "no HA workload owned by a healthy node on its live lease went unstarted there past the reconcile period and a start (longest $(count owned_not_running_longest_s) s, from $(count owner_samples) owner samples)" \
    0 "$(count owned_not_running)"
check "... and the owner keys were sampled" python3 -c "import sys; sys.exit(not $(count owner_samples) > 0)"
check_eq "no workload stopped because a daemon restarted" 0 "$(count stops_by_daemon_restart)"
check_eq "no HA workload stopped without a fault of its node" 0 "$(count ha_stops_without_a_fault)"
check_eq "the non-HA workload stopped only with its root" 0 "$(count non_ha_stops)"
check_eq "every power-off drained, with a report ($(count drain_outcomes))" "${INJECTED[poweroff-boot]:-0}" "$(count drains)"
check_eq "... every drain outcome graceful (or already off)" 0 "$(count drain_outcomes_not_graceful)"
check_eq "... no power-off without a report of its boot" 0 "$(count drains_missing)"
check_eq "every node became healthy again after each fault" 0 "$(count unsettled)"
check_eq "at the end every HA workload runs on one node" True "$(count final_ha_running_once)"
check_eq "... and the non-HA workload on every node" True "$(count final_non_ha_everywhere)"
check "the checker sampled throughout (longest gap $(count longest_sample_gap_s) s)" \
    python3 -c "import sys; sys.exit(not $(count longest_sample_gap_s) < 2)"
