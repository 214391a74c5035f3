#!/usr/bin/env bash
# Issue 12, then 36: drain time of N libvirt guests against libvirt-guests'
# PARALLEL_SHUTDOWN at the same parallelism, on the same guests in the same
# run, inside the harness's libvirt root (real libvirt, QEMU under TCG).
# For each N in COUNTS (default "3 10"), RUNS (default 3) rounds of: berth's
# drain (`berth drain` by hand, the code a shutdown runs, drain_parallelism
# = PARALLEL), then libvirt-guests' (`systemctl stop libvirt-guests`, its
# shutdown action, ON_SHUTDOWN=shutdown, PARALLEL_SHUTDOWN = PARALLEL); the
# medians and their ratio are printed. Every guest is covered by [libvirt]
# guests = "all" (no file per guest) and takes SHUTDOWN_S (5) seconds from
# the ACPI button to its power-off, like an OS stopping its services: the
# ideal is ceil(N / PARALLEL) rounds of that. Needs root, systemd-nspawn
# and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
SHUTDOWN_S=${SHUTDOWN_S:-5}
COUNTS=${COUNTS:-3 10}
PARALLEL=${PARALLEL:-2}
RUNS=${RUNS:-3}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
trap 'ct_cleanup' EXIT

ms() { date +%s%3N; }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for count in $COUNTS; do
    harness_libvirt_root
    VM=$HARNESS_DIR/run/bench-libvirt-vm
    guest_files "$VM"
    GUESTS=$(seq -f 'bench-g%g' 1 "$count" | xargs)
    for g in $GUESTS; do
        harness_define_guest "$g" "shutdown_delay=$SHUTDOWN_S"
        cp "$GUEST_DIR/disk.img" "$VM/$g.img"
    done
    config=$HARNESS_DIR/config-bench-libvirt
    rm -rf "$config"
    mkdir -p "$config"
    printf 'drain_parallelism = %s\ndrain_deadline_s = 1200\n\n[libvirt]\nguests = "all"\nautostart = true\nstop_delay_s = 300\n' \
        "$PARALLEL" >"$config/berth.toml"
    ROOTFS=$VIRT_ROOTFS
    CT_NSPAWN_OPTS=(--bind="$VM:/vm")
    # all_up N: every guest's console shows its Nth acpid start (the
    # consoles are appended to across starts).
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

    ct_boot bench-libvirt "$config"
    ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
    ct sh -c "printf 'ON_BOOT=ignore\nON_SHUTDOWN=shutdown\nPARALLEL_SHUTDOWN=$PARALLEL\nSHUTDOWN_TIMEOUT=300\n' >/etc/default/libvirt-guests"
    berth=() guests=()
    boots=1
    for run in $(seq 1 "$RUNS"); do
        if [ "$run" -gt 1 ]; then
            for g in $GUESTS; do ct systemctl start --no-block "berth@$g.service"; done
            boots=$((boots + 1))
        fi
        wait_for 300 all_up "$boots" || die "the guests did not boot (run $run); see $VM/*.serial"
        t0=$(ms)
        ct berth drain >/dev/null 2>&1
        berth+=($(($(ms) - t0)))
        all_off || die "guests still running after berth drain"
        outcomes=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join(sorted(set(w["outcome"] for w in r["workloads"]))), len(r["workloads"]))' \
            "$CT_DIR/state/last-drain.json")
        [ "$outcomes" = "GracefulOff $count" ] || die "berth drain outcomes: $outcomes"

        # libvirt-guests: the same guests, started outside berth (their
        # units stay down), stopped by its shutdown action.
        for g in $GUESTS; do ct virsh -q start "$g" >/dev/null; done
        boots=$((boots + 1))
        wait_for 300 all_up "$boots" || die "the guests did not boot again (run $run); see $VM/*.serial"
        ct systemctl start libvirt-guests.service
        t0=$(ms)
        ct systemctl stop libvirt-guests.service
        guests+=($(($(ms) - t0)))
        all_off || die "guests still running after libvirt-guests stopped"
    done
    ct_poweroff 300
    b=$(median "${berth[@]}")
    l=$(median "${guests[@]}")
    rounds=$(((count + PARALLEL - 1) / PARALLEL))
    echo "libvirt drain: Debian $SUITE, $count QEMU guests (TCG), $PARALLEL at a time, each ${SHUTDOWN_S} s from the ACPI button to power-off; ideal $rounds rounds: $((rounds * SHUTDOWN_S * 1000)) ms"
    printf '  berth drain (drain_parallelism = %s): %s ms (runs: %s)\n' "$PARALLEL" "$b" "${berth[*]}"
    printf '  libvirt-guests stop (PARALLEL_SHUTDOWN=%s): %s ms (runs: %s)\n' "$PARALLEL" "$l" "${guests[*]}"
    printf '  ratio of the medians, berth / libvirt-guests: %.3f (issue 36: at most 1.05)\n' \
        "$(awk -v a="$b" -v b="$l" 'BEGIN { print a / b }')"
done
