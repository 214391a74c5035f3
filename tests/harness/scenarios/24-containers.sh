#!/usr/bin/env bash
# harness-job: class=heavy minutes=0.2
# Issue 11, part 1: containers as existing units. A podman container run
# by a service unit (`podman run --cgroups=split --sdnotify=conmon`, both
# suites) and, on trixie, a quadlet `.container`: started at boot by the
# autostart, the container's processes inside the unit's cgroup, left
# alone by a daemon restart, drained gracefully at power-off. check --live
# reports a podman stop shorter than the workload's stop_delay_s.
source "$(dirname "$0")/../lib.sh"
scenario_begin 24-containers

harness_podman_root
ROOTFS=$PODMAN_ROOTFS
CT_NSPAWN_OPTS=("${PODMAN_NSPAWN_OPTS[@]}")
export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
run() { out=$(ct "$@" 2>&1) && rc=0 || rc=$?; }
quadlet=$([ "$SUITE" = bookworm ] && echo no || echo yes)
units=(ctr-web.service)
# trixie: a quadlet too, in the first group.
ct_seed() {
    if [ "$quadlet" = yes ]; then
        printf 'unit = "quad-db.service"\norder = 0\nstop_delay_s = 20\n' >"$CT_DIR/etc-berth/workloads/quad.toml"
    fi
}
[ "$quadlet" = no ] || units+=(quad-db.service)

ct_boot containers "$REPO/tests/harness/config/containers"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true

# Where each process of a unit's tree runs, by /proc (the container's
# main process and everything podman started for it).
cgroup_of() { ct cat "/proc/$1/cgroup" | sed -n 's/^0:://p'; }
for unit in "${units[@]}"; do
    ctr=${unit%.service}
    check_eq "$unit: started by the autostart" active "$(ct_prop "$unit" ActiveState)"
    check_contains "... by berth's autostart" "started $unit" "$(ct_journal -u berth-autostart.service -o cat)"
    check_eq "... in berth.slice" "/berth.slice/$unit" "$(ct_prop "$unit" ControlGroup)"
    main=$(ct_prop "$unit" MainPID)
    check_contains "... its main process (conmon) in its cgroup" "/berth.slice/$unit/" "$(cgroup_of "$main")"
    pid=$(ct podman inspect -f '{{.State.Pid}}' "$ctr")
    check_contains "... the container's process ($pid) in its cgroup" "/berth.slice/$unit/" "$(cgroup_of "$pid")"
    check_lacks "... no default Conflicts=shutdown.target" shutdown.target "$(ct_prop "$unit" Conflicts)"
done
if [ "$quadlet" = yes ]; then
    check_contains "the quadlet unit keeps its own SourcePath" /etc/containers/systemd/quad-db.container \
        "$(ct_prop quad-db.service SourcePath)"
    check_contains "... and berth's drop-in" /run/systemd/generator/quad-db.service.d/10-berth.conf \
        "$(ct_prop quad-db.service DropInPaths)"
fi

run berth check --live
check_eq "check --live: exit 0" 0 "$rc"
check_contains "... the containers keep the invariants" \
    "live: the drain, berth.slice and ${#units[@]} workload unit(s) keep the lifecycle invariants" "$out"

# A daemon restart touches no container.
before=$(for u in "${units[@]}"; do ct_prop "$u" MainPID; ct podman inspect -f '{{.State.Pid}}' "${u%.service}"; done)
ct systemctl restart berth-daemon.service
ct systemctl is-active --wait berth-daemon.service >/dev/null 2>&1 || true
after=$(for u in "${units[@]}"; do ct_prop "$u" MainPID; ct podman inspect -f '{{.State.Pid}}' "${u%.service}"; done)
check_eq "a daemon restart left every container and its conmon alone" "$before" "$after"

# A podman stop shorter than the stop delay.
run berth add short --unit ctr-short.service --stop-delay 20
check_eq "berth add --unit ctr-short.service: exit 0" 0 "$rc"
run berth check --live
check_eq "a podman stop of 3 s under a 20 s stop delay: exit 1" 1 "$rc"
check_contains "... reported, naming the unit file" \
    "ctr-short.service (/etc/systemd/system/ctr-short.service) gives its container 3 s to stop (its ExecStop" "$out"
run berth remove short
if [ "$quadlet" = yes ]; then
    run berth add qshort --unit quad-short.service --stop-delay 20
    check_eq "berth add --unit quad-short.service: exit 0" 0 "$rc"
    run berth check --live
    check_eq "a quadlet without StopTimeout= under a 20 s stop delay: exit 1" 1 "$rc"
    check_contains "... reported, naming the .container" \
        "quad-short.service (/etc/containers/systemd/quad-short.container) gives its container 10 s to stop (podman's default stop timeout" "$out"
    run berth remove qshort
fi

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
check "the drain stopped every container gracefully (last-drain.json, their logs)" python3 - "$CT_DIR" "$quadlet" <<'PY'
import json, sys
d, quadlet = sys.argv[1], sys.argv[2] == "yes"
report = json.load(open(f"{d}/state/last-drain.json"))
got = {w["workload"]: (w["outcome"], w.get("unit")) for w in report["workloads"]}
want = {"ctr": ("GracefulOff", "ctr-web.service")}
if quadlet:
    want["quad"] = ("GracefulOff", "quad-db.service")
assert got == want, f"{got} != {want}"
for name in ["ctr-web"] + (["quad-db"] if quadlet else []):
    seen = [l.split()[0] for l in open(f"{d}/out/{name}.log") if l.strip()]
    assert seen == ["start", "stop-begin", "stop-end"], f"{name}: {seen}"
if quadlet:
    w = {x["workload"]: x for x in report["workloads"]}
    assert w["quad"]["started_ms"] >= w["ctr"]["started_ms"] + w["ctr"]["elapsed_ms"], \
        f"quad (order 0) stop began before ctr (order 10) was down: {w}"
PY
