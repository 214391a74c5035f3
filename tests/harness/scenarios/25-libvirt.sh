#!/usr/bin/env bash
# harness-job: class=heavy minutes=1.2
# Issue 12: libvirt guests as workloads, with a real QEMU guest (TCG) under
# libvirt and machined. At boot the autostart starts the guests in order
# (QEMU in a machine-qemu scope, its unit following it); a daemon restart
# leaves QEMU alone; at power-off the drain runs before libvirt stops the
# machine scopes: the guest gets ACPI, unmounts its disk and powers off
# (GracefulOff, a clean ext4 from the host), and the guest that ignores
# ACPI is destroyed at its stop delay (ForcedOff). A guest with
# stop_action = "save" is saved (Saved) and resumed at the next boot: its
# console goes on counting, without a second boot of its kernel.
# autostart = "last-state" starts again the guests that ran at the last
# shutdown (a ForcedOff one too) and leaves off the one the admin stopped;
# check --live warns about libvirt settings and states that fight berth.
# The guests' units run under a German locale (an admin drop-in gives them
# LANG), in which libvirt translates every state virsh prints.
source "$(dirname "$0")/../lib.sh"
scenario_begin 25-libvirt

harness_libvirt_root
harness_define_guest berth-vm1
harness_define_guest berth-vm2 ignore_acpi=1
harness_define_guest berth-vm3
ROOTFS=$VIRT_ROOTFS
mkdir -p "$ROOTFS/etc/systemd/system/berth@.service.d"
printf '[Service]\nEnvironment=LANG=%s\n' "$VIRT_LOCALE" >"$ROOTFS/etc/systemd/system/berth@.service.d/50-locale.conf"
# The guests' files, bound as /vm: kernel, initramfs, a disk and a console
# log each (outside CT_DIR, which ct_boot empties).
VM=$HARNESS_DIR/run/libvirt-vm
rm -rf "$VM"
mkdir -p "$VM"
chmod 755 "$VM"
cp "$GUEST_DIR/vmlinuz" "$GUEST_DIR/initrd.gz" "$VM/"
for g in berth-vm1 berth-vm2 berth-vm3; do cp "$GUEST_DIR/disk.img" "$VM/$g.img"; done
# Managed save images outlive the (volatile) root, as on a host.
mkdir -p "$VM/save"
CT_NSPAWN_OPTS=(--bind="$VM:/vm" --bind="$VM/save:/var/lib/libvirt/qemu/save")
run() { out=$(ct "$@" 2>&1) && rc=0 || rc=$?; }

ct_boot libvirt "$REPO/tests/harness/config/libvirt"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true

check_eq "the guests' units run under $VIRT_LOCALE" "LANG=$VIRT_LOCALE" "$(ct_prop berth@vm.service Environment)"
check_eq "... in which virsh speaks German" "laufend" "$(ct env LANG=$VIRT_LOCALE virsh -q domstate berth-vm1 | head -n1)"
for w in vm stubborn saved app; do
    check_eq "berth@$w started by the autostart" active "$(ct_prop "berth@$w.service" ActiveState)"
done
vm_up=$(ct_prop berth@vm.service ActiveEnterTimestampMonotonic)
app_start=$(ct_prop berth@app.service ExecMainStartTimestampMonotonic)
check "the next group started once the guest ran ($vm_up <= $app_start)" test "$vm_up" -le "$app_start"
check_eq "the domain runs" running "$(ct virsh -q domstate berth-vm1 | head -n1)"
qemu=$(ct cat /run/libvirt/qemu/berth-vm1.pid)
check_contains "QEMU ($qemu) runs in a machine scope, not in the unit" 'machine.slice/machine-qemu' \
    "$(ct cat "/proc/$qemu/cgroup")"
