#!/usr/bin/env bash
# harness-job: class=heavy minutes=1.8
# Issue 10, R1: 100 SIGKILLs of berth daemon at random points (before
# READY, in its first pass, in its look after READY, between signals)
# while 20 workloads are started, stopped and killed by hand. The daemon
# makes no start or stop job, records each exit once (an instance that
# lived entirely while no daemon watched may go unrecorded: berth(8),
# "replaced"), and each workload's generation rises by one per line.
source "$(dirname "$0")/../lib.sh"
scenario_begin 21-r1-daemon-kills

ct_boot r1 "$REPO/tests/harness/config/churn"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
# Restarted at once and without a start limit: 100 kills in two minutes.
ct mkdir -p /run/systemd/system/berth-daemon.service.d
ct sh -c 'printf "[Unit]\nStartLimitIntervalSec=0\n[Service]\nRestartSec=100ms\n" >/run/systemd/system/berth-daemon.service.d/99-faults.conf'
# The churn starts a workload up to a few times a second: no start limit.
ct mkdir -p /run/systemd/system/berth@.service.d
ct sh -c 'printf "[Unit]\nStartLimitIntervalSec=0\n" >/run/systemd/system/berth@.service.d/99-faults.conf'
ct systemctl daemon-reload
noted() { # every record holds its running instance's InvocationID
    local w
    for w in $(seq -f 'w%02g' 1 20); do
        grep -q '"invocation_id"' "$CT_DIR/state/records/$w.json" || return 1
    done
}
check "the daemon notes every running instance's InvocationID after READY" wait_for 20 noted

kills=${R1_KILLS:-100}
python3 "$REPO/tests/harness/faults/r1-churn.py" "$CT_PID" "$kills" "$CT_DIR/r1.json" >"$CT_DIR/r1.out" 2>&1 || true
cat "$CT_DIR/r1.out" | sed 's/^/  | /' >&2
r1() { python3 -c "import json,sys; print(eval(sys.argv[1], {}, json.load(open('$CT_DIR/r1.json'))))" "$1" 2>/dev/null; }
check_eq "the daemon was SIGKILLed $kills times" "$kills" "$(r1 kills)"
check "... some of them before READY" test "$(r1 kills_before_ready)" -ge 1
check "the churn ran (>= 300 actions, >= 100 exits)" test "$(r1 churn_actions)" -ge 300 -a "$(r1 exits)" -ge 100
check_eq "no start or stop job beyond the churn's (zero workload actions)" 0 "$(r1 extra_jobs)"
check "most exits happened while a daemon watched (>= 50 checked)" test "$(r1 exits_checked)" -ge 50
check_eq "each exit recorded exactly once, generations +1 per line" "[]" "$(r1 problems)"
log "  measured: $(r1 kills) kills ($(r1 kills_before_ready) before READY) in $(r1 churn_seconds) s; $(r1 churn_actions) churn actions, $(r1 exits) exits: $(r1 exits_checked) each recorded once, $(r1 exits_unwatched) unwatched ($(r1 exits_unwatched_recorded) of them recorded); reasons $(r1 reasons)"
check_eq "the daemon is running at the end" active "$(ct_prop berth-daemon.service ActiveState)"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
