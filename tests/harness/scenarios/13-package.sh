#!/usr/bin/env bash
# harness-job: minutes=0.5 after=21-package-build
# The Debian package (built from the source package by scenario 21) on a
# host of its own: a fresh copy of the debootstrapped base, booted
# non-volatile so that it keeps its state across power-off like a real
# machine.
#  1. `dpkg -i` enables, starts and stops nothing; the group, state
#     directory, catalog and units are there, and the units verify;
#  2. the admin's config and `berth install` (enable, start, verify) run the
#     workloads; a real power-off drains them; the next boot starts them;
#  3. an upgrade to the next version (`dpkg -i`) leaves every
#     workload and the armed drain untouched (same InvocationID), keeps
#     berth.target enabled, and the daemon relaunches on its new binary
#     (it notices the replaced executable within one reconcile pass; exit
#     75, Restart=always), with no signal from the maintainer scripts;
#  4. `dpkg -r` with workloads running: they keep running (its
#     daemon-reload makes their units not-found, as measured); `dpkg
#     --purge` then removes berth's state and the enablement links
#     debhelper recorded, keeps /etc/berth and the group, and still stops
#     nothing; whether the power-off that follows drains is measured.
# The maintainer scripts are debhelper's (sysusers, tmpfiles, systemd with
# --no-enable --no-start --no-stop-on-upgrade --no-restart-after-upgrade):
# what is asserted is what they do to running units.
source "$(dirname "$0")/../lib.sh"
scenario_begin 13-package

command -v dpkg-parsechangelog >/dev/null || die "this needs dpkg-dev (tests/harness/deps installs it)"

