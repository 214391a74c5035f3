#!/usr/bin/env bash
# Benchmarks of berth's D-Bus helpers against systemd doing the same work,
# inside the harness's real systemd container, measured in the same run:
#
#   P1  berth drain of 200 trivial workloads, drain_parallelism = 200,
#       vs `systemctl stop` of the same 200 units at once     (target <= 1.2)
#   P2  berth drain of 40 workloads that each take 1 s to stop,
#       drain_parallelism = 4, vs the ideal 10 s               (target <= 1.05)
#   A   berth autostart of 200 workloads vs `systemctl start` of the same
#       200 units at once
#
# Timings are taken inside the container (date +%s%N around the command),
# medians of RUNS (default 5). Needs root, systemd-nspawn and debootstrap,
# like the harness. Exits 0 whatever the ratios.
source "$(dirname "$0")/../tests/harness/lib.sh"
RUNS=${RUNS:-5}
N=200

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
trap ct_cleanup EXIT

config=$HARNESS_DIR/config-bench
rm -rf "$config"
mkdir -p "$config/workloads"
units=()
for i in $(seq -w 0 $((N - 1))); do
    printf 'exec = ["/bin/sleep", "infinity"]\n' >"$config/workloads/t$i.toml"
    units+=("berth@t$i.service")
done
echo 'drain_parallelism = 200' >"$config/berth.toml"

# Boot with the node frozen, so that nothing starts before we measure.
ct_seed() { mkdir -p "$CT_DIR/state/freeze" && echo '{"scope":"node","frozen_at":"","reason":"bench"}' >"$CT_DIR/state/freeze/node"; }
ct_boot bench "$config"
unset -f ct_seed

# Runs CMD inside the container; prints its wall time in ms.
timed() { ct sh -c 't0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 ))' timed "$@"; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

: >"$HARNESS_DIR/bench.tsv"
for run in $(seq "$RUNS"); do
    ref_start=$(timed systemctl start "${units[@]}")
    ref_stop=$(timed systemctl stop "${units[@]}")
    rm -f "$CT_DIR/state/freeze/node"
    auto=$(timed /usr/bin/berth autostart)
    running=$(ct systemctl list-units 'berth@t*' --state=running --no-legend --plain | wc -l)
    [ "$running" -eq "$N" ] || die "berth autostart left $running of $N running"
    drain=$(timed /usr/bin/berth drain)
    running=$(ct systemctl list-units 'berth@t*' --state=running --no-legend --plain | wc -l)
    [ "$running" -eq 0 ] || die "berth drain left $running running"
    printf '%s\t%s\t%s\t%s\n' "$ref_start" "$ref_stop" "$auto" "$drain" >>"$HARNESS_DIR/bench.tsv"
    log "run $run: systemctl start ${ref_start} ms, systemctl stop ${ref_stop} ms, berth autostart ${auto} ms, berth drain ${drain} ms"
done
ref_start=$(cut -f1 "$HARNESS_DIR/bench.tsv" | median)
ref_stop=$(cut -f2 "$HARNESS_DIR/bench.tsv" | median)
auto=$(cut -f3 "$HARNESS_DIR/bench.tsv" | median)
drain=$(cut -f4 "$HARNESS_DIR/bench.tsv" | median)

# P2: 40 workloads that take 1 s to stop, 4 at a time: ideally 10 s.
rm -f "$config"/workloads/t*.toml "$CT_DIR"/etc-berth/workloads/t*.toml
for i in $(seq -w 0 39); do
    printf 'exec = ["/opt/berth-test/workload", "s%s"]\n' "$i" >"$CT_DIR/etc-berth/workloads/s$i.toml"
done
echo 'drain_parallelism = 4' >"$CT_DIR/etc-berth/berth.toml"
ct systemctl daemon-reload
slow=()
for i in $(seq -w 0 39); do slow+=("berth@s$i.service"); done
p2=()
for run in $(seq "$RUNS"); do
    ct systemctl start "${slow[@]}"
    p2+=("$(timed /usr/bin/berth drain)")
done
p2_median=$(printf '%s\n' "${p2[@]}" | median)
ct_poweroff 120

echo "helper benchmarks: Debian systemd 252 in systemd-nspawn, medians of $RUNS runs"
printf 'P1 berth drain, %d workloads, parallelism 200: %s ms; systemctl stop of the same at once: %s ms; ratio %s (target <= 1.2)\n' \
    "$N" "$drain" "$ref_stop" "$(ratio "$drain" "$ref_stop")"
printf 'P2 berth drain, 40 x 1 s stops, parallelism 4: %s ms; ideal 10000 ms; ratio %s (target <= 1.05)\n' \
    "$p2_median" "$(ratio "$p2_median" 10000)"
printf 'A  berth autostart, %d workloads: %s ms; systemctl start of the same at once: %s ms; ratio %s\n' \
    "$N" "$auto" "$ref_start" "$(ratio "$auto" "$ref_start")"
