#!/usr/bin/env bash
# Issue 12: drain time of 4 libvirt guests, 2 at a time, against
# libvirt-guests' PARALLEL_SHUTDOWN=2 on the same guests in the same run,
# inside the harness's libvirt root (real libvirt, QEMU under TCG). Each
# guest takes SHUTDOWN_S (5) seconds from the ACPI power button to its
# power-off, like an OS stopping its services; the ideal is 2 rounds of
# that. berth's side is `berth drain` run by hand (the same code a
# shutdown runs); libvirt-guests' is `systemctl stop libvirt-guests`, its
# shutdown action, with ON_SHUTDOWN=shutdown. Needs root, systemd-nspawn
# and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
SHUTDOWN_S=${SHUTDOWN_S:-5}
GUESTS="bench-g1 bench-g2 bench-g3 bench-g4"

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
trap 'ct_cleanup' EXIT

harness_libvirt_root
VM=$HARNESS_DIR/run/bench-libvirt-vm
rm -rf "$VM"
mkdir -p "$VM"
chmod 755 "$VM"
cp "$GUEST_DIR/vmlinuz" "$GUEST_DIR/initrd.gz" "$VM/"
config=$HARNESS_DIR/config-bench-libvirt
rm -rf "$config"
mkdir -p "$config/workloads"
printf 'drain_parallelism = 2\ndrain_deadline_s = 600\n' >"$config/berth.toml"
for g in $GUESTS; do
    harness_define_guest "$g" "shutdown_delay=$SHUTDOWN_S"
    cp "$GUEST_DIR/disk.img" "$VM/$g.img"
    printf 'libvirt = "%s"\nstop_delay_s = 120\n' "$g" >"$config/workloads/$g.toml"
done
ROOTFS=$VIRT_ROOTFS
CT_NSPAWN_OPTS=(--bind="$VM:/vm")

# all_up N: every guest's console shows its Nth acpid start (the consoles
# are appended to across starts).
all_up() {
    local g
    for g in $GUESTS; do
        [ "$(grep -c 'guest: acpid started' "$VM/$g.serial" 2>/dev/null)" -ge "$1" ] || return 1
    done
}
all_off() {
    local g
    for g in $GUESTS; do
        [ "$(ct virsh -q domstate "$g" | head -n1)" = "shut off" ] || return 1
    done
}
ms() { date +%s%3N; }

ct_boot bench-libvirt "$config"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
wait_for 180 all_up 1 || die "the guests did not boot; see $VM/*.serial"

# berth: the drain, 2 at a time.
t0=$(ms)
ct berth drain >/dev/null 2>&1
berth_ms=$(($(ms) - t0))
all_off || die "guests still running after berth drain"
outcomes=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join(sorted(w["outcome"] for w in r["workloads"])))' \
    "$CT_DIR/state/last-drain.json")
[ "$outcomes" = "GracefulOff GracefulOff GracefulOff GracefulOff" ] || die "berth drain outcomes: $outcomes"

# libvirt-guests: the same guests, started again outside berth (their
# units stay down), stopped by its shutdown action 2 at a time.
for g in $GUESTS; do ct virsh -q start "$g" >/dev/null; done
wait_for 180 all_up 2 || die "the guests did not boot again; see $VM/*.serial"
ct sh -c 'printf "ON_BOOT=ignore\nON_SHUTDOWN=shutdown\nPARALLEL_SHUTDOWN=2\nSHUTDOWN_TIMEOUT=300\n" >/etc/default/libvirt-guests'
ct systemctl start libvirt-guests.service
t0=$(ms)
ct systemctl stop libvirt-guests.service
guests_ms=$(($(ms) - t0))
all_off || die "guests still running after libvirt-guests stopped"
ct_poweroff 120

echo "libvirt drain: Debian $SUITE, 4 QEMU guests (TCG), each ${SHUTDOWN_S} s from the ACPI button to power-off; ideal 2 rounds: $((2 * SHUTDOWN_S * 1000)) ms"
printf 'berth drain (drain_parallelism = 2): %d ms; libvirt-guests stop (PARALLEL_SHUTDOWN=2): %d ms; ratio %.2f\n' \
    "$berth_ms" "$guests_ms" "$(awk -v a="$berth_ms" -v b="$guests_ms" 'BEGIN { print a / b }')"
