#!/usr/bin/env bash
# harness-job: minutes=0.6
# Issue 5: `berth install` / `berth uninstall` for the system manager.
# With packaged units (the root has berth from `make install PREFIX=/usr`,
# what a package ships): install only enables, starts and proves it; it
# writes no copies. From a "source tree" (the packaged files removed, the
# binaries copied elsewhere): it installs binary, units and generator under
# /usr/local, replaces them only after the old daemon has really stopped,
# and uninstall removes exactly that. Workloads never lose their
# invocation; failures name the step.
source "$(dirname "$0")/../lib.sh"
scenario_begin 14-install

ct_boot install "$REPO/tests/harness/config/pair"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
wl_ids() { for w in a b; do ct_prop "berth@$w.service" InvocationID; done | tr '\n' ' '; }
run() { out=$(ct "$@" 2>&1) && rc=0 || rc=$?; }

# What a package leaves behind: nothing enabled, nothing of berth's
# running but the drain and the workloads this boot started.
ct systemctl disable berth.target >/dev/null 2>&1
ct systemctl stop berth-daemon.service berth.target
ids=$(wl_ids)
check_eq "two workloads running" "active active" "$(ct_prop berth@a.service ActiveState) $(ct_prop berth@b.service ActiveState)"

run /usr/bin/berth install
check_eq "install (packaged units): exit 0" "0" "$rc"
check_contains "... enables berth.target" "enabled berth.target" "$out"
check_contains "... proves the daemon stays up" "verified: berth-daemon.service active, MainPID" "$out"
check_eq "... berth.target is enabled" "enabled" "$(ct systemctl is-enabled berth.target)"
check_eq "... writes no copy that would shadow the package" "" "$(ct find /usr/local /etc/systemd/system -name 'berth*' ! -name berth.target)"
check_contains "... and records what it did" '"source": "package"' "$(cat "$CT_DIR/state/install.json")"
pid=$(ct_prop berth-daemon.service MainPID)
run /usr/bin/berth install
check_eq "install again: exit 0" "0" "$rc"
check_contains "... verified again" "verified: berth-daemon.service active" "$out"
check_lacks "... enables nothing" "enabled berth.target" "$out"
check_eq "... leaves the daemon alone" "$pid" "$(ct_prop berth-daemon.service MainPID)"
check_eq "... and the workloads" "$ids" "$(wl_ids)"

run /usr/bin/berth uninstall
check_eq "uninstall: exit 0" "0" "$rc"
check_eq "... disables berth.target" "disabled" "$(ct systemctl is-enabled berth.target)"
check_eq "... stops the daemon" "inactive" "$(ct_prop berth-daemon.service ActiveState)"
check_eq "... leaves the drain armed" "active" "$(ct_prop berth-drain.service ActiveState)"
check_eq "... and the workloads running" "$ids" "$(wl_ids)"
check "... keeps the state" test -d "$CT_DIR/state/records"
check "... and forgets the install" test ! -e "$CT_DIR/state/install.json"
run /usr/bin/berth uninstall
check_eq "uninstall again: exit 0" "0" "$rc"
check_contains "... nothing to undo" "nothing to undo" "$out"

# An admin enabled and started the target; install adds only the proof,
# and uninstall leaves the admin's target enabled and running.
ct systemctl enable --now berth.target >/dev/null 2>&1
run /usr/bin/berth install
check_contains "install over an admin's enabled target: verified" "verified: berth-daemon.service active" "$out"
check_lacks "... enables nothing" "enabled berth.target" "$out"
pid=$(ct_prop berth-daemon.service MainPID)
run /usr/bin/berth uninstall
check_eq "... uninstall leaves it enabled" "enabled" "$(ct systemctl is-enabled berth.target)"
check_eq "... and the daemon running" "$pid" "$(ct_prop berth-daemon.service MainPID)"
ct systemctl disable --now berth.target >/dev/null 2>&1
ct systemctl stop berth-daemon.service

# A daemon that cannot come up: install fails and names the step.
ct mkdir -p /run/systemd/system/berth-daemon.service.d
printf '[Service]\nExecStart=\nExecStart=/bin/false\n' >"/proc/$CT_PID/root/run/systemd/system/berth-daemon.service.d/broken.conf"
run /usr/bin/berth install
check_eq "install with a daemon that dies: exit 1" "1" "$rc"
check_contains "... names the step" "step 'verify' failed: berth-daemon.service is failed" "$out"
ct rm -rf /run/systemd/system/berth-daemon.service.d
ct systemctl reset-failed berth-daemon.service

# Without the daemon, the proof is the armed drain and the reached target.
printf '[daemon]\nenabled = false\n' >"$CT_DIR/etc-berth/berth.toml"
run /usr/bin/berth reload
check_eq "berth reload: exit 0" "0" "$rc"
run /usr/bin/berth install
check_eq "install with [daemon] enabled = false: exit 0" "0" "$rc"
check_contains "... proves the drain is armed" "verified: berth-drain.service active (drain armed), berth.target active" "$out"
run /usr/bin/berth uninstall
rm "$CT_DIR/etc-berth/berth.toml"

# From a source tree: take the packaged files away, keep the binaries.
ct sh -c 'mkdir -p /opt/src && cp /usr/bin/berth /usr/lib/systemd/system-generators/berth-generator /opt/src/'
ct sh -c 'rm -f /usr/bin/berth /usr/lib/systemd/system-generators/berth-generator /usr/lib/systemd/system/berth*'
ct systemctl daemon-reload

