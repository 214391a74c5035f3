#!/usr/bin/env bash
# harness-job: minutes=0.6
# Metrics a real Prometheus scrapes: the daemon serves /metrics over TCP
# ([daemon] metrics_listen, loopback) next to its socket, and keeps
# berth.prom for node_exporter (metrics_textfile). Debian's Prometheus,
# on the host (the container shares its network), scrapes it every
# second; its own HTTP API shows the series after a SIGKILL (an
# unexpected exit, its cause, the workload down), a start by hand (a
# transition) and a drain (outcomes, deadline). promtool checks the
# textfile's metrics (gone when the daemon stops) and the alert rules the
# README shows (examples/berth-alerts.yml), with rule tests of their own.
source "$(dirname "$0")/../lib.sh"
scenario_begin 35-metrics

command -v prometheus >/dev/null && command -v promtool >/dev/null \
    || die "prometheus and promtool are needed (make deps installs Debian's prometheus)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
METRICS_PORT=$(free_port)
PROM_PORT=$(free_port)
PROM_DIR=$HARNESS_DIR/run/prometheus-$SCENARIO-$SUITE
TEXTFILE_DIR=$HARNESS_DIR/run/textfile-$SCENARIO-$SUITE
rm -rf "$PROM_DIR" "$TEXTFILE_DIR"
mkdir -p "$PROM_DIR" "$TEXTFILE_DIR"
PROM_PID=
trap 'rc=$?; [ -z "$PROM_PID" ] || kill "$PROM_PID" 2>/dev/null; (exit $rc); scenario_end' EXIT

ct_seed() {
    cat >"$CT_DIR/etc-berth/berth.toml" <<TOML
[daemon]
reconcile_interval_s = 1
metrics_listen = $METRICS_PORT
metrics_textfile = "/var/lib/prometheus/node-exporter"
TOML
}
CT_NSPAWN_OPTS=(--bind="$TEXTFILE_DIR:/var/lib/prometheus/node-exporter")
ct_boot metrics "$REPO/tests/harness/config/pair"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
url=http://127.0.0.1:$METRICS_PORT
check "the daemon serves /metrics over TCP" wait_for 10 curl -sf --max-time 2 "$url/metrics"
# The first pass publishes the workloads a moment after the listener is up.
check "... with each workload up" wait_for 10 sh -c "curl -s --max-time 2 '$url/metrics' | grep -qF 'berth_workload_up{workload=\"b\",kind=\"command\"} 1'"
body=$(curl -s --max-time 5 -D "$CT_DIR/headers" "$url/metrics")
check_contains "... in the text format by default" "text/plain; version=0.0.4" "$(cat "$CT_DIR/headers")"
check_contains "... workload a too" 'berth_workload_up{workload="a",kind="command"} 1' "$body"
om=$(curl -s --max-time 5 -D "$CT_DIR/om-headers" -H 'Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5' "$url/metrics")
check_contains "OpenMetrics when asked" "application/openmetrics-text; version=1.0.0" "$(cat "$CT_DIR/om-headers")"
check_eq "... ending in # EOF" "# EOF" "$(printf '%s\n' "$om" | tail -n 1)"
check_eq "nothing else over TCP: the API's paths are 404" 404 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url/v1/workloads")"
check_eq "... and POST is 405" 405 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST "$url/metrics")"
# The autostart writes its report as it ends; a pass (every second here)
# reads it.
check "... and the last autostart's report: two started" wait_for 10 sh -c \
    "curl -s --max-time 2 '$url/metrics' | grep -qF 'berth_autostart_last_workloads{action=\"started\"} 2'"
families() { grep '^# TYPE ' | sort; }
check_eq "the socket's /metrics has the same families" "$(curl -s --max-time 5 "$url/metrics" | families)" \
    "$(curl -s --max-time 5 --unix-socket "/proc/$CT_PID/root/run/berthd/api.sock" http://berth/metrics | families)"
check "the listener is bound to loopback alone" python3 - "$METRICS_PORT" <<'PY'
import sys
port = int(sys.argv[1])
local = [l.split()[1] for l in open("/proc/net/tcp").readlines()[1:] if l.split()[3] == "0A"]
mine = [a for a in local if int(a.split(":")[1], 16) == port]
assert mine == ["0100007F:%04X" % port], mine
PY
drop_in=$(ct systemctl cat berth-daemon.service)
check_contains "the generated drop-in opens loopback only" "IPAddressAllow=localhost" "$drop_in"
check_contains "... and the textfile's directory" 'ReadWritePaths="-/var/lib/prometheus/node-exporter"' "$drop_in"

