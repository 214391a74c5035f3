#!/usr/bin/env bash
# Issue 11: a burst of N (100) concurrent `berth add --now`, as a control
# plane creating VMs would send them, inside the harness's real systemd
# container: how long until every add has returned with its workload
# started, and how many daemon-reloads it took, counted from the manager's
# D-Bus Reloading signal (issue 11: a handful, not N). One
# `systemctl daemon-reload` alone is timed in the same container, for
# scale. Needs root, systemd-nspawn and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
N=${N:-100}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
harness_allow_tasks $((N * 4 + 1000))
trap 'ct_cleanup; harness_restore_tasks' EXIT

config=$HARNESS_DIR/config-bench-add
rm -rf "$config"
mkdir -p "$config/workloads"
ct_boot bench-add "$config"
one_reload=$(ct sh -c 't0=$(date +%s%N); systemctl daemon-reload; echo $(( ($(date +%s%N) - t0) / 1000000 ))')
ct busctl monitor --json=short --match "type='signal',interface='org.freedesktop.systemd1.Manager',member='Reloading'" \
    >"$CT_DIR/reloads.json" 2>/dev/null &
monitor=$!
sleep 1
burst_ms=$(ct sh -c '
    t0=$(date +%s%N)
    for i in $(seq 1 '"$N"'); do
        /usr/bin/berth add w$i --now -- /bin/sleep infinity >/dev/null 2>>/run/add-errors &
    done
    wait
    echo $(( ($(date +%s%N) - t0) / 1000000 ))')
sleep 1
kill "$monitor" 2>/dev/null || true
wait "$monitor" 2>/dev/null || true
running=$(ct systemctl list-units 'berth@w*' --state=running --no-legend --plain | wc -l)
[ "$running" -eq "$N" ] || die "$running of $N added workloads run; errors: $(ct cat /run/add-errors)"
reloads=$(( $(grep -c '"member":"Reloading"' "$CT_DIR/reloads.json") / 2 ))
ct_poweroff 300

echo "add burst: Debian systemd $SUITE in systemd-nspawn"
printf '%d concurrent berth add --now: all returned, all started, in %d ms; %d daemon-reloads (one alone: %d ms)\n' \
    "$N" "$burst_ms" "$reloads" "$one_reload"
