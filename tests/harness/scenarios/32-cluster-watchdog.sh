#!/usr/bin/env bash
# harness-job: class=exclusive minutes=4.5
# The watchdog-backed fence, with a real reset. n1 is a QEMU guest (TCG)
# booting the suite's root with systemd and berth and an emulated
# i6300esb, `watchdog = "/dev/watchdog0"` with a timeout of WD s; n2 is a
# container. db is `ha = true, nodes = ["n1", "n2"]`, stop_delay_s 3.
# - n1 holds the watchdog, announces it, and writes db's owner key with
#   the watchdog's wait (WD + 3 s) instead of the stop bound (38 s).
# - A suspend to RAM (systemctl suspend, QMP system_wakeup) with n1's
#   daemon in maintenance, woken past the maintenance lease's end: n1
#   stops db as it wakes, before n2 starts it, and fence-watch re-arms
#   the watchdog, which the wake-up disabled.
# - A frozen holder (fence-watch SIGSTOPped), in the same boot: the guest
#   resets within WD s, and n2 starts db only after the reset.
# - A fence stop that cannot finish (a task of db in uninterruptible
#   sleep on a disk QEMU throttles to a byte a second, and n1 cut off from
#   etcd): the guest resets once the lease has expired, and n2 starts db
#   only after the reset, well before db's stop bound.
# - The same stuck stop with n1's daemon stopped (in maintenance): its
#   fence timer and fence-watch's backstop cannot end db; the guest
#   resets at the maintenance lease's end, and n2 starts db after.
# - A pause of the whole guest (QMP stop) for twice the TTL: its watchdog
#   pauses with it; the double run it leaves is measured.
# - A clean stop of the daemon and fence-watch with no HA workload
#   running here: closed without a reset.
# - A device whose driver has nowayout set: refused, never opened.
# Times are the host's (QMP's events, the container's log, the moment a
# line of the guest's db log reaches the host): the guest's clock is not
# trusted.
source "$(dirname "$0")/../lib.sh"
scenario_begin 32-cluster-watchdog
source "$(dirname "$0")/../etcd.sh"
source "$(dirname "$0")/../ha.sh"
source "$(dirname "$0")/../vm.sh"
trap 'rc=$?; vm_cleanup; cluster_cleanup; (exit $rc); scenario_end' EXIT

TTL=10
WD=5
# n1's maintenance grace: how long its keys outlive its daemon's stop.
GRACE=10
# db stops 1 s after SIGTERM, within its stop delay: its log says when.
STOP_DELAY=3
BOUND=38 # (0 + 1) * (3 + 30) + 5
WAIT=$((WD + 3))
HA_NODES=(n1 n2)
# n1 is the guest: its commands go through the agent.
on() {
    if [ "$1" = n1 ]; then
        shift
        vm_run "$*"
    else
        ct_exec "${NODE_NAME[$1]}" "${NODE_PID[$1]}" "${@:2}"
    fi
}
db_conf='exec = ["/opt/berth-test/workload", "db"]\nha = true\nnodes = ["n1", "n2"]\nstop_delay_s = %s\n'
etcd_start
for n in n1 n2; do relay_start "$n"; done
guest=$HARNESS_DIR/config-32-n1
cluster_config "$guest" n1 "${RELAY_PORT[n1]}" "$TTL" watchdog='"/dev/watchdog0"' watchdog_timeout_s="$WD" \
    maintenance_grace_period_s="$GRACE"
# The host's loopback, as the guest reaches it.
sed -i 's|http://127.0.0.1:|http://10.0.2.2:|' "$guest/berth.toml"
# shellcheck disable=SC2059
printf "$db_conf" "$STOP_DELAY" >"$guest/workloads/db.toml"
booted=$(date +%s)
vm_boot n1 "$guest"
NODE_DIR[n1]=$VM_DIR
echo "measured: the guest booted in $(($(date +%s) - booted)) s"
check "n1 (the guest) takes db and starts it" wait_for 120 is_running_on n1 n1
check_contains "fence-watch holds the watchdog" "cluster: watchdog: holding /dev/watchdog0 (timeout $WD s" \
    "$(on n1 journalctl -b -u berth-fence-watch.service -o cat --no-pager)"