cat >"$PROM_DIR/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: berth
    static_configs:
      - targets: ["127.0.0.1:$METRICS_PORT"]
YML
prometheus --config.file="$PROM_DIR/prometheus.yml" --storage.tsdb.path="$PROM_DIR/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$PROM_DIR/prometheus.log" 2>&1 &
PROM_PID=$!
# query EXPR: the value of the instant query's one result, or nothing.
query() {
    python3 - "$PROM_PORT" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]})
result = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
print(result[0]["value"][1] if len(result) == 1 else "")
PY
}
# until_value SECONDS EXPR VALUE: until Prometheus answers VALUE.
value_is() { [ "$(query "$1")" = "$2" ]; }
until_value() { wait_for "$1" value_is "$2" "$3"; }
check "Prometheus scrapes berth" until_value 30 'up{job="berth"}' 1
check "... and sees workload a up" until_value 10 'berth_workload_up{workload="a",kind="command"}' 1

ct sh -c "kill -9 $(ct_prop berth@a.service MainPID)"
check "after a SIGKILL Prometheus sees the unexpected exit" \
    until_value 15 'berth_workload_transitions_total{workload="a",reason="unexpected-exit"}' 1
check_eq "... with systemd's cause" 1 "$(query 'berth_workload_exits_total{workload="a",result="signal"}')"
check_eq "... and the workload down" 0 "$(query 'berth_workload_up{workload="a"}')"
ct systemctl start berth@a.service
check "a start by hand is a start-user transition" \
    until_value 15 'berth_workload_transitions_total{workload="a",reason="start-user"}' 1
check "... and the workload up again" until_value 10 'berth_workload_up{workload="a"}' 1
check_eq "the daemon's passes are timed" 1 "$(query 'berth_daemon_pass_duration_seconds_count > bool 0')"

ct berth drain >/dev/null 2>&1
check "after a drain Prometheus sees its outcomes" \
    until_value 15 'berth_drain_last_workloads{outcome="GracefulOff"}' 2
check_eq "... within its deadline" 0 "$(query berth_drain_last_deadline_reached)"
check_eq "... each workload's outcome" 1 "$(query 'berth_drain_last_outcome{workload="b",outcome="GracefulOff"}')"
check_eq "... and the deadline it had" 180 "$(query berth_drain_last_deadline_seconds)"
check_eq "Prometheus parsed every scrape (up never 0)" 1 "$(query 'min_over_time(up{job="berth"}[5m])')"
prom_self=$(curl -s --max-time 5 "http://127.0.0.1:$PROM_PORT/metrics")
for counter in prometheus_target_scrapes_sample_duplicate_timestamp_total prometheus_target_scrapes_sample_out_of_order_total \
    prometheus_target_scrapes_sample_out_of_bounds_total; do
    check_eq "... and found no duplicate or disordered sample ($counter)" "$counter 0" "$(printf '%s\n' "$prom_self" | grep "^$counter ")"
done

check "the textfile is written for node_exporter" wait_for 20 test -s "$TEXTFILE_DIR/berth.prom"
check "... and promtool finds nothing wrong with it" sh -c "promtool check metrics <'$TEXTFILE_DIR/berth.prom'"
check "... rewritten every 15 s: the drain shows within 20 s" \
    wait_for 20 grep -qF 'berth_drain_last_workloads{outcome="GracefulOff"} 2' "$TEXTFILE_DIR/berth.prom"
check_eq "... mode 0644" 644 "$(stat -c %a "$TEXTFILE_DIR/berth.prom")"
ct systemctl stop berth-daemon.service
check "... and removed when the daemon stops" test ! -e "$TEXTFILE_DIR/berth.prom"
check "the README's alert rules pass promtool check rules" promtool check rules "$REPO/examples/berth-alerts.yml"
check "... and their own tests" promtool test rules "$REPO/tests/harness/prometheus/alerts-test.yml"
check "... and the README shows them as they are" python3 - "$REPO" <<'PY'
import sys
repo = sys.argv[1]
rules = open(f"{repo}/examples/berth-alerts.yml").read()
assert rules in open(f"{repo}/README.md").read(), "README.md lacks examples/berth-alerts.yml verbatim"
PY
