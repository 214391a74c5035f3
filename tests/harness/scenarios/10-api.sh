#!/usr/bin/env bash
# harness-job: minutes=0.1
# Issue 4, the read-only API (tests 1 and 4): socket and directory modes,
# /healthz, /v1/workloads, POST refused, and on /v1/events a MODIFIED
# event with unexpected-exit and the signal for a SIGKILL, delivered to a
# fast reader while a slow reader reads nothing.
source "$(dirname "$0")/../lib.sh"
scenario_begin 10-api

ct_boot api "$REPO/tests/harness/config/pair"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
sock=/proc/$CT_PID/root/run/berthd/api.sock
for i in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
check "the API socket exists" test -S "$sock"
check_eq "socket mode 0660" "660" "$(stat -c %a "$sock")"
check_eq "directory mode 0750" "750" "$(stat -c %a "$(dirname "$sock")")"
# The group comes from the packaged sysusers.d entry (created at boot).
check "the berth group exists" ct getent group berth
check_eq "the socket belongs to group berth" "$(ct getent group berth | cut -d: -f3)" "$(stat -c %g "$sock")"
check "tmpfiles.d created the state directory" ct test -d /var/lib/berth/records
# The container shares the host's network namespace: the daemon's socket
# inodes must not appear among its TCP sockets.
check "the daemon has no TCP socket at all" python3 - "$CT_PID" "$(ct_prop berth-daemon.service MainPID)" <<'PY'
import os, sys
root = f"/proc/{sys.argv[1]}/root/proc"
fds = f"{root}/{sys.argv[2]}/fd"
inodes = {os.readlink(f"{fds}/{fd}")[8:-1] for fd in os.listdir(fds) if os.readlink(f"{fds}/{fd}").startswith("socket:[")}
tcp = set()
for table in ("tcp", "tcp6"):
    for line in open(f"/proc/net/{table}").readlines()[1:]:  # the host's network namespace, shared
        tcp.add(line.split()[9])
assert inodes, "no sockets found: the check would prove nothing"
assert not inodes & tcp, f"TCP sockets: {inodes & tcp}"
PY

api() { curl -s --max-time 5 --unix-socket "$sock" "$@"; }
code=$(api -o /dev/null -w '%{http_code}' http://berth/healthz)
check_eq "/healthz answers 200" 200 "$code"
check_contains "/healthz says healthy" '"status":"healthy"' "$(api http://berth/healthz)"
check_contains "/v1/workloads lists the workloads" '"name":"b"' "$(api http://berth/v1/workloads)"
check_contains "/v1/workloads/a has the record" '"transition_generation"' "$(api http://berth/v1/workloads/a)"
check_eq "POST is refused with 405" 405 "$(api -o /dev/null -w '%{http_code}' -X POST http://berth/v1/workloads)"
check_eq "an unknown workload is 404" 404 "$(api -o /dev/null -w '%{http_code}' http://berth/v1/workloads/nope)"
check_eq "a query string is ignored" 200 "$(api -o /dev/null -w '%{http_code}' 'http://berth/v1/workloads?x=1')"
check_eq "HEAD is answered, without a body" "200 0" "$(api -o /dev/null -w '%{http_code} %{size_download}' -I http://berth/v1/workloads)"
check_contains "two requests share one connection" "Re-using existing connection" \
    "$(api -v -o /dev/null -o /dev/null http://berth/healthz http://berth/v1/workloads 2>&1)"

# A slow reader that never reads, and a fast one.
python3 - "$sock" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: berth\r\n\r\n")
time.sleep(30)
PY
slow=$!
curl -s -N --max-time 15 --unix-socket "$sock" http://berth/v1/events >"$CT_DIR/events.txt" &
fast=$!
sleep 1
t0=$(date +%s%N)
ct sh -c "kill -9 $(ct_prop berth@a.service MainPID)"
for i in $(seq 100); do grep -q '"unexpected-exit"' "$CT_DIR/events.txt" && break; sleep 0.05; done
t1=$(date +%s%N)
kill "$fast" "$slow" 2>/dev/null || true
check_contains "the stream opens with a sync snapshot" "event: sync" "$(cat "$CT_DIR/events.txt")"
check_contains "a MODIFIED event follows the SIGKILL" "event: MODIFIED" "$(cat "$CT_DIR/events.txt")"
check "... with unexpected-exit and signal 9" python3 - "$CT_DIR/events.txt" <<'PY'
import json, sys
events = open(sys.argv[1]).read().split("\n\n")
for e in events:
    if e.startswith("event: MODIFIED"):
        w = json.loads(e.split("data: ", 1)[1])
        r = w["record"]
        if r and r["last_transition_reason"] == "unexpected-exit":
            assert r["exit_cause"]["status"] == 9 and r["exit_cause"]["result"] == "signal", r
            sys.exit(0)
sys.exit("no MODIFIED unexpected-exit event")
PY
check "the fast reader got it within 5 s although the slow one reads nothing ($(( (t1 - t0) / 1000000 )) ms)" \
    test $(( (t1 - t0) / 1000000 )) -lt 5000

ct systemctl stop berth-daemon.service
check "the socket is removed on a clean exit" test ! -e "$sock"
ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
