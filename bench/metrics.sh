#!/usr/bin/env bash
# Issue 37: the cost of one scrape of /metrics (over TCP, as Prometheus
# scrapes) at 1000 and 5000 workloads (SIZES="..." to change): wall time
# as curl sees it (median and slowest of SCRAPES = 50), bytes, and the
# daemon's CPU per scrape, from the scheduler's own accounting of every
# thread of the daemon (/proc/PID/task/*/schedstat, ns), net of its idle
# CPU over as long (target at 5000: <= 10 ms); and the CPU of the thread
# that serves it alone. Then, at the largest size, LONG_S (600) seconds
# with a scrape every EVERY_S (15) s: the daemon's CPU over them, against
# as long idle just before.
#
# Needs root, systemd-nspawn and debootstrap, like the harness.
source "$(dirname "$0")/../tests/harness/lib.sh"
SIZES=${SIZES:-1000 5000}
SCRAPES=${SCRAPES:-50}
LONG_S=${LONG_S:-600}
EVERY_S=${EVERY_S:-15}

missing=$(harness_missing)
[ -z "$missing" ] || die "the benchmark needs: $missing"
[ -n "${HARNESS_PREPARED:-}" ] || harness_prepare
max=0
for n in $SIZES; do [ "$n" -le "$max" ] || max=$n; done
harness_allow_tasks $((max * 2 + 1000))
trap 'ct_cleanup; harness_restore_tasks' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
count_running() { ct sh -c 'grep -lE "\"state\": ?\"running\"" /var/lib/berth/records/*.json 2>/dev/null | wc -l'; }
# The daemon's CPU so far, ns, every thread; and one thread's by name.
cpu_ns() { ct sh -c "cat /proc/$1/task/*/schedstat" | awk '{ s += $1 } END { printf "%.0f", s }'; }
thread_ns() { ct sh -c "for t in /proc/$1/task/*; do [ \"\$(cat \$t/comm)\" = '$2' ] && cat \$t/schedstat; done" | awk '{ s += $1 } END { printf "%.0f", s }'; }
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

for n in $SIZES; do
    config=$HARNESS_DIR/config-bench-metrics
    rm -rf "$config"
    mkdir -p "$config/workloads"
    printf '[daemon]\nmetrics_listen = %d\n' "$port" >"$config/berth.toml"
    for i in $(seq 1 "$n"); do
        printf 'exec = ["/bin/sleep", "infinity"]\nautostart = false\n' >"$config/workloads/w$i.toml"
    done
    ct_boot bench-metrics "$config"
    ct sh -c "seq 1 $n | sed 's/.*/berth@w&.service/' | xargs -r -n 500 systemctl start"
    for i in $(seq 600); do [ "$(count_running)" -ge "$n" ] && break; sleep 0.5; done
    [ "$(count_running)" -ge "$n" ] || die "$(count_running) of $n records say running after 300 s"
    settled() {
        status=$(ct_prop berth-daemon.service StatusText)
        [[ $status == *"last pass"* && $status != *"still to look at"* ]]
    }
    for i in $(seq 120); do settled && break; sleep 1; done
    settled || die "the daemon did not settle in 120 s: $status"
    pid=$(ct_prop berth-daemon.service MainPID)
    series=$(curl -sf --max-time 10 "http://127.0.0.1:$port/metrics" | grep -c '^berth_workload_up{') \
        || die "no /metrics on 127.0.0.1:$port"
    [ "$series" -eq "$n" ] || die "/metrics shows $series workloads, not $n"

    # Idle for as long as the scrapes will take, then the scrapes.
    t0=$(date +%s%N); c0=$(cpu_ns "$pid")
    sleep 10
    idle_ns_per_s=$(awk -v c="$(( $(cpu_ns "$pid") - c0 ))" -v t="$(( $(date +%s%N) - t0 ))" 'BEGIN { printf "%.0f", c / (t / 1e9) }')
    walls=() bytes=0
    t0=$(date +%s%N); c0=$(cpu_ns "$pid"); m0=$(thread_ns "$pid" berth-metrics)
    for i in $(seq "$SCRAPES"); do
        read -r wall size < <(curl -s -o /dev/null --max-time 10 -w '%{time_total} %{size_download}\n' "http://127.0.0.1:$port/metrics")
        walls+=("$wall")
        bytes=$size
    done
    took_ns=$(( $(date +%s%N) - t0 ))
    cpu=$(( $(cpu_ns "$pid") - c0 ))
    thread=$(( $(thread_ns "$pid" berth-metrics) - m0 ))
    wall_ms=$(printf '%s\n' "${walls[@]}" | median | awk '{ printf "%.2f", $1 * 1000 }')
    wall_max=$(printf '%s\n' "${walls[@]}" | sort -g | tail -n1 | awk '{ printf "%.2f", $1 * 1000 }')
    awk -v n="$n" -v k="$SCRAPES" -v c="$cpu" -v th="$thread" -v i="$idle_ns_per_s" -v t="$took_ns" \
        -v w="$wall_ms" -v x="$wall_max" -v b="$bytes" 'BEGIN {
        net = (c - i * t / 1e9) / k / 1e6
        printf "%5d workloads: one scrape %s ms wall (median of %d, slowest %s ms), %d bytes; daemon CPU %.2f ms per scrape net of idle (target at 5000: <= 10), %.2f ms on the metrics thread\n", n, w, k, x, b, net, th / k / 1e6
    }'

    if [ "$n" -eq "$max" ] && [ "$LONG_S" -gt 0 ]; then
        c0=$(cpu_ns "$pid")
        sleep "$LONG_S"
        idle=$(( $(cpu_ns "$pid") - c0 ))
        c0=$(cpu_ns "$pid")
        for i in $(seq $((LONG_S / EVERY_S))); do
            curl -s -o /dev/null --max-time 10 "http://127.0.0.1:$port/metrics"
            sleep "$EVERY_S"
        done
        scraped=$(( $(cpu_ns "$pid") - c0 ))
        awk -v n="$n" -v s="$LONG_S" -v e="$EVERY_S" -v a="$scraped" -v b="$idle" 'BEGIN {
            printf "%5d workloads, %d s with a scrape every %d s: daemon CPU %.2f s (%.3f %% of a core), against %.2f s idle over as long\n", n, s, e, a / 1e9, a / 1e9 / s * 100, b / 1e9
        }'
    fi
    ct_poweroff 300
done