# A file install did not write is not replaced without --force.
ct sh -c 'mkdir -p /usr/local/bin && printf "#!/bin/sh\n" >/usr/local/bin/berth && chmod 755 /usr/local/bin/berth'
run /opt/src/berth install
check_eq "a foreign /usr/local/bin/berth: exit 1" "1" "$rc"
check_contains "... refused, naming it and --force" "/usr/local/bin/berth exist(s), differ(s) from what install would write" "$out"
check_eq "... and left alone" "#!/bin/sh" "$(ct cat /usr/local/bin/berth)"
ct rm /usr/local/bin/berth

run /opt/src/berth install --bindir /tmp/bin
check_eq "a bindir under /tmp: exit 1" "1" "$rc"
check_contains "... refused at preflight" "step 'preflight' failed: /tmp/bin is under /tmp" "$out"
ct sh -c 'mkdir -p /opt/tree/target && touch /opt/tree/Cargo.toml'
run /opt/src/berth install --bindir /opt/tree/target/bin
check_contains "a bindir in a build tree is refused" "inside a build or source tree (/opt/tree)" "$out"
ct sh -c 'mkdir -p /opt/src2 && cp /opt/src/berth /opt/src2/ && cp /opt/src/berth-generator /opt/src2/ && chmod 644 /opt/src2/berth-generator'
run /opt/src2/berth install
check_contains "a generator that is not executable is refused" "berth-generator is not executable" "$out"
check "... and nothing was written" test ! -e "/proc/$CT_PID/root/usr/local/bin/berth"

run /opt/src/berth install
check_eq "source install: exit 0" "0" "$rc"
check_contains "... writes binary, generator and 7 units" "wrote 9 file(s) of 9" "$out"
check_contains "... verified" "verified: berth-daemon.service active" "$out"
check_contains "the units run the installed binary" "ExecStop=/usr/local/bin/berth drain" "$(ct systemctl cat berth-drain.service)"
check "the generator ran from /usr/local" test -f "/proc/$CT_PID/root/run/systemd/generator/berth@a.service.d/10-berth.conf"
check_eq "workloads kept their invocations" "$ids" "$(wl_ids)"
pid=$(ct_prop berth-daemon.service MainPID)
run /opt/src/berth install
check_eq "install again: exit 0" "0" "$rc"
check_contains "... verified" "verified: berth-daemon.service active" "$out"
check_lacks "... writes nothing" "wrote" "$out"
check_eq "... and leaves the daemon alone" "$pid" "$(ct_prop berth-daemon.service MainPID)"
run /usr/local/bin/berth install
check_eq "install run by the installed binary: exit 0" "0" "$rc"
check_lacks "... writes nothing either" "wrote" "$out"
check_contains "... and verifies" "verified: berth-daemon.service active" "$out"

# A rebuilt binary: the old daemon is stopped (and really gone) first. Its
# stop is made to take 2 s (an ExecStop= that sleeps), so an install that
# did not wait would replace the binary 2 s before the daemon was down.
ct mkdir -p /run/systemd/system/berth-daemon.service.d
printf '[Service]\nExecStop=/bin/sleep 2\n' >"/proc/$CT_PID/root/run/systemd/system/berth-daemon.service.d/slow-stop.conf"
ct systemctl daemon-reload
ct sh -c 'printf "\n" >> /opt/src/berth'
run /opt/src/berth install
check_eq "reinstall of a new build: exit 0" "0" "$rc"
check_contains "... stops the old daemon before replacing files" "stopped berth-daemon.service before replacing its files" "$out"
check_contains "... replaces just the binary" "wrote 1 file(s) of 9" "$out"
check "... the old daemon process is gone" ct test ! -d "/proc/$pid"
# PID 1's own time stamp of the unit going inactive, against the file's
# mtime, which the kernel takes from its coarse clock (a few ms behind:
# measured 1.8 ms): 50 ms of slack, against the 2 s stop.
stopped_at=$(ct systemctl show -P InactiveEnterTimestamp --timestamp=us+utc berth-daemon.service)
written_at=$(ct stat -c %.9Y /usr/local/bin/berth)
check "... and was down before the binary was replaced ($stopped_at, file $written_at)" \
    python3 -c "import sys, datetime as d; t = d.datetime.strptime(sys.argv[1], '%a %Y-%m-%d %H:%M:%S.%f UTC').replace(tzinfo=d.timezone.utc).timestamp(); sys.exit(0 if t <= float(sys.argv[2]) + 0.05 else 1)" "$stopped_at" "$written_at"
ct rm -rf /run/systemd/system/berth-daemon.service.d
ct systemctl daemon-reload
check_eq "... a new daemon runs" "active" "$(ct_prop berth-daemon.service ActiveState)"
check_eq "... workloads untouched" "$ids" "$(wl_ids)"

apid=$(ct_prop berth@a.service MainPID)
run /usr/local/bin/berth uninstall --purge
check_eq "uninstall (source install) --purge: exit 0" "0" "$rc"
check_eq "... removes what install wrote" "" "$(ct find /usr/local -name 'berth*')"
check_contains "... says the workloads keep running undrained" "2 workload(s) left running: their units are gone" "$out"
check "... and they do" ct test -d "/proc/$apid"
check_eq "... purges the state" "" "$(ls -A "$CT_DIR/state")"
run /opt/src/berth uninstall
check_contains "uninstall again: nothing to undo" "nothing to undo" "$out"
ct_poweroff 120