check_eq "... and says so in /run/berthd/watchdog-armed" "/dev/watchdog0 $WD" "$(on n1 cat /run/berthd/watchdog-armed)"
check_eq "n1's presence declares it" "$WD" \
    "$(etcdctl get /berth/nodes/n1 --print-value-only | python3 -c 'import json, sys; print(json.load(sys.stdin).get("watchdog_s"))')"
check_eq "db's owner key carries the watchdog's wait ($WD + 3 s), not the stop bound ($BOUND s)" "n1 $WAIT" \
    "$(owner) $(owner_field stop_bound_s)"

guest_dir=$HARNESS_DIR/config-32-n2
cluster_config "$guest_dir" n2 "${RELAY_PORT[n2]}" "$TTL"
# shellcheck disable=SC2059
printf "$db_conf" "$STOP_DELAY" >"$guest_dir/workloads/db.toml"
node_boot n2 "$guest_dir"
check "n2 joins and takes nothing" wait_for 60 says_more n2 'cluster: joined as n2' 0
check_contains "berth status on n2 tells the watchdog's wait from a stop bound" \
    "owner of db: n1 (lease $(lease_of /berth/nodes/n1 | xargs printf '%x'), takeover wait $WAIT s: its watchdog's timeout + 3 s" \
    "$(on n2 berth status)"

# db_back_to_n1 N: n2 drains (it releases db, n1 takes it), then its
# daemon restarts and it rejoins (its joins in this boot were N).
db_back_to_n1() {
    on n2 berth drain >/dev/null
    check "n1 takes db back" wait_for 60 is_running_on n1 n1
    on n2 systemctl restart berth-daemon.service
    check "... and n2 rejoins" wait_for 60 says_more n2 'cluster: joined as n2' "$1"
}
# back_after_reset SINCE: the guest boots again, its console since byte
# SINCE (this case's) says why it stopped petting, and n1 rejoins.
back_after_reset() {
    check "the guest boots again" vm_wait_up "$BOOT_TIMEOUT_VM"
    check_contains "... and its console, before the reset, says why it stopped petting" \
        "cluster: watchdog: not petting it: the lease has expired and db still runs here" \
        "$(tail -c +$(($1 + 1)) "$VM_DIR/console.log")"
    check "n1 rejoins" wait_for 60 says_more n1 'cluster: joined as n1' 0
}

# resets_after T: the host time of the first WATCHDOG event after T.
resets_after() { vm_events WATCHDOG | awk -v t="$1" '$1 > t { print; exit }'; }
reset_after() { [ -n "$(resets_after "$1")" ]; }
# takeover T0 WHAT: after a reset at or after T0, n2 starts db; checks it
# started only after the reset, and says how long it took from T0.
takeover() {
    local t0=$1 what=$2 reset started
    check "$what: the guest resets (the device's WATCHDOG event)" wait_for $((TTL + WD + 20)) reset_after "$t0"
    reset=$(resets_after "$t0")
    # Whatever held the guest back goes with the reset.
    ! declare -F on_reset >/dev/null || on_reset
    echo "measured: $what: reset $(python3 -c "print(round($reset - $t0, 2))") s after it began"
    check "... n2 takes db" wait_for $((TTL + WAIT + 30)) is_running_on n2 n2
    started=$(ev n2 start)
    check "... and starts it only after the reset ($(python3 -c "print(round($started - $reset, 2))") s after)" \
        python3 -c "import sys; sys.exit(not ($started > $reset))"
    echo "measured: $what: n2 started db $(python3 -c "print(round($started - $reset, 2))") s after the reset"
    check "... within the lease and the watchdog's wait of the reset (+ 5 s; the stop bound is $BOUND s)" \
        python3 -c "import sys; sys.exit(not ($started - $reset <= $TTL + $WAIT + 5))"
}

