#!/usr/bin/env bash
# harness-job: minutes=0.1
# Issue 5: `berth check --live` reads the loaded units, admin drop-ins
# included, and reports what breaks the lifecycle invariants: a workload
# tied by Requires= to a unit the shutdown transaction stops, a PartOf=,
# a drain that lost its ExecStop or its protections. Each problem names
# the drop-in it came from; the packaged topology has none.
source "$(dirname "$0")/../lib.sh"
scenario_begin 16-check-live

ct_boot live "$REPO/tests/harness/config/pair"
R=/proc/$CT_PID/root
run() { out=$(ct "$@" 2>&1) && rc=0 || rc=$?; }

run berth check --live
check_eq "the packaged topology: exit 0" "0" "$rc"
check_contains "... no problem" "live: the drain, berth.slice and 2 workload unit(s) keep the lifecycle invariants" "$out"

# An admin ties workload a to an ordinary service (default dependencies:
# Conflicts=shutdown.target) and makes b part of berth.target.
printf '[Service]\nExecStart=/bin/sleep infinity\n' >"$R/etc/systemd/system/db.service"
ct mkdir -p /etc/systemd/system/berth@a.service.d /etc/systemd/system/berth@b.service.d
printf '[Unit]\nRequires=db.service\nAfter=db.service\n' >"$R/etc/systemd/system/berth@a.service.d/override.conf"
printf '[Unit]\nPartOf=berth.target\n' >"$R/etc/systemd/system/berth@b.service.d/override.conf"
ct systemctl daemon-reload
run berth check --live
check_eq "admin drop-ins that break the invariants: exit 1" "1" "$rc"
check_contains "... a Requires= on a unit stopped at shutdown" \
    "berth@a.service is stopped by the shutdown transaction itself (berth@a.service has Requires=db.service, and db.service (/etc/systemd/system/db.service) has Conflicts=shutdown.target)" "$out"
check_contains "... naming the drop-in" "admin drop-ins: /etc/systemd/system/berth@a.service.d/override.conf" "$out"
check_contains "... a PartOf=" "berth@b.service has PartOf=berth.target" "$out"
check_contains "... counted" "live: 2 problem(s)" "$out"
ct rm -rf /etc/systemd/system/berth@a.service.d /etc/systemd/system/berth@b.service.d

# An admin empties the drain's ExecStop and lifts its protections.
ct mkdir -p /etc/systemd/system/berth-drain.service.d
printf '[Unit]\nRefuseManualStop=no\n[Service]\nExecStop=\n' >"$R/etc/systemd/system/berth-drain.service.d/override.conf"
ct systemctl daemon-reload
run berth check --live
check_eq "a drain without its ExecStop: exit 1" "1" "$rc"
check_contains "... reported" 'berth-drain.service has no ExecStop running `berth drain`' "$out"
check_contains "... and its manual-stop protection" "berth-drain.service lost RefuseManualStop=yes" "$out"
check_contains "... naming the drop-in" "admin drop-ins: /etc/systemd/system/berth-drain.service.d/override.conf" "$out"
ct rm -rf /etc/systemd/system/berth-drain.service.d
ct systemctl daemon-reload
run berth check --live
check_eq "with the drop-ins gone: exit 0 again" "0" "$rc"
ct_poweroff 120
