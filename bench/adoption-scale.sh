#!/usr/bin/env bash
# Issue 10 (and 16): the daemon's start with N running workloads, N = 500,
# 2000 and 5000 (SIZES="..." to change): exec → READY with the records
# present (warm) and with none (cold: a first install on a busy host, or
# after --purge), median of 3 each, and the time per workload, which the
# issue wants flat (no absolute reference exists: the ratio printed is the
# largest per-workload time over the smallest). Records of a cold start
# follow READY; the time until all N are written is printed too.
#
# Needs root, systemd-nspawn and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
SIZES=${SIZES:-500 2000 5000}
RUNS=${RUNS:-3}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
trap ct_cleanup EXIT

timed() { ct sh -c 't0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 ))' timed "$@"; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
count_records() { ct sh -c 'ls /var/lib/berth/records 2>/dev/null | grep -c "\.json$" || true'; }

results=()
for n in $SIZES; do
    config=$HARNESS_DIR/config-bench-scale
    rm -rf "$config"
    mkdir -p "$config/workloads"
    for i in $(seq 1 "$n"); do
        printf 'exec = ["/bin/sleep", "infinity"]\nautostart = false\n' >"$config/workloads/w$i.toml"
    done
    ct_boot bench-scale "$config"
    # Started in batches: one transaction of 5000 jobs is systemd's floor,
    # not berth's, and not what is measured here.
    ct sh -c "seq 1 $n | sed 's/.*/berth@w&.service/' | xargs -n 500 systemctl start"
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
    warm_ms=$(printf '%s\n' "${warm[@]}" | median)
    cold_ms=$(printf '%s\n' "${cold[@]}" | median)
    line=$(awk -v n="$n" -v w="$warm_ms" -v c="$cold_ms" -v r="$written_ms" 'BEGIN {
        printf "%5d workloads: warm %5d ms (%6.1f us each), cold %5d ms (%6.1f us each); cold records all written %d ms after READY",
            n, w, w * 1000 / n, c, c * 1000 / n, r }')
    log "adoption: $line"
    results+=("$n $warm_ms $cold_ms")
    # Not a drain of N workloads (that is issue 16's benchmark): the
    # container's PID 1 is killed, which ends every process in it at once.
    kill -9 "$CT_PID"
    wait "$CT_NSPAWN" 2>/dev/null || true
    CT_PID=
done

printf '%s\n' "${results[@]}" | awk '
    { w = $2 * 1000 / $1; c = $3 * 1000 / $1
      if (NR == 1 || w < wmin) wmin = w; if (w > wmax) wmax = w
      if (NR == 1 || c < cmin) cmin = c; if (c > cmax) cmax = c }
    END { printf "adoption per workload, largest / smallest over the sizes: warm %.2f, cold %.2f (flat: 1.00; target <= 2)\n", wmax / wmin, cmax / cmin }' >&2