# A suspend to RAM while n1's daemon is stopped, in maintenance: the
# guest sleeps past the maintenance lease's end and wakes before n2 may
# take db (that end + WAIT). The fence counts on CLOCK_BOOTTIME, which a
# suspend moves on, so n1 stops db as it wakes, before n2 starts it; a
# fence on CLOCK_MONOTONIC alone would wait out the rest of the grace
# after the wake-up, past n2's start. QEMU resets the devices at the
# wake-up, the i6300esb's enable bit with them, and its driver has no
# resume hook: fence-watch re-arms it, and the frozen holder below, in
# the same boot, shows that it counts again.
t0=$(date +%s.%N)
on n1 systemctl stop berth-daemon.service
check_eq "n1's daemon stopped: n1 is in maintenance" maintenance \
    "$(etcdctl get /berth/nodes/n1 --print-value-only | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])')"
if read -r suspended woke n1_stopped < <(vm_suspend "$(python3 -c "print($t0 + $GRACE + 3)")"); then ok "the guest suspends to RAM"; else not_ok "the guest suspends to RAM" "no SUSPEND event within 30 s"; fi
echo "measured: suspended $(python3 -c "print(round($suspended - $t0, 2))") s after the daemon's stop, woken $(python3 -c "print(round($woke - $t0, 2))") s after it (the grace is $GRACE s)"
check "... and, woken past its maintenance lease's end, stops db ($(python3 -c "print(round($n1_stopped - $woke, 2))") s after the wake-up, <= 3 s)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped - $woke <= 3))"
check "n2 takes db" wait_for $((GRACE + WAIT + 30)) is_running_on n2 n2
n2_started=$(ev n2 start)
echo "measured: suspend: n1 stopped db $(python3 -c "print(round($n1_stopped - $woke, 2))") s after the wake-up, n2 started it $(python3 -c "print(round($n2_started - $woke, 2))") s after"
check "... after n1 stopped it: no double run ($(python3 -c "print(round($n2_started - $n1_stopped, 2))") s apart)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped < $n2_started))"
check "fence-watch re-armed the watchdog after the wake-up" grep -q "cluster: watchdog: the host slept [0-9]* ms: re-armed" \
    <<<"$(on n1 journalctl -b -u berth-fence-watch.service -o cat --no-pager)"
check_eq "... and no reset came" "" "$(resets_after "$t0")"
on n1 systemctl start berth-daemon.service
check "n1's daemon joins again" wait_for 60 says_more n1 'cluster: joined as n1' 1
db_back_to_n1 1

# A frozen holder, in the boot the suspend re-armed: nothing pets the
# device.
t0=$(date +%s.%N)
on n1 'kill -STOP $(systemctl show -P MainPID berth-fence-watch.service)'
takeover "$t0" "fence-watch frozen"
check "the guest boots again" vm_wait_up "$BOOT_TIMEOUT_VM"
check "... rejoins and leaves db to n2" wait_for 60 says_more n1 'cluster: joined as n1' 0
check_eq "db runs on n2 only" "n2 n2" "$(running_on) $(owner)"

db_back_to_n1 2

# A stop that cannot finish: a task of db's reads a disk QEMU serves at a
# byte a second (its first read passes, the next waits an hour), in
# uninterruptible sleep, which SIGKILL does not end.
throttle() {
    vm_qmp block_set_io_throttle "{\"id\": \"/machine/peripheral/stalldev/virtio-backend\", \"bps\": $1, \"bps_rd\": 0, \"bps_wr\": 0, \"iops\": 0, \"iops_rd\": 0, \"iops_wr\": 0}" >/dev/null
}
# (The root has no procps: /proc read directly.)
stalled() { on n1 'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = dd ] && cut -d" " -f3 $p/stat; done; true' | grep -qx D; }
stall_db() {
    throttle 1
    # The root has no udev: the disk is found by its serial in sysfs.
    on n1 'for d in /sys/block/vd*; do [ "$(cat $d/serial)" = stall ] && disk=/dev/${d##*/}; done
cg=$(systemctl show -P ControlGroup berth@db.service)
sh -c "echo \$\$ >/sys/fs/cgroup$cg/cgroup.procs; exec dd if=$disk of=/dev/null bs=4096 count=64 iflag=direct" >/dev/null 2>&1 &'
    check "a task of db is in uninterruptible sleep" wait_for 20 stalled
}
stall_db
on_reset() {
    throttle 0
    kill -CONT "${RELAY_PID[n1]}"
}
console_from=$(stat -c %s "$VM_DIR/console.log")
t0=$(date +%s.%N)
kill -STOP "${RELAY_PID[n1]}"
takeover "$t0" "db's stop stuck, n1 cut off"
unset -f on_reset
back_after_reset "$console_from"