# status_of COMMAND...: "0", or the exit status and what the command said.
status_of() {
    local out rc
    out=$("$@" 2>&1) && rc=0 || rc=$?
    if [ "$rc" = 0 ]; then echo 0; else printf 'exit %s\n%s\n' "$rc" "$out"; fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- the packages -------------------------------------------------------------
# Built from this run's source package in the suite's own build root by
# scenario 21, which runs first (and runs lintian on them); the next
# Debian revision is the same package with its version raised (what
# an upgrade looks like to dpkg: every file replaced, its scripts run with
# `upgrade`).
V1=$(dpkg-parsechangelog -l "$REPO/debian/changelog" -S Version)
V2=${V1%-*}-$((${V1##*-} + 1))
arch=$(dpkg --print-architecture)
DEB_DIR=$HARNESS_DIR/debs
DEB1=berth_${V1}_$arch.deb
DEB2=berth_${V2}_$arch.deb
[ -f "$DEB_DIR/$DEB1" ] || die "no $DEB_DIR/$DEB1: scenario 21 builds it (tests/harness/run runs it first)"
dsc=$(ls "${HARNESS_SOURCE:-/nonexistent}"/*.dsc 2>/dev/null) || die "no source package of this run (HARNESS_SOURCE)"
check_eq "the packages were built from this run's source package" \
    "$(sha256sum <"$dsc" | cut -d' ' -f1)" "$(cat "$DEB_DIR/source.sha256" 2>&1)"
repack=$HARNESS_DIR/run/$SCENARIO/repack
rm -rf "$repack" && mkdir -p "$repack"
dpkg-deb -R "$DEB_DIR/$DEB1" "$repack/tree"
sed -i "s/^Version: .*/Version: $V2/" "$repack/tree/DEBIAN/control"
dpkg-deb --root-owner-group -Zxz -b "$repack/tree" "$DEB_DIR/$DEB2" >/dev/null
check_eq "the package built from source is $V1" "$V1" "$(dpkg-deb -f "$DEB_DIR/$DEB1" Version 2>&1)"
check_eq "... and its copy as the next revision $V2" "$V2" "$(dpkg-deb -f "$DEB_DIR/$DEB2" Version 2>&1)"
check_lacks "berth depends on no libvirt" libvirt "$(dpkg-deb -f "$DEB_DIR/$DEB1" Depends 2>&1)"
check_lacks "... and ships no berth-libvirt" berth-libvirt "$(dpkg-deb -c "$DEB_DIR/$DEB1" 2>&1)"
helper_deb=berth-libvirt_${V1}_$arch.deb
check_contains "berth-libvirt, a package of its own, depends on libvirt0" libvirt0 "$(dpkg-deb -f "$DEB_DIR/$helper_deb" Depends 2>&1)"
check_contains "... and ships the helper where berth looks" ./usr/libexec/berth/berth-libvirt "$(dpkg-deb -c "$DEB_DIR/$helper_deb" 2>&1)"

# What the maintainer scripts do, read from the package itself.
ctrl=$HARNESS_DIR/run/$SCENARIO/package-control
rm -rf "$ctrl" && mkdir -p "$(dirname "$ctrl")"
dpkg-deb -e "$DEB_DIR/$DEB1" "$ctrl"
check_eq "maintainer scripts: postinst and postrm only" "postinst postrm" \
    "$(cd "$ctrl" && for f in preinst postinst prerm postrm; do [ ! -e "$f" ] || printf '%s ' "$f"; done | sed 's/ $//')"
code=$(cat "$ctrl"/postinst "$ctrl"/postrm | grep -v '^[[:space:]]*#')
check_eq "no script has a start or stop helper (deb-systemd-invoke, invoke-rc.d)" "" \
    "$(printf '%s\n' "$code" | grep -nE 'deb-systemd-invoke|invoke-rc\.d' || true)"
check_eq "... and its systemctl verbs are daemon-reload and show (a read)" "daemon-reload show" \
    "$(printf '%s\n' "$code" | grep -oE 'systemctl( --system)? [a-z-]+' | awk '{ print $NF }' | sort -u | xargs)"
check_contains "debhelper's sysusers snippet creates the group" "systemd-sysusers \${DPKG_ROOT:+--root=\"\$DPKG_ROOT\"} berth.conf" "$code"
check_contains "... and its tmpfiles snippet the directories" "--create berth.conf" "$code"
preset=$(dpkg-deb --fsys-tarfile "$DEB_DIR/$DEB1" | tar -xO --wildcards '*/system-preset/90-berth.preset' 2>&1 || true)
check_contains "the package has a preset" "disable berth.target" "$preset"
check_eq "... that enables nothing" "" "$(printf '%s\n' "$preset" | grep -vE '^(#|$|disable )' || true)"

# --- a host of its own ----------------------------------------------------------
CT_ROOT=$HARNESS_DIR/root-package
rm -rf "$CT_ROOT"
harness_package_base
cp -a "$PACKAGE_BASE" "$CT_ROOT"
# The source package's debian/ (control, changelog, tests), for
# autopkgtest.
install -d "$CT_ROOT/root/src"
cp -a "$REPO/debian" "$CT_ROOT/root/src/"
install -d "$CT_ROOT/opt/berth-test" "$CT_ROOT/root/debs"
install -m755 "$REPO"/tests/harness/bin/* "$CT_ROOT/opt/berth-test/"
cp "$DEB_DIR/$DEB1" "$DEB_DIR/$DEB2" "$CT_ROOT/root/debs/"
systemctl --root="$CT_ROOT" mask console-getty.service >/dev/null 2>&1 || true

ct_boot package ""
check "the fresh root has no berth" ct test ! -e /usr/bin/berth

# --- 1. install -----------------------------------------------------------------
check_eq "dpkg -i $DEB1 exits 0" 0 "$(status_of ct dpkg -i "/root/debs/$DEB1")"
check_eq "installed version" "$V1" "$(ct dpkg-query -W -f '${Version}' berth)"
check_eq "berth.target is not enabled" disabled "$(ct systemctl is-enabled berth.target 2>&1 || true)"
check_eq "no berth unit is active or activating" "" \
    "$(ct systemctl list-units --all --no-legend --plain --state=active,activating,reloading,deactivating 'berth*' 2>&1)"
for u in berth.target berth-drain.service berth-autostart.service berth-daemon.service berth-fence-watch.service berth.slice; do
    check_eq "$u loaded and inactive" "loaded inactive" "$(ct_prop "$u" LoadState) $(ct_prop "$u" ActiveState)"
done
check "the berth group exists" ct getent group berth
check "/var/lib/berth exists" ct test -d /var/lib/berth/records
check_eq "/run/berthd belongs to the berth group" "root:berth 750" "$(ct stat -c '%U:%G %a' /run/berthd 2>&1)"
check "the journal catalog knows berth's records" \
    sh -c "nsenter -t $CT_PID -a journalctl --list-catalog a0ddea6ee36c427990a5421dd1040be6 | grep -q a0ddea6e"
# debian/tests against the installed package, with autopkgtest's null
# runner in the booted container (no build: the package is installed).
out=$(ct autopkgtest --no-built-binaries /root/src -- null 2>&1) && rc=0 || rc=$?
check_eq "autopkgtest passes debian/tests against the installed package" "0" \
    "$rc$([ "$rc" = 0 ] || printf '\n%s' "$(printf '%s\n' "$out" | tail -n 30)")"
for t in generator check units; do
    check "... $t: PASS" bash -c 'grep -Eq "^$1 +PASS" <<<"$2"' _ "$t" "$out"
done
check "... and left no /etc/berth behind" ct test ! -e /etc/berth
check_eq "... nor a workload unit" "" "$(ct systemctl list-units --all --no-legend --plain 'berth@*' 2>&1)"
out=$(ct systemd-analyze verify --man=no berth.target berth-drain.service berth-autostart.service \
    berth-daemon.service berth-fence-watch.service berth.slice berth@example.service 2>&1) && rc=0 || rc=$?
check_eq "systemd-analyze verify of the installed units is clean" "0:" "$rc:$out"

# --- 2. configure, enable, power off, boot ------------------------------------
install -d "$CT_ROOT/etc/berth"
cp -a "$REPO/tests/harness/config/pair/." "$CT_ROOT/etc/berth/"
check "berth check accepts it" ct berth check
check "systemctl daemon-reload" ct systemctl daemon-reload
out=$(ct berth install 2>&1) || true
check_contains "berth install on the packaged units enables, starts and verifies" "verified: berth-daemon.service active" "$out"
check_eq "... and writes no copy of a packaged file" "" "$(ct find /usr/local /etc/systemd/system -name 'berth*' ! -name berth.target)"
check_eq "berth.target enabled" enabled "$(ct systemctl is-enabled berth.target 2>&1 || true)"
for w in a b; do
    check "berth@$w started" wait_for 20 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl is-active berth@$w.service)\" = active ]"
done
check_eq "drain armed" "active/exited" "$(ct_prop berth-drain.service ActiveState)/$(ct_prop berth-drain.service SubState)"
check "daemon running" wait_for 10 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl is-active berth-daemon.service)\" = active ]"

first_a=$(ct_prop berth@a.service InvocationID)
t=$(now)
ct_poweroff 120
log "  power-off: $(since "$t") s"
check "power-off completed" test -z "$CT_PID"
check "the drain stopped both workloads gracefully (last-drain.json)" python3 - "$CT_ROOT/var/lib/berth/last-drain.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
got = {w["workload"]: w["outcome"] for w in r["workloads"]}
assert got == {"a": "GracefulOff", "b": "GracefulOff"}, got
PY

t=$(now)
CT_KEEP_STATE=1 ct_boot package ""
log "  boot: $(since "$t") s"
for w in a b; do
    check "berth@$w started again at boot" wait_for 20 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl is-active berth@$w.service)\" = active ]"
done
check "as new invocations" test "$(ct_prop berth@a.service InvocationID)" != "$first_a"
check_eq "by the autostart" "active success" "$(ct_prop berth-autostart.service ActiveState) $(ct_prop berth-autostart.service Result)"
check "berth drain --last --json reports the power-off's drain" sh -c \
    "nsenter -t $CT_PID -a berth drain --last --json | python3 -c 'import json,sys; r=json.load(sys.stdin); assert sorted(w[\"workload\"] for w in r[\"workloads\"] if w[\"outcome\"] == \"GracefulOff\") == [\"a\", \"b\"], r'"
check "daemon running" wait_for 10 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl is-active berth-daemon.service)\" = active ]"

# --- 3. upgrade -----------------------------------------------------------------
snapshot() {
    local u
    for u in berth@a.service berth@b.service berth-drain.service; do
        printf '%s %s %s %s\n' "$u" "$(ct_prop "$u" InvocationID)" "$(ct_prop "$u" MainPID)" "$(ct_prop "$u" ActiveState)"
    done
}
before=$(snapshot)
daemon_pid=$(ct_prop berth-daemon.service MainPID)
daemon_restarts=$(ct_prop berth-daemon.service NRestarts)
sleep 1.1 # journalctl --since has whole seconds
since_upgrade=$(ct date '+%Y-%m-%d %H:%M:%S')
t=$(now)
upgrade=$(status_of ct dpkg -i "/root/debs/$DEB2")
log "  dpkg -i (upgrade): $(since "$t") s"
check_eq "dpkg -i $DEB2 (upgrade) exits 0" 0 "$upgrade"
check_eq "dpkg-query shows $V2" "$V2" "$(ct dpkg-query -W -f '${Version}' berth)"
check_eq "workloads and drain untouched (InvocationID, MainPID, active)" "$before" "$(snapshot)"
check_eq "berth.target still enabled" enabled "$(ct systemctl is-enabled berth.target 2>&1 || true)"
relaunched() {
    local pid
    pid=$(ct_prop berth-daemon.service MainPID)
    [ "$pid" != 0 ] && [ "$pid" != "$daemon_pid" ] && [ "$(ct_prop berth-daemon.service ActiveState)" = active ]
}
t=$(now)
if wait_for 15 relaunched; then
    ok "the daemon relaunched itself on the new binary (seen $(since "$t") s after dpkg)"
else
    not_ok "the daemon relaunched itself on the new binary" \
        "MainPID $daemon_pid -> $(ct_prop berth-daemon.service MainPID), NRestarts $daemon_restarts -> $(ct_prop berth-daemon.service NRestarts), $(ct_prop berth-daemon.service ActiveState); exe: $(ct readlink "/proc/$daemon_pid/exe" 2>&1)"
fi
check_eq "... and runs the new binary" "/usr/bin/berth" \
    "$(ct readlink "/proc/$(ct_prop berth-daemon.service MainPID)/exe" 2>&1)"
check_contains "... because its binary was replaced" "the berth binary was replaced: relaunching (exit 75)" \
    "$(ct journalctl -u berth-daemon.service --since "$since_upgrade" --no-pager)"
check_eq "... through Restart=always, not a failure" "active success" \
    "$(ct_prop berth-daemon.service ActiveState) $(ct_prop berth-daemon.service Result)"
check_eq "no start or stop of a workload or the drain during the upgrade" "" \
    "$(ct journalctl --since "$since_upgrade" --no-pager | grep -E '(Starting|Stopping|Started|Stopped) berth(@|-drain| host-shutdown| workload)' || true)"
check_eq "workloads and drain still untouched" "$before" "$(snapshot)"

# --- 4. dpkg -r, then --purge, with workloads running ------------------------------
check "berth.target's enablement link was recorded by deb-systemd-helper" \
    ct grep -rqs berth.target /var/lib/systemd/deb-systemd-helper-enabled/
check_eq "dpkg -r berth exits 0" 0 "$(status_of ct dpkg -r berth)"
check_eq "workloads and drain untouched by dpkg -r" "$before" "$(snapshot)"
states() {
    local u
    for u in berth@a.service berth@b.service berth-drain.service berth-daemon.service berth.slice berth.target; do
        printf '    %-22s %s/%s/%s\n' "$u" "$(ct_prop "$u" LoadState)" "$(ct_prop "$u" ActiveState)" "$(ct_prop "$u" SubState)"
    done
}
log "  measured after dpkg -r (load/active/sub):"
log "$(states)"
check_eq "... their units not-found after its daemon-reload, the workloads still running" \
    "not-found active not-found active" \
    "$(for w in a b; do printf '%s %s ' "$(ct_prop "berth@$w.service" LoadState)" "$(ct_prop "berth@$w.service" ActiveState)"; done | sed 's/ $//')"
check_eq "workload processes still running" "$(printf '%s\n' "$before" | awk '$1 ~ /@/ { print $3 }')" \
    "$(for w in a b; do ct_prop "berth@$w.service" MainPID; done)"
# At once, while the daemon of the removed package may still run (it
# ends within a pass once its binary is gone): the purge waits for it.
check_eq "dpkg --purge berth exits 0" 0 "$(status_of ct dpkg --purge berth)"
check_eq "... after the daemon ended" 0 "$(ct_prop berth-daemon.service MainPID)"
check_eq "workloads and drain untouched by dpkg --purge" "$before" "$(snapshot)"
sleep 1
check "... which removed berth's state (and nothing wrote it again)" ct test ! -e /var/lib/berth
check_eq "... and every enablement link of berth's units" "" \
    "$(ct find /etc/systemd -name 'berth*' 2>&1)"
check_eq "... and deb-systemd-helper's record of them" "" \
    "$(ct grep -rls berth /var/lib/systemd/deb-systemd-helper-enabled/ 2>/dev/null || true)"
check_eq "... and left the admin's /etc/berth" "$(cd "$REPO/tests/harness/config/pair" && find . | sort)" \
    "$(cd "$CT_ROOT/etc/berth" && find . | sort)"
check "... and the berth group" ct getent group berth
check_eq "... and berth is no longer known to dpkg" "" "$(ct dpkg-query -W -f '${Status}' berth 2>/dev/null || true)"
t=$(now)
ct_poweroff 180
log "  power-off after dpkg -r and --purge: $(since "$t") s"
check "power-off completed" test -z "$CT_PID"
if [ -e "$CT_ROOT/var/lib/berth/last-drain.json" ]; then
    log "  measured: a drain ran at that power-off (last-drain.json written again)"
else
    log "  measured: no drain ran at that power-off (no last-drain.json since the purge)"
fi
# /out is unmounted before the final kill: the workloads' last words are on
# the console.
log "  measured: the end of that power-off on the console:"
log "$(sed 's/\x1b\[[0-9;]*m//g' "$CT_DIR/console.log" | grep -E 'berth|Sending SIG|Stopped dbus' | tail -n 12 | sed 's/^/    /')"
