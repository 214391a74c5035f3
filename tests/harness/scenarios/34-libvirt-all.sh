#!/usr/bin/env bash
# harness-job: class=heavy minutes=0.8
# Issue 36: every libvirt guest a workload, without a file per guest.
# berth.toml's [libvirt] guests = "all" covers each persistent domain
# (read from /etc/libvirt/qemu by the generator) except the excluded ones:
# at boot the autostart starts them, `berth check` lists them, and
# check --live calls Debian's enabled libvirt-guests a problem with its
# fix. A domain defined after boot is named by check --live and covered by
# `berth reload`; an excluded guest is left alone until `berth add
# --libvirt` makes it one; a guest that powers itself off ends its unit
# cleanly; at power-off the guest whose only way down is its agent (it
# ignores ACPI; a stand-in agent, see tests/harness/guests/agent) goes
# down through it: the default shutdown_mode is agent, then ACPI. The
# watchers follow their guests by libvirt's events and act on them by
# libvirt's API (berth-libvirt): a virsh that logs who runs it sees
# nothing of berth's.
source "$(dirname "$0")/../lib.sh"
scenario_begin 34-libvirt-all

harness_libvirt_root
harness_define_guest allg-a
harness_define_guest allg-agent "agent=1 ignore_acpi=1"
harness_define_guest allg-skip
ROOTFS=$VIRT_ROOTFS
VM=$HARNESS_DIR/run/libvirt-all-vm
rm -rf "$VM"
mkdir -p "$VM"
chmod 755 "$VM"
cp "$GUEST_DIR/vmlinuz" "$GUEST_DIR/initrd.gz" "$VM/"
for g in allg-a allg-agent allg-skip allg-late; do cp "$GUEST_DIR/disk.img" "$VM/$g.img"; done
# Defined at run time: it powers itself off after 20 s.
guest_xml allg-late "lifetime=20" >"$VM/allg-late.xml"
CT_NSPAWN_OPTS=(--bind="$VM:/vm")
run() { out=$(ct "$@" 2>&1) && rc=0 || rc=$?; }

ct_boot libvirt-all "$REPO/tests/harness/config/libvirt-all"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
# From here on every virsh run is logged with its parent's name.
ct sh -c 'mv /usr/bin/virsh /usr/bin/virsh.real && printf "%s\n" "#!/bin/sh" \
    "echo \"\$(cat /proc/\$PPID/comm 2>/dev/null): \$*\" >>/vm/virsh-calls" "exec /usr/bin/virsh.real \"\$@\"" >/usr/bin/virsh && chmod 755 /usr/bin/virsh'
check_eq "no workload files at all" "" "$(ct ls /etc/berth/workloads 2>/dev/null)"
for g in allg-a allg-agent; do
    check_eq "berth@$g (no file of its own) started by the autostart" active "$(ct_prop "berth@$g.service" ActiveState)"
    check_eq "... its domain runs" running "$(ct virsh -q domstate "$g" | head -n1)"
done
check_eq "the excluded guest has no drop-in" "" "$(ct_prop berth@allg-skip.service DropInPaths)"
check_eq "... and was left off" "shut off" "$(ct virsh -q domstate allg-skip | head -n1)"
check "the agent guest's stand-in agent listens" wait_for 60 grep -q "guest: agent: listening" "$VM/allg-agent.serial"
check_contains "each watcher follows its guest by libvirt's events (berth-libvirt)" "/usr/libexec/berth/berth-libvirt follow allg-a " \
    "$(ct sh -c 'for p in /proc/[0-9]*; do tr "\0" " " <"$p/cmdline"; echo; done 2>/dev/null')"
check_exposure berth@allg-a.service 5
run berth check
check_contains "berth check lists a covered guest with its shutdown modes" \
    'berth@allg-a.service (/etc/libvirt/qemu/allg-a.xml) [autostart: last-state]: libvirt domain allg-a (guests = "all"), shut down by agent,acpi' "$out"
run berth cat allg-a
check_contains "berth cat says there is no file" 'no workload file: the libvirt domain defined in /etc/libvirt/qemu/allg-a.xml' "$out"

