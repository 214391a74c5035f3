#!/usr/bin/env bash
# harness-job: class=heavy minutes=0.6
# Issue 10, R5: 1000 concurrent API requests at a time (half of them
# /metrics), 100 slowloris
# clients and 200 idle event subscribers for 30 s, against a daemon with a
# 1 s reconcile interval and a 3 s watchdog: its loop's pass age stays
# under 2 x the interval, /healthz answers 200 through its reserved slots
# all along, the watchdog never fires.
source "$(dirname "$0")/../lib.sh"
scenario_begin 23-r5-api-flood

ct_boot r5 "$REPO/tests/harness/config/flood"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
sock=/proc/$CT_PID/root/run/berthd/api.sock
check "the API socket exists" wait_for 10 test -S "$sock"
check_eq "the daemon runs under a 3 s watchdog" 3s "$(ct_prop berth-daemon.service WatchdogUSec)"
pid=$(ct_prop berth-daemon.service MainPID)
restarts=$(ct_prop berth-daemon.service NRestarts)

python3 "$REPO/tests/harness/faults/r5-flood.py" "$sock" "/proc/$CT_PID/root/run/berthd/status.json" \
    "${R5_SECONDS:-30}" "$(ct getent group berth | cut -d: -f3)" "$CT_DIR/r5.json" >"$CT_DIR/r5.out" 2>&1 || true
sed 's/^/  | /' "$CT_DIR/r5.out" >&2
r5() { python3 -c "import json,sys; print(json.load(open('$CT_DIR/r5.json'))[sys.argv[1]])" "$1" 2>/dev/null; }
check "the flood was served and refused (some 200, some 503 or reset)" test "$(r5 flood_200)" -gt 0 -a "$(r5 flood_503)" -gt 0
check "... /metrics among the requests served" test "$(r5 metrics_200)" -gt 0
check "64 idle subscribers held, the 136 beyond the cap refused" test "$(r5 sse_open)" = 64 -a "$(r5 sse_refused)" = 136
check "/healthz was sampled (>= 100 times)" test "$(r5 health_samples)" -ge 100
check_eq "/healthz (from root) answered 200 every time" 0 "$(r5 health_not_200)"
check_eq "no flood request failed otherwise" 0 "$(r5 flood_error)"
check "the loop's pass age stayed under 2 x 1 s ($(r5 pass_age_ms_max) ms)" test "$(r5 pass_age_ms_max)" -lt 2000
check_eq "the watchdog never fired: same daemon process" "$pid $restarts" \
    "$(ct_prop berth-daemon.service MainPID) $(ct_prop berth-daemon.service NRestarts)"
check_lacks "... and no watchdog timeout logged" "Watchdog timeout" "$(ct journalctl -u berth-daemon.service --no-pager)"
log "  measured: $(r5 flood_200) requests served, $(r5 flood_503) refused (503 or reset), $(r5 flood_error) failed otherwise; $(r5 sse_open) subscribers held, $(r5 sse_refused) refused; /healthz $(r5 health_samples) samples, median $(r5 health_ms_median) ms, max $(r5 health_ms_max) ms; pass age max $(r5 pass_age_ms_max) ms"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
