#!/usr/bin/env bash
# Issues 10 and 16: the daemon's start with N running workloads, N = 500,
# 1000, 2000 and 5000 (SIZES="..." to change): exec → READY with the records
# present (warm) and with none (cold: a first install on a busy host, or
# after --purge), median of 5 each, and the time per workload, which the
# issue wants flat within 2x. No absolute reference exists, so the same
# start with no workload at all is measured first: that fixed cost (exec,
# bus connection, state directory) is subtracted before dividing by N, else
# it alone makes the smallest size look slowest per workload. The ratio
# printed is the largest net per-workload time over the smallest, in either
# direction. Records of a cold start follow READY; the time until all N are
# written is printed too. Then IDLE_S (60) seconds idle: the daemon's CPU
# time (issue 16: <= 0.1 s at 1000), its RSS (<= 15 MiB at 5000) and the
# time of its idle passes, per workload (flat within 2x).
#
# Needs root, systemd-nspawn and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
SIZES=${SIZES:-500 1000 2000 5000}
IDLE_S=${IDLE_S:-60}
RUNS=${RUNS:-5}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
max=0
for n in $SIZES; do [ "$n" -le "$max" ] || max=$n; done
harness_allow_tasks $((max * 2 + 1000))
trap 'ct_cleanup; harness_restore_tasks' EXIT

timed() { ct sh -c 't0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 ))' timed "$@"; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
count_records() { ct sh -c 'ls /var/lib/berth/records 2>/dev/null | grep -c "\.json$" || true'; }

results=()
summary=()
for n in 0 $SIZES; do
    config=$HARNESS_DIR/config-bench-scale
    rm -rf "$config"
    mkdir -p "$config/workloads"
    for i in $(seq 1 "$n"); do
        printf 'exec = ["/bin/sleep", "infinity"]\nautostart = false\n' >"$config/workloads/w$i.toml"
    done
    ct_boot bench-scale "$config"
    # Started in batches: one transaction of 5000 jobs is systemd's floor,
    # not berth's, and not what is measured here.
    ct sh -c "seq 1 $n | sed 's/.*/berth@w&.service/' | xargs -r -n 500 systemctl start"
    running=$(ct systemctl list-units 'berth@w*' --state=running --no-legend --plain | wc -l)
    [ "$running" -eq "$n" ] || die "only $running of $n workloads running"
    for i in $(seq 600); do [ "$(count_records)" -ge "$n" ] && break; sleep 0.5; done
    warm=()
    for run in $(seq "$RUNS"); do
        ct systemctl stop berth-daemon.service
        ct systemctl reset-failed berth-daemon.service
        warm+=("$(timed systemctl start berth-daemon.service)") # returns at READY=1
    done
    cold=()
    for run in $(seq "$RUNS"); do
        ct systemctl stop berth-daemon.service
        ct rm -rf /var/lib/berth/records
        ct systemctl reset-failed berth-daemon.service
        cold+=("$(timed systemctl start berth-daemon.service)")
    done
    t0=$(date +%s%N)
    for i in $(seq 1200); do [ "$(count_records)" -ge "$n" ] && break; sleep 0.1; done
    written_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    [ "$(count_records)" -ge "$n" ] || die "the cold start wrote $(count_records) of $n records in 120 s"
    # Idle: IDLE_S seconds with nothing happening. The daemon's CPU time
    # over them, its RSS after, and its passes (one per 5 s: the status
    # says what each took), median of those seen.
    if [ "$n" -gt 0 ]; then
        pid=$(ct_prop berth-daemon.service MainPID)
        ticks() { ct sh -c "awk '{ print \$14 + \$15 }' /proc/$pid/stat"; }
        before=$(ticks)
        passes=()
        for i in $(seq $((IDLE_S / 5))); do
            sleep 5
            took=$(ct_prop berth-daemon.service StatusText | sed -n 's/.* took \([0-9.]*\) ms$/\1/p')
            [ -z "$took" ] || passes+=("$took")
        done
        after=$(ticks)
        [ ${#passes[@]} -gt 0 ] || die "the daemon's status never told a pass's time"
        idle_cpu=$(awk -v a="$after" -v b="$before" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (a - b) / hz }')
        pass_ms=$(printf '%s\n' "${passes[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
        rss_kib=$(ct sh -c "awk '/^VmRSS/ { print \$2 }' /proc/$pid/status")
        restarts=$(ct_prop berth-daemon.service NRestarts)
    fi
    warm_ms=$(printf '%s\n' "${warm[@]}" | median)
    cold_ms=$(printf '%s\n' "${cold[@]}" | median)
    if [ "$n" -eq 0 ]; then
        base_warm=$warm_ms
        base_cold=$cold_ms
        log "adoption: fixed cost, no workload: warm $warm_ms ms, cold $cold_ms ms"
    else
        line=$(awk -v n="$n" -v w="$warm_ms" -v c="$cold_ms" -v bw="$base_warm" -v bc="$base_cold" -v r="$written_ms" 'BEGIN {
            printf "%5d workloads: warm %5d ms (%6.1f us each net of the fixed cost), cold %5d ms (%6.1f us each); cold records all written %d ms after READY",
                n, w, (w - bw) * 1000 / n, c, (c - bc) * 1000 / n, r }')
        log "adoption: $line"
        idle=$(awk -v n="$n" -v p="$pass_ms" -v c="$idle_cpu" -v s="$IDLE_S" -v r="$rss_kib" -v x="$restarts" 'BEGIN {
            printf "%5d workloads: idle pass %.1f ms (%.2f us each); CPU %.2f s over %d s idle; RSS %.1f MiB; %d daemon restarts (expected 0)",
                n, p, p * 1000 / n, c, s, r / 1024, x }')
        log "idle:     $idle"
        summary+=("adoption: $line" "idle:     $idle")
        results+=("$n $((warm_ms - base_warm)) $((cold_ms - base_cold)) $pass_ms")
    fi
    # Not a drain of N workloads (that is issue 16's benchmark): the
    # container's PID 1 is killed, which ends every process in it at once.
    kill -9 "$CT_PID"
    wait "$CT_NSPAWN" 2>/dev/null || true
    CT_PID=
done

echo "daemon scale benchmark: Debian systemd $SUITE in systemd-nspawn, medians of $RUNS starts"
printf '%s\n' "${summary[@]}"
printf '%s\n' "${results[@]}" | awk '
    { w = $2 * 1000 / $1; c = $3 * 1000 / $1; p = $4 * 1000 / $1
      if (NR == 1 || w < wmin) wmin = w; if (w > wmax) wmax = w
      if (NR == 1 || c < cmin) cmin = c; if (c > cmax) cmax = c
      if (NR == 1 || p < pmin) pmin = p; if (p > pmax) pmax = p }
    END { printf "per workload, largest / smallest over the sizes: first pass warm %.2f, cold %.2f (net of the fixed cost); idle pass %.2f (flat: 1.00; target <= 2)\n", wmax / wmin, cmax / cmin, pmax / pmin }'