check "the guest booted and mounted its disk" wait_for 60 grep -q "guest: disk mounted rw" "$VM/berth-vm1.serial"
check_contains "the drain wants virt-guest-shutdown.target" virt-guest-shutdown.target "$(ct_prop berth-drain.service Wants)"
check_contains "... is ordered after it and libvirt-guests.service" libvirt-guests.service "$(ct_prop berth-drain.service After)"
check_exposure berth@vm.service 5
run berth check --live
check_eq "check --live: exit 0" 0 "$rc"
check_lacks "... and no warning with Debian's libvirt settings" "live: warning:" "$out"

# A daemon restart leaves QEMU and the unit's watcher alone.
watcher=$(ct_prop berth@vm.service MainPID)
ct systemctl restart berth-daemon.service
ct systemctl is-active --wait berth-daemon.service >/dev/null 2>&1 || true
check_eq "a daemon restart left QEMU running: same pid" "$qemu" "$(ct cat /run/libvirt/qemu/berth-vm1.pid)"
check_eq "... and the watcher" "$watcher" "$(ct_prop berth@vm.service MainPID)"

ct_poweroff 180
check "power-off completed" test -z "$CT_PID"
check "outcomes: the guest GracefulOff, the stubborn one ForcedOff at its delay (last-drain.json)" \
    python3 - "$CT_DIR" <<'PY'
import json, sys
report = json.load(open(f"{sys.argv[1]}/state/last-drain.json"))
got = {w["workload"]: (w["outcome"], w.get("code")) for w in report["workloads"]}
want = {"vm": ("GracefulOff", None), "stubborn": ("ForcedOff", "E_DRAIN_FORCED_OFF"), "app": ("GracefulOff", None),
        "saved": ("Saved", None)}
assert got == want, f"{got} != {want}"
w = {x["workload"]: x for x in report["workloads"]}
assert 3000 <= w["stubborn"]["elapsed_ms"] < 13000, f"forced after {w['stubborn']['elapsed_ms']} ms, delay 3 s"
assert w["vm"]["started_ms"] >= w["app"]["started_ms"] + w["app"]["elapsed_ms"], "the guest stopped before app was down"
PY
serial=$(cat "$VM/berth-vm1.serial")
check_contains "the guest got the ACPI power button" "guest: acpi power button, shutting down" "$serial"
check_contains "... and unmounted its disk" "guest: disk unmounted" "$serial"
state=$(dumpe2fs -h "$VM/berth-vm1.img" 2>/dev/null)
check_contains "its disk is clean from the host" "Filesystem state:         clean" "$state"
check_lacks "... and needs no journal recovery" needs_recovery "$(printf '%s\n' "$state" | grep '^Filesystem features:')"
check_lacks "the stubborn guest never got the button handled" "acpi power button" "$(cat "$VM/berth-vm2.serial")"
check_contains "the drain said so on the console" "berth: berth@stubborn.service ForcedOff" \
    "$(sed 's/\x1b\[[0-9;]*m//g' "$CT_DIR/console.log" | tr -d '\r')"
check "the saved guest's memory is in libvirt's managed save image" test -s "$VM/save/berth-vm3.save"
last_tick() { grep -o 'guest: tick [0-9]*' "$VM/berth-vm3.serial" | tail -n1 | grep -o '[0-9]*$'; }
before=$(last_tick)

