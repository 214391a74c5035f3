#!/usr/bin/env bash
# harness-job: minutes=0.2
# Issue scenarios 1, 4 and 3 on one boot:
#  1. the generator runs at boot and on daemon-reload, the units are there,
#     nothing berth-related failed, the template alone loads and refuses an
#     undefined workload; no workload is tied to anything stopped at shutdown;
#  4. a hostile argv and environment arrive exactly;
#  3. on power-off the drain's ExecStop starts while every workload runs.
source "$(dirname "$0")/../lib.sh"
scenario_begin 01-topology

config=$HARNESS_DIR/config-topology
rm -rf "$config"
cp -a "$REPO/tests/harness/config/topology" "$config"
cp "$REPO/tests/generator/03-hostile/root/etc/berth/workloads/hostile.toml" "$config/workloads/"
WORKLOADS="a b sandboxed hostile"

ct_boot topology "$config"

# --- 1. generator at boot -------------------------------------------------
gen=/run/systemd/generator
for f in berth-drain.service.d/10-berth.conf berth-daemon.service.d/10-berth.conf; do
    check "generator wrote $f at boot" ct test -f "$gen/$f"
done
check "generator linked the daemon into berth.target" ct test -L "$gen/berth.target.wants/berth-daemon.service"
# Issue 31: berth's own services are sandboxed, as this systemd rates them
# (the daemon at most 3.0, printed with one decimal).
check_exposure berth-daemon.service 3.05
check_exposure berth-drain.service 5
check_exposure berth-autostart.service 5
for w in $WORKLOADS; do
    check "generator wrote the drop-in of berth@$w" ct test -f "$gen/berth@$w.service.d/10-berth.conf"
done
check_eq "generator wants no workload instance" "" "$(ct find "$gen" -name 'berth@*' -path '*.wants/*')"
cat_a=$(ct systemctl cat berth@a.service)
check_contains "systemctl cat shows the packaged template" "/systemd/system/berth@.service"$'\n' "$cat_a"
check_contains "systemctl cat shows the generated drop-in" "# $gen/berth@a.service.d/10-berth.conf" "$cat_a"
check_contains "the drop-in resets and sets ExecStart" $'ExecStart=\nExecStart="/opt/berth-test/workload" "a"' "$cat_a"
check_eq "drain deadline from config: TimeoutStopSec = 60 + 30 s" "1min 30s" "$(ct_prop berth-drain.service TimeoutStopUSec)"
check_eq "daemon watchdog from config" "30s" "$(ct_prop berth-daemon.service WatchdogUSec)"

check_eq "berth.target active" active "$(ct_prop berth.target ActiveState)"
check_eq "drain armed (active/exited)" "active/exited" "$(ct_prop berth-drain.service ActiveState)/$(ct_prop berth-drain.service SubState)"
check_eq "daemon running" "active/running" "$(ct_prop berth-daemon.service ActiveState)/$(ct_prop berth-daemon.service SubState)"
check_eq "autostart ran and succeeded" "yes/success" "$(ct_prop berth-autostart.service ConditionResult)/$(ct_prop berth-autostart.service Result)"
check_contains "autostart logged that it ran" "running workloads (left untouched)" "$(ct journalctl -b -u berth-autostart.service --no-pager)"
check_eq "no berth unit failed" "" "$(ct systemctl --failed --plain --no-legend | grep berth || true)"
check_eq "multi-user.target does not wait for berth.target" "" \
    "$(ct_prop multi-user.target After | tr ' ' '\n' | grep -x 'berth.target' || true)"

for w in $WORKLOADS; do
    check "start berth@$w" ct systemctl start "berth@$w.service"
done
sleep 1
for w in $WORKLOADS; do
    check_eq "berth@$w runs in berth.slice" "active/berth.slice" \
        "$(ct_prop "berth@$w.service" ActiveState)/$(ct_prop "berth@$w.service" Slice)"
    # Only berth.slice (never stopped at shutdown) may be a hard dependency.
    check_eq "berth@$w: Requires= is only berth.slice" "berth.slice" "$(ct_prop "berth@$w.service" Requires)"
    for p in Requisite BindsTo PartOf Conflicts; do
        check_eq "berth@$w: no $p=" "" "$(ct_prop "berth@$w.service" "$p")"
    done
done
check_eq "berth.slice has no shutdown conflict" "" "$(ct_prop berth.slice Conflicts)"

