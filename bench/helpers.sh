#!/usr/bin/env bash
# Benchmarks of berth's D-Bus helpers against systemd doing the same work,
# inside the harness's real systemd container, measured in the same run:
#
#   F   the drain a host runs: the first after boot, on a settled host
#       (N workloads started by the boot's autostart, SETTLE_S = 20 s
#       before), `berth drain` by hand vs `systemctl stop` of the same N
#       units, first after a boot of its own too, N = 200, 2000, 5000
#                                                   (issue 32: target <= 0.5)
#       and the same drain run by a real `systemctl poweroff`, as its
#       report times it (no reference: systemd stops nothing else then)
#   D   berth drain of N trivial workloads, drain_parallelism = N (4096 at
#       most, its bound; berth has 256 jobs in flight at most whatever the
#       setting), vs `systemctl stop` of the same N units at once, N = 200,
#       2000, 5000, both repeated in the same boot after F
#                                                   (issue 16: target <= 0.6)
#   A   berth autostart of the same N workloads vs `systemctl start` of the
#       same N units at once             (issue 16: target <= 1.0 at 200, 2000)
#   P2  berth drain of 40 workloads that each take 1 s to stop,
#       drain_parallelism = 4, vs the ideal 10 s               (target <= 1.05)
#
# SIZES="..." changes N; PROFILE=perf adds, for each N, the share of CPU
# samples per process during the first drain (needs perf), PROFILE=strace
# the drain's system calls by time spent (strace -f -c -w: slows the drain
# it times). Timings are taken inside the container (date +%s%N around the
# command), medians of RUNS (default 3). The daemon runs during all of
# it, as on a host. Needs root, systemd-nspawn and debootstrap, like the
# harness. Exits 0 whatever the ratios.
source "$(dirname "$0")/../tests/harness/lib.sh"
RUNS=${RUNS:-3}
SIZES=${SIZES:-200 2000 5000}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
max=0
for n in $SIZES; do [ "$n" -le "$max" ] || max=$n; done
harness_allow_tasks $((max * 2 + 1000))
trap 'ct_cleanup; harness_restore_tasks' EXIT

# Runs CMD inside the container; prints its wall time in ms.
timed() { ct sh -c 't0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 ))' timed "$@"; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
running() { ct systemctl list-units "berth@$1*" --state=running --no-legend --plain | wc -l; }

SETTLE_S=${SETTLE_S:-20}

# boot_settled N: a boot whose autostart starts the N workloads, then
# SETTLE_S seconds for the host to settle (the daemon's records written,
# the journal's pages waiting for writeback), as a host that has run for
# a while before its shutdown.
boot_settled() {
    ct_boot bench "$config"
    # The unit list, one per line, inside the container: 5000 names are
    # too many for one command line through nsenter's environment.
    ct sh -c "seq -w 1 $1 | sed 's/.*/berth@t&.service/' >/run/bench-units"
    [ "$(running t)" -eq "$1" ] || die "the boot's autostart left $(running t) of $1 running"
    sleep "$SETTLE_S"
}

# first_profiled CMD...: CMD run in the container and timed (ms, in
# $took), with the profile PROFILE asks for added to the summary.
first_profiled() {
    local perf_pid=
    case "${PROFILE:-}" in
        perf)
            # Every process of the machine: systemd, dbus-daemon,
            # journald, the daemon and the drain itself.
            perf record -a -F 499 -o "$HARNESS_DIR/drain-$n.perf" -- sleep 3600 >/dev/null 2>&1 &
            perf_pid=$!
            sleep 1
            ;;
        strace)
            # From outside (the root has no strace), every thread of it.
            local t0
            t0=$(date +%s%N)
            strace -f -c -w -o "$HARNESS_DIR/drain-$n.strace" nsenter -t "$CT_PID" -a "$@" >/dev/null 2>&1
            took=$((($(date +%s%N) - t0) / 1000000))
            summary+=("$(printf 'profile of the first drain of %d (%s ms under strace): system calls by time, top 8:' "$n" "$took")")
            while read -r line; do summary+=("    $line"); done < <(sed -n 3,10p "$HARNESS_DIR/drain-$n.strace")
            return
            ;;
    esac
    took=$(timed "$@")
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
        summary+=("$(printf 'profile of the first drain of %d (%s ms): CPU samples by process, top 6:' "$n" "$took")")
        while read -r line; do summary+=("    $line"); done < <(perf report -i "$HARNESS_DIR/drain-$n.perf" --stdio --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -6)
    fi
}

