#!/usr/bin/env bash
# Issue 36: how soon a guest's own power-off ends its unit, and what the
# watcher costs while the guest runs, with libvirt's events (berth-libvirt)
# against reading the state with virsh every 2 s (BERTH_LIBVIRT_HELPER=
# set empty by a drop-in), in the same run, inside the harness's libvirt
# root (real libvirt, QEMU under TCG).
#
# Latency: GUESTS guests (default 3) power themselves off LIFETIME s
# (default 4) after boot, SAMPLES times each (default 10); each sample is
# from libvirt's record of the shutdown (the domain log's "shutting down,
# reason=shutdown" line, in ms) to systemd's "Deactivated successfully" of
# the unit in the journal (µs).
# p50 and p99 per mode (issue 36: at most 100 and 250 ms with events).
# Idle CPU: the same guests running, IDLE_S (default 60) s: the CPU time of
# each watcher and of what it ran (virsh, or berth-libvirt), per guest.
# Needs root, systemd-nspawn and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
GUESTS=${GUESTS:-3}
LIFETIME=${LIFETIME:-4}
SAMPLES=${SAMPLES:-10}
IDLE_S=${IDLE_S:-60}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
trap 'ct_cleanup' EXIT

harness_libvirt_root
VM=$HARNESS_DIR/run/bench-events-vm
guest_files "$VM"
NAMES=$(seq -f 'ev-%g' 1 "$GUESTS" | xargs)
for g in $NAMES; do
    # Short-lived (ev-N) and long-lived (idle-ev-N) twins of each guest.
    harness_define_guest "$g" "lifetime=$LIFETIME"
    harness_define_guest "idle-$g"
    cp "$GUEST_DIR/disk.img" "$VM/$g.img"
    cp "$GUEST_DIR/disk.img" "$VM/idle-$g.img"
done
config=$HARNESS_DIR/config-bench-events
rm -rf "$config"
mkdir -p "$config"
printf '[libvirt]\nguests = "all"\nautostart = false\nstop_delay_s = 30\n' >"$config/berth.toml"
ROOTFS=$VIRT_ROOTFS
CT_NSPAWN_OPTS=(--bind="$VM:/vm")
ct_boot bench-events "$config"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
ct test -x /usr/libexec/berth/berth-libvirt || die "berth-libvirt is not installed in the root"

# set_mode events|poll: the watchers' environment, for the next starts.
set_mode() {
    ct mkdir -p /run/systemd/system/berth@.service.d
    if [ "$1" = poll ]; then
        ct sh -c 'printf "[Service]\nEnvironment=BERTH_LIBVIRT_HELPER=\n" >/run/systemd/system/berth@.service.d/50-poll.conf'
    else
        ct rm -f /run/systemd/system/berth@.service.d/50-poll.conf
    fi
    ct systemctl daemon-reload
}

# latency MODE: one line per sample, in ms.
latency() {
    local g i
    for g in $NAMES; do
        (
            deactivated() { ct journalctl -b -u "berth@$g.service" -o cat | grep -c 'Deactivated successfully'; }
            for i in $(seq 1 "$SAMPLES"); do
                n0=$(deactivated)
                ct systemctl start "berth@$g.service" || exit 1
                until [ "$(ct systemctl show -P ActiveState "berth@$g.service")" = inactive ]; do
                    [ "$(ct systemctl show -P ActiveState "berth@$g.service")" != failed ] || die "berth@$g.service failed"
                    sleep 0.2
                done
                off=$(ct sh -c "grep 'shutting down, reason=shutdown' /var/log/libvirt/qemu/$g.log | tail -n1 | cut -d' ' -f1,2")
                # systemd's own record of the unit going inactive (the unit
                # itself is unloaded once inactive: its properties go).
                until [ "$(deactivated)" -gt "$n0" ]; do
                    sleep 0.1
                done
                down=$(ct journalctl -b -u "berth@$g.service" -o json --output-fields=MESSAGE |
                    python3 -c 'import json, sys
last = [r for r in map(json.loads, sys.stdin) if r.get("MESSAGE", "").endswith("Deactivated successfully.")][-1]
print(last["__REALTIME_TIMESTAMP"])')
                python3 - "$off" "$down" <<'PY'
import sys
from datetime import datetime
off = datetime.strptime(sys.argv[1].rstrip(':'), "%Y-%m-%d %H:%M:%S.%f%z").timestamp()
print(round((int(sys.argv[2]) / 1e6 - off) * 1000, 1))
PY
            done
        ) &
    done
    local rc=0 job
    for job in $(jobs -p); do wait "$job" || rc=1; done
    [ "$rc" = 0 ] || die "a latency loop failed"
}

percentiles() {
    python3 -c '
import sys
v = sorted(float(x) for x in sys.stdin.read().split())
if not v:
    sys.exit("no samples")
pick = lambda p: v[min(len(v) - 1, max(0, int(round(p / 100 * len(v) + 0.5)) - 1))]
print(f"p50 {pick(50):.0f} ms, p99 {pick(99):.0f} ms, max {v[-1]:.0f} ms over {len(v)} samples")'
}

# idle_cpu: ms of CPU per guest over IDLE_S, watchers and their children.
idle_cpu() {
    local g pids
    for g in $NAMES; do ct systemctl start "berth@idle-$g.service"; done
    sleep 10
    cpu() {
        ct sh -c 'tck=$(getconf CLK_TCK); t=0
            for u in '"$(for g in $NAMES; do printf 'berth@idle-%s.service ' "$g"; done)"'; do
                p=$(systemctl show -P MainPID "$u")
                for q in $p $(cat /proc/$p/task/*/children 2>/dev/null); do
                    set -- $(cut -d")" -f2 /proc/$q/stat)
                    t=$((t + ${12} + ${13} + ${14} + ${15}))
                done
            done
            echo $((t * 1000 / tck))'
    }
    local before after
    before=$(cpu)
    sleep "$IDLE_S"
    after=$(cpu)
    for g in $NAMES; do ct systemctl stop "berth@idle-$g.service"; done
    echo $(((after - before) / GUESTS))
}

set_mode events
events_lat=$(latency | percentiles)
events_cpu=$(idle_cpu)
set_mode poll
poll_lat=$(latency | percentiles)
poll_cpu=$(idle_cpu)
ct_poweroff 180

echo "guest power-off to unit inactive: Debian $SUITE, $GUESTS QEMU guests (TCG) powering themselves off $SAMPLES times each"
echo "  libvirt's events (berth-libvirt): $events_lat (issue 36: p50 <= 100, p99 <= 250)"
echo "  virsh every 2 s:                  $poll_lat"
echo "watcher CPU while its guest runs, per guest over $IDLE_S s:"
echo "  libvirt's events: $events_cpu ms; virsh every 2 s: $poll_cpu ms"