# The next boot: the autostart starts its unit, whose `virsh start` resumes it.
CT_KEEP_STATE=1 ct_boot libvirt ""
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
check_eq "the saved guest's unit is started at boot" active "$(ct_prop berth@saved.service ActiveState)"
check "its console counts on from tick $before" wait_for 30 sh -c "test \"\$(grep -o 'guest: tick [0-9]*' '$VM/berth-vm3.serial' | tail -n1 | grep -o '[0-9]*\$')\" -gt $before"
check_eq "... without booting its kernel again" 1 "$(grep -c 'guest: init started' "$VM/berth-vm3.serial")"
check "the save image is gone once resumed" test ! -e "$VM/save/berth-vm3.save"
# last-state: vm (GracefulOff) and stubborn (ForcedOff) ran at the last
# shutdown and were started again.
check_eq "last-state: the guest that shut down at the drain is started again" active "$(ct_prop berth@vm.service ActiveState)"
check_eq "last-state: the guest forced off at the drain is started again" active "$(ct_prop berth@stubborn.service ActiveState)"
# The admin stops vm before the next power-off: it stays off after it.
ct systemctl stop berth@vm.service
check_eq "the admin's stop shut the guest down" "shut off" "$(ct virsh -q domstate berth-vm1 | head -n1)"
ct_poweroff 180
check "the second drain: saved Saved, stubborn ForcedOff, vm AlreadyOff" python3 - "$CT_DIR" <<'PY'
import json, sys
report = json.load(open(f"{sys.argv[1]}/state/last-drain.json"))
got = {w["workload"]: w["outcome"] for w in report["workloads"]}
want = {"vm": "AlreadyOff", "stubborn": "ForcedOff", "app": "GracefulOff", "saved": "Saved"}
assert got == want and report["shutdown"] is True, f"{got} != {want}, shutdown={report['shutdown']}"
PY

CT_KEEP_STATE=1 ct_boot libvirt ""
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
check_eq "last-state: the guest the admin stopped stays off" inactive "$(ct_prop berth@vm.service ActiveState)"
check_eq "... its domain too" "shut off" "$(ct virsh -q domstate berth-vm1 | head -n1)"
check_eq "last-state: the one forced off is started" active "$(ct_prop berth@stubborn.service ActiveState)"
check_contains "the autostart says why vm stays off" \
    'not starting berth@vm.service: autostart = "last-state" and it was stopped when the last shutdown drain began' \
    "$(ct journalctl -b -u berth-autostart.service -o cat --no-pager)"

# A guest that goes off by itself ends its unit, whatever the language.
ct virsh -q destroy berth-vm2 >/dev/null
stubborn_down() { [ "$(ct_prop berth@stubborn.service ActiveState)" != active ]; }
check "a guest destroyed behind berth's back ends its unit" wait_for 20 stubborn_down

# check --live names what fights berth over its guests.
ct virsh -q start berth-vm1 >/dev/null
ct virsh -q autostart berth-vm2 >/dev/null
ct sh -c 'echo ON_BOOT=start >>/etc/default/libvirt-guests'
ct sh -c 'echo "auto_shutdown_try_shutdown = \"all\"" >>/etc/libvirt/qemu.conf'
run berth check --live
check_eq "check --live: warnings keep exit 0" 0 "$rc"
check_contains "warns: a guest runs without its unit" \
    "live: warning: libvirt domain berth-vm1 runs, but berth@vm.service is not active" "$out"
check_contains "warns: libvirt's autostart flag" \
    "live: warning: libvirt domain berth-vm2 (workload stubborn) has libvirt's autostart flag" "$out"
check_contains "warns: libvirt-guests' ON_BOOT=start" \
    "live: warning: libvirt-guests.service is enabled with ON_BOOT=start (/etc/default/libvirt-guests)" "$out"
check_contains "warns: the QEMU driver's own shutdown actions" \
    'live: warning: /etc/libvirt/qemu.conf sets auto_shutdown_try_shutdown = "all"' "$out"
# A managed-save image of a workload with autostart = false: no boot
# resumes it.
ct virsh -q managedsave berth-vm1 >/dev/null
sed -i 's/^autostart = .*/autostart = false/' "$CT_DIR/etc-berth/workloads/vm.toml"
run berth check --live
check_contains "warns: a managed save no boot resumes" \
    "live: warning: libvirt domain berth-vm1 has a managed-save image, but berth@vm.service is down and workload vm has autostart = false: no boot resumes it" "$out"
ct virsh -q managedsave-remove berth-vm1 >/dev/null
ct_poweroff 180
check_contains "saved again at the third power-off" '"outcome": "Saved"' "$(cat "$CT_DIR/state/last-drain.json")"