summary=()
for n in $SIZES; do
    config=$HARNESS_DIR/config-bench
    rm -rf "$config"
    mkdir -p "$config/workloads"
    for i in $(seq -w 1 "$n"); do
        printf 'exec = ["/bin/sleep", "infinity"]\n' >"$config/workloads/t$i.toml"
    done
    parallelism=$((n < 4096 ? n : 4096))
    echo "drain_parallelism = $parallelism" >"$config/berth.toml"

    # F, the reference: systemctl stop, the first after a boot of its own.
    boot_settled "$n"
    first_ref=$(timed sh -c 'xargs systemctl stop </run/bench-units')
    [ "$(running t)" -eq 0 ] || die "systemctl stop left $(running t) running"
    kill -9 "$CT_PID"
    wait "$CT_NSPAWN" 2>/dev/null || true
    CT_PID=
    # F by a real power-off: its report says how long it took.
    boot_settled "$n"
    ct_poweroff 300
    # The report's own elapsed_ms comes before its workloads' ones.
    poweroff_ms=$(grep -m1 -o '"elapsed_ms": *[0-9]*' "$CT_DIR/state/last-drain.json" | grep -o '[0-9]*$')
    grep -q '"shutdown": *true' "$CT_DIR/state/last-drain.json" || die "the power-off's drain report does not say it ran in a shutdown"
    [ -n "$poweroff_ms" ] || die "no elapsed_ms in the power-off's drain report"
    # F: berth drain, the first after boot; then D and A in the same boot.
    boot_settled "$n"
    first_profiled /usr/bin/berth drain
    first=$took
    [ "$(running t)" -eq 0 ] || die "the first berth drain left $(running t) running"
    log "$n workloads: first after boot: systemctl stop ${first_ref} ms, berth drain ${first} ms, berth drain at power-off ${poweroff_ms} ms"
    : >"$HARNESS_DIR/bench.tsv"
    for run in $(seq "$RUNS"); do
        ref_start=$(timed sh -c 'xargs systemctl start </run/bench-units')
        [ "$(running t)" -eq "$n" ] || die "systemctl start left $(running t) of $n running"
        ref_stop=$(timed sh -c 'xargs systemctl stop </run/bench-units')
        [ "$(running t)" -eq 0 ] || die "systemctl stop left $(running t) running"
        auto=$(timed /usr/bin/berth autostart)
        [ "$(running t)" -eq "$n" ] || die "berth autostart left $(running t) of $n running"
        drain=$(timed /usr/bin/berth drain)
        [ "$(running t)" -eq 0 ] || die "berth drain left $(running t) running"
        printf '%s\t%s\t%s\t%s\n' "$ref_start" "$ref_stop" "$auto" "$drain" >>"$HARNESS_DIR/bench.tsv"
        log "$n workloads, run $run: systemctl start ${ref_start} ms, systemctl stop ${ref_stop} ms, berth autostart ${auto} ms, berth drain ${drain} ms"
    done
    ref_start=$(cut -f1 "$HARNESS_DIR/bench.tsv" | median)
    ref_stop=$(cut -f2 "$HARNESS_DIR/bench.tsv" | median)
    auto=$(cut -f3 "$HARNESS_DIR/bench.tsv" | median)
    drain=$(cut -f4 "$HARNESS_DIR/bench.tsv" | median)
    # The supervisor watched all of it: a restart (its watchdog, 30 s)
    # means its loop stalled under the load.
    restarts=$(ct_prop berth-daemon.service NRestarts)
    summary+=("$(printf '   %4d workloads: the daemon restarted %s times during the run (expected 0)' "$n" "$restarts")")
    summary+=("$(printf 'F  first drain after boot, %4d workloads, settled %d s: berth drain %6s ms; systemctl stop of the same, first after boot: %6s ms; ratio %s (target <= 0.5); by a real poweroff: %s ms' \
        "$n" "$SETTLE_S" "$first" "$first_ref" "$(ratio "$first" "$first_ref")" "$poweroff_ms")")
    summary+=("$(printf 'D  berth drain, %4d workloads, parallelism %4d, repeated: %6s ms; systemctl stop of the same at once: %6s ms; ratio %s (target <= 0.6)' \
        "$n" "$parallelism" "$drain" "$ref_stop" "$(ratio "$drain" "$ref_stop")")")
    summary+=("$(printf 'A  berth autostart, %4d workloads: %6s ms; systemctl start of the same at once: %6s ms; ratio %s (target <= 1.0)' \
        "$n" "$auto" "$ref_start" "$(ratio "$auto" "$ref_start")")")
    # Not a drain of N workloads again: the container's PID 1 is killed,
    # which ends every process in it at once.
    kill -9 "$CT_PID"
    wait "$CT_NSPAWN" 2>/dev/null || true
    CT_PID=
done

# P2: 40 workloads that take 1 s to stop, 4 at a time: ideally 10 s.
config=$HARNESS_DIR/config-bench
rm -rf "$config"
mkdir -p "$config/workloads"
for i in $(seq -w 0 39); do
    printf 'exec = ["/opt/berth-test/workload", "s%s"]\nautostart = false\n' "$i" >"$config/workloads/s$i.toml"
done
echo 'drain_parallelism = 4' >"$config/berth.toml"
ct_boot bench "$config"
p2=()
for run in $(seq "$RUNS"); do
    ct sh -c 'systemctl start $(seq -f "berth@s%02g.service" 0 39)'
    p2+=("$(timed /usr/bin/berth drain)")
done
p2_median=$(printf '%s\n' "${p2[@]}" | median)
ct_poweroff 120

echo "helper benchmarks: Debian systemd $SUITE in systemd-nspawn, medians of $RUNS runs"
printf '%s\n' "${summary[@]}"
printf 'P2 berth drain, 40 x 1 s stops, parallelism 4: %s ms; ideal 10000 ms; ratio %s (target <= 1.05)\n' \
    "$p2_median" "$(ratio "$p2_median" 10000)"