check_eq "Debian enables libvirt-guests" enabled "$(ct systemctl is-enabled libvirt-guests.service)"
run berth check --live
check_eq "check --live: exit 1 with libvirt-guests enabled" 1 "$rc"
check_contains "... a problem with its fix" \
    'live: problem: libvirt-guests.service is enabled while [libvirt] guests = "all" makes every guest berth'"'"'s' "$out"
check_contains "... the fix" 'run `systemctl disable libvirt-guests.service` (without --now' "$out"
ct systemctl disable libvirt-guests.service >/dev/null 2>&1
run berth check --live
check_eq "check --live: exit 0 once disabled" 0 "$rc"

# A domain defined after boot: named by check --live, covered by a reload.
ct virsh -q define /vm/allg-late.xml >/dev/null
run berth check --live
check_contains "check --live names the domain defined since the last reload" \
    'live: warning: libvirt domain allg-late is covered by [libvirt] guests = "all", but systemd has not loaded' "$out"
check_contains "... and the fix" '`berth reload` covers it' "$out"
ct berth reload >/dev/null
ct systemctl start berth@allg-late.service
check_eq "after berth reload the new guest's unit runs it" active "$(ct_prop berth@allg-late.service ActiveState)"
run berth check --live
check_lacks "... and check --live says nothing more of it" "allg-late is covered" "$out"

# The excluded guest: started by hand, left alone; then made a workload.
ct virsh -q start allg-skip >/dev/null
check_eq "an excluded guest started by hand has no unit" inactive "$(ct_prop berth@allg-skip.service ActiveState)"
run berth remove allg-a
check_eq "berth remove of a covered guest: refused" 1 "$rc"
check_contains "... saying how to leave it out" 'add it to [libvirt] exclude in berth.toml, or mask it' "$out"
ct berth add skipper --libvirt allg-skip --no-autostart --stop-delay 20 --shutdown-mode acpi --now >/dev/null
check_eq "berth add --libvirt adopts the running guest" active "$(ct_prop berth@skipper.service ActiveState)"
check_contains "... its file names the domain" 'libvirt = "allg-skip"' "$(ct cat /etc/berth/workloads/skipper.toml)"
check_contains "... and its shutdown mode" 'argv[]=berth guest allg-skip --stop-delay 20 --shutdown-mode acpi ;' "$(ct_prop berth@skipper.service ExecStart)"

# A guest that powers itself off ends its unit, as a success.
late_down() { [ "$(ct_prop berth@allg-late.service ActiveState)" = inactive ]; }
check "the guest that powered itself off ended its unit" wait_for 90 late_down
check_eq "... cleanly" success "$(ct_prop berth@allg-late.service Result)"
check_contains "... from inside" "guest: lifetime over, powering off" "$(cat "$VM/allg-late.serial")"
check_contains "... noticed by libvirt's event, not a poll" "guest allg-late is down (stopped: shutdown)" \
    "$(ct journalctl -b -u berth@allg-late.service -o cat --no-pager)"

ct_poweroff 180
check "power-off completed" test -z "$CT_PID"
check "outcomes: every guest GracefulOff, the one down already AlreadyOff" python3 - "$CT_DIR" <<'PY'
import json, sys
report = json.load(open(f"{sys.argv[1]}/state/last-drain.json"))
got = {w["workload"]: w["outcome"] for w in report["workloads"]}
want = {"allg-a": "GracefulOff", "allg-agent": "GracefulOff", "allg-late": "AlreadyOff", "skipper": "GracefulOff"}
assert got == want, f"{got} != {want}"
w = {x["workload"]: x for x in report["workloads"]}
assert w["allg-agent"]["elapsed_ms"] < 30000, f"the agent guest took {w['allg-agent']['elapsed_ms']} ms: forced?"
PY
agent_serial=$(cat "$VM/allg-agent.serial")
check_contains "the agent guest went down through its agent" "guest: agent: guest-shutdown, shutting down" "$agent_serial"
check_contains "... and unmounted its disk" "guest: disk unmounted" "$agent_serial"
check_contains "the plain guest got the ACPI button (no agent channel)" "guest: acpi power button" "$(cat "$VM/allg-a.serial")"
virsh_calls=$(cat "$VM/virsh-calls" 2>&1)
check_contains "the logging virsh saw the scenario's own calls" "define /vm/allg-late.xml" "$virsh_calls"
check_lacks "... and none of berth's: its start, check, shutdown by libvirt's API" "berth:" "$virsh_calls"