# The template on its own: loads, and refuses with a clear message.
ct systemctl start berth@undefined.service >/dev/null 2>&1 || true
sleep 0.5
check_eq "template alone loads (no bad-setting)" loaded "$(ct_prop berth@undefined.service LoadState)"
check_eq "undefined workload fails" failed "$(ct_prop berth@undefined.service ActiveState)"
check_contains "undefined workload says why" 'workload "undefined" is not defined' \
    "$(ct journalctl -b -u berth@undefined.service --no-pager)"
ct systemctl reset-failed berth@undefined.service

# Node freeze flag: the autostart's condition skips it, visibly.
ct mkdir -p /var/lib/berth/freeze
ct sh -c 'echo "{\"scope\":\"node\"}" >/var/lib/berth/freeze/node'
ct systemctl restart berth-autostart.service
check_eq "node freeze flag skips autostart" no "$(ct_prop berth-autostart.service ConditionResult)"
check_contains "systemctl status names the condition" "ConditionPathExists=!/var/lib/berth/freeze/node" \
    "$(ct systemctl status berth-autostart.service --no-pager 2>&1 || true)"
ct rm /var/lib/berth/freeze/node

# The generator runs again on daemon-reload.
cat >"$CT_DIR/etc-berth/workloads/late.toml" <<'TOML'
exec = ["/opt/berth-test/workload", "late"]
TOML
ct systemctl daemon-reload
check_contains "daemon-reload ran the generator for a new workload" '"/opt/berth-test/workload" "late"' \
    "$(ct systemctl cat berth@late.service 2>&1)"
check "start berth@late" ct systemctl start berth@late.service

# --- 4. the hostile argv and environment arrive exactly --------------------
check "hostile argv and environment arrive exactly" python3 - "$config/workloads/hostile.toml" \
    "$CT_DIR/out/argv-berth@hostile.service" "$CT_DIR/out/environ-berth@hostile.service" <<'PY'
import sys, tomllib
conf = tomllib.load(open(sys.argv[1], "rb"))
fields = open(sys.argv[2], "rb").read().decode().split("\0")
assert fields.pop() == "", "trailing NUL"
argc, argv = int(fields[0]), fields[1:]
want = conf["exec"][1:]
assert argc == len(want) and argv == want, f"argv differs:\n sent {want!r}\n got  {argv!r}"
env = dict(kv.split("=", 1) for kv in open(sys.argv[3], "rb").read().decode().split("\0") if kv)
for k, v in conf["environment"].items():
    assert env.get(k) == v, f"${k}: sent {v!r}, got {env.get(k)!r}"
print(f"{argc} arguments and {len(conf['environment'])} variables match")
PY

# --- 3. power-off: the drain starts while every workload runs --------------
# Harness-only drop-in: record what runs just before berth's own ExecStop.
# (ExecStop= lines run in order; the reset and re-add keep `berth drain`
# itself unchanged, now second.)
ct mkdir -p /run/systemd/system/berth-drain.service.d
ct sh -c 'cat >/run/systemd/system/berth-drain.service.d/99-harness.conf' <<'UNIT'
[Service]
ExecStop=
ExecStop=/bin/sh -c 'date +%%s.%%N >/out/drain-exec-stop; systemctl list-units "berth@*" --state=running --plain --no-legend >/out/running-at-drain'
ExecStop=/usr/bin/berth drain
UNIT
ct systemctl daemon-reload
check_contains "berth drain still runs, right after the recorder" \
    "argv[]=/usr/bin/berth drain" "$(ct_prop berth-drain.service ExecStop)"
ct_poweroff 120

check "power-off completed" test -z "$CT_PID"
check_contains "the drain's ExecStop ran at power-off" "drain done in" "$(ct_journal -u berth-drain.service)"
running=$(cat "$CT_DIR/out/running-at-drain" 2>/dev/null || true)
for w in $WORKLOADS late; do
    check_contains "berth@$w was running when the drain ran" "berth@$w.service" "$running"
done
# Every workload stop comes from the drain: none before the drain began.
check_eq "no workload stopped before the drain began" "" \
    "$(ct_journal | sed '/Stopping berth-drain.service/q' | grep -E 'Stopp(ing|ed) berth@' || true)"
drain_at=$(cat "$CT_DIR/out/drain-exec-stop" 2>/dev/null || echo 0)
for w in a b late; do
    stopped=$(sed -n "s/^berth-test: $w stop-begin at //p" "$CT_DIR/console.log" | tr -d '\r' | tail -n1)
    check "berth@$w stopped after the drain started ($stopped > $drain_at)" \
        python3 -c "import sys; sys.exit(not (float('${stopped:-0}') > float('$drain_at') > 0))"
done