# A stopped daemon whose fence cannot run: n1's daemon stopped (its keys
# on the maintenance lease, GRACE s), and db's stop stuck as above, so
# neither berth-fence.timer nor fence-watch's backstop ends db. At the
# maintenance lease's end fence-watch stops petting, the guest resets,
# and n2 starts db only after the reset.
db_back_to_n1 3
stall_db
on_reset() { throttle 0; }
console_from=$(stat -c %s "$VM_DIR/console.log")
t0=$(date +%s.%N)
on n1 systemctl stop berth-daemon.service
takeover "$t0" "daemon stopped, db's stop stuck"
unset -f on_reset
back_after_reset "$console_from"

# A paused guest: QEMU stops the whole VM for twice the TTL. Its emulated
# watchdog and its clocks stop with it, so nothing in it can fence it:
# this measures the window that leaves (docs: berth.toml(5), The limit).
# n2's start and n1's stop are both on the host's clock: the host sees
# each line of n1's db log as it lands.
db_back_to_n1 4
read -r paused resumed n1_stopped < <(vm_pause $((2 * TTL)))
check "a guest paused for $((2 * TTL)) s stops db once resumed" test "$n1_stopped" != 0
check "... and n2 takes db" wait_for $((TTL + WAIT + 30)) is_running_on n2 n2
n2_started=$(ev n2 start)
window=$(python3 -c "print(round(max(0.0, $n1_stopped - $n2_started), 2))")
echo "measured: pause of $(python3 -c "print(round($resumed - $paused, 1))") s: n1 stopped db $(python3 -c "print(round($n1_stopped - $resumed, 2))") s after its resume, n2 started it $(python3 -c "print(round($n2_started - $paused, 2))") s after the pause began: double run $window s"
check "... the double run ends with n1's fence after the resume (<= 5 s)" \
    python3 -c "import sys; sys.exit(not (0 < $n1_stopped - $resumed <= 5))"

# A clean stop with no HA workload here: the magic close.
t0=$(date +%s.%N)
on n1 systemctl stop berth-daemon.service berth-fence-watch.service
check_contains "a clean stop with nothing running here closes the watchdog" \
    "cluster: watchdog: no HA workload runs here: closed without a reset" \
    "$(on n1 journalctl -b -u berth-fence-watch.service -o cat --no-pager)"
sleep $((WD + 5))
check_eq "... and no reset follows ($((WD + 5)) s on)" "" "$(resets_after "$t0")"

# A driver with nowayout set (writable in sysfs; only 1 sticks): no close
# could stop the device again, so a clean stop would reset the host.
# fence-watch refuses it before opening it.
t0=$(date +%s.%N)
on n1 'echo 1 >/sys/class/watchdog/watchdog0/nowayout'
check_eq "nowayout is set on the guest's device" 1 "$(on n1 cat /sys/class/watchdog/watchdog0/nowayout)"
on n1 systemctl start berth-fence-watch.service
refused() { on n1 journalctl -b -u berth-fence-watch.service -o cat --no-pager | grep -q "watchdog0 has nowayout set"; }
check "fence-watch refuses a device with nowayout set" wait_for 10 refused
check_eq "... holds nothing (no armed file)" none "$(on n1 'test -e /run/berthd/watchdog-armed && echo armed || echo none')"
check_eq "... and never opened it (inactive)" inactive "$(on n1 cat /sys/class/watchdog/watchdog0/state)"
sleep $((WD + 3))
check_eq "... so no reset follows ($((WD + 3)) s on)" "" "$(resets_after "$t0")"
