#!/usr/bin/env bash
# harness-job: minutes=0.3
# Issue 5: berth for a user manager, with a lingering user (no login).
#  1. Installed system-wide (make install: user units in
#     /usr/lib/systemd/user, the generator linked into user-generators):
#     `berth --user install` only enables berth.target (under
#     default.target), starts and verifies; the user generator read
#     ~/.config/berth; the default deadline fits user@.service's 120 s;
#     state and freeze flags live in %h/.local/state/berth; status works over the
#     user bus and, without it, over the manager's private socket.
#  2. Per-user, without the system-wide files: `berth --user install`
#     (as the user, no root) puts the binary in ~/.local/bin and the units
#     and the generator's output in ~/.config/systemd/user; `berth --user
#     reload` renders a config change; uninstall reverses it.
#  3. A real power-off stops the user manager, whose drain stops the user's
#     workloads in reverse order.
source "$(dirname "$0")/../lib.sh"
scenario_begin 15-user

ct_boot user ""
R=/proc/$CT_PID/root
ct useradd -m -u 1000 -s /bin/sh u
ct loginctl enable-linger u
check "the lingering user's manager runs" wait_for 30 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl is-active user@1000.service)\" = active ]"
USER_ENV=(HOME=/home/u USER=u PATH=/home/u/.local/bin:/usr/local/bin:/usr/bin:/bin XDG_RUNTIME_DIR=/run/user/1000)
asu() { ct runuser -u u -- env -i "${USER_ENV[@]}" DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus "$@"; }
run() { out=$(asu "$@" 2>&1) && rc=0 || rc=$?; }
uprop() { asu systemctl --user show -P "$2" "$1"; }
workload() { # NAME ORDER
    printf 'exec = ["/opt/berth-test/workload", "%s"]\norder = %s\n' "$1" "$2" >"$R/home/u/.config/berth/workloads/$1.toml"
}
ct runuser -u u -- mkdir -p /home/u/.config/berth/workloads
workload u1 0
workload u2 10
ct chown -R u:u /home/u/.config

# --- 1. installed system-wide -------------------------------------------------------
check "the user units are installed" test -f "$R/usr/lib/systemd/user/berth-drain.service"
check "the user generator is the system one, linked" test -L "$R/usr/lib/systemd/user-generators/berth-generator"
run berth --user install
check_eq "berth --user install: exit 0" "0" "$rc"
check_contains "... enables berth.target" "enabled berth.target" "$out"
check_contains "... verified" "verified: berth-daemon.service active" "$out"
check_lacks "... with lingering on, no lingering note" "lingering is off" "$out"
check "... under default.target" test -L "$R/home/u/.config/systemd/user/default.target.wants/berth.target"
check_eq "... and writes no unit copies" "" "$(ct find /home/u/.config/systemd/user -name 'berth*' ! -name berth.target)"
check "the user generator read ~/.config/berth" test -f "$R/run/user/1000/systemd/generator/berth@u1.service.d/10-berth.conf"
for w in u1 u2; do
    check "berth@$w started by the user's autostart" wait_for 20 sh -c "[ \"\$(nsenter -t $CT_PID -a runuser -u u -- env XDG_RUNTIME_DIR=/run/user/1000 systemctl --user is-active berth@$w.service)\" = active ]"
done
check_eq "the default deadline fits the user manager: TimeoutStopSec 60 + 30 s" "1min 30s" "$(uprop berth-drain.service TimeoutStopUSec)"
check_contains "the user drain runs berth --user" "ExecStop=/usr/bin/berth --user drain" "$(asu systemctl --user cat berth-drain.service)"
check "the API socket is in the user's runtime directory" wait_for 10 test -S "$R/run/user/1000/berthd/api.sock"
out=$(asu systemd-analyze --user verify --man=no /usr/lib/systemd/user/berth.target /usr/lib/systemd/user/berth-drain.service \
    /usr/lib/systemd/user/berth-autostart.service /usr/lib/systemd/user/berth-daemon.service /usr/lib/systemd/user/berth.slice 2>&1) && rc=0 || rc=$?
check_eq "systemd-analyze --user verify of the user units is clean" "0:" "$rc:$out"

# The user units' ratings, for the record (no target: a user manager
# without user namespaces cannot set up most of the sandbox).
for u in berth-daemon.service berth-drain.service berth-autostart.service; do
    log "exposure (user manager): $(asu systemd-analyze --user security --no-pager "$u" 2>&1 | tail -n 1)"
done

js() { python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1], {}, {'v': v}))" "$1"; }
healthy() { [ "$(asu berth --user status --json | js "v.get('daemon', {}).get('health')")" = healthy ]; }
check "the user daemon reports healthy after its first pass" wait_for 20 healthy
check_eq "berth --user status: user manager, installed, loaded, healthy" "user True True healthy" \
    "$(asu berth --user status --json | js "v['manager'], v['installed'], v['loaded'], v['daemon']['health']" | tr -d "(),'")"
check_eq "without the user bus, status still reaches the manager (private socket)" "True active" \
    "$(ct runuser -u u -- env -i "${USER_ENV[@]}" DBUS_SESSION_BUS_ADDRESS=unix:path=/nonexistent berth --user status --json | js "v['loaded'], v['units']['berth-drain.service']['active_state']" | tr -d "(),'")"
out=$(ct runuser -u u -- env -i HOME=/home/u PATH=/usr/bin:/bin berth --user status --json) && rc=0 || rc=$?
check_eq "without XDG_RUNTIME_DIR, status exits 0" "0" "$rc"
check_eq "... and says why it is not loaded" "False XDG_RUNTIME_DIR is not set" \
    "$(printf '%s' "$out" | js "v['loaded'], v['reason'][:26]" | tr -d "(),'")"

run berth --user freeze --reason maintenance
check "berth --user freeze writes %h/.local/state/berth/freeze/node" test -f "$R/home/u/.local/state/berth/freeze/node"
asu systemctl --user restart berth-autostart.service
check_eq "... which the user autostart unit's condition sees" "no" "$(uprop berth-autostart.service ConditionResult)"
run berth --user thaw
check "berth --user thaw" test ! -e "$R/home/u/.local/state/berth/freeze/node"

printf 'drain_deadline_s = 100\n' >"$R/home/u/.config/berth/berth.toml"
printf 'exec = ["/bin/true"]\nuser = "root"\n' >"$R/home/u/.config/berth/workloads/bad.toml"
run berth --user check
check_eq "berth --user check of a config unfit for a user manager: exit 1" "1" "$rc"
check_contains "... a deadline over the user manager's stop limit" "user@.service" "$out"
check_contains "... says what fits" "use at most 75 s" "$out"
check_contains "... user= has no meaning there" "is for the system manager" "$out"
rm "$R/home/u/.config/berth/berth.toml" "$R/home/u/.config/berth/workloads/bad.toml"

ids=$(for w in u1 u2; do uprop "berth@$w.service" InvocationID; done | xargs)
asu systemctl --user restart berth-daemon.service
check_eq "restarting the user daemon touches no workload" "$ids" "$(for w in u1 u2; do uprop "berth@$w.service" InvocationID; done | xargs)"

run berth --user uninstall
check_eq "berth --user uninstall: exit 0" "0" "$rc"
check "... disables berth.target" test ! -e "$R/home/u/.config/systemd/user/default.target.wants/berth.target"

# --- 2. per-user, without the system-wide files ----------------------------------------
ct sh -c 'mkdir -p /opt/src && cp /usr/bin/berth /opt/src/ && rm -f /usr/lib/systemd/user/berth* /usr/lib/systemd/user-generators/berth-generator'
asu systemctl --user daemon-reload
run /opt/src/berth --user install
check_eq "per-user install without root: exit 0" "0" "$rc"
# The binary, 7 units, and the generator's output: drop-ins for the drain,
# the daemon, u1 and u2, and the daemon's wants-link.
check_contains "... writes the binary, 7 units and the generator's output" "wrote 13 file(s) of 13" "$out"
check_contains "... verified" "verified: berth-daemon.service active" "$out"
check "... the binary in ~/.local/bin" test -x "$R/home/u/.local/bin/berth"
check_contains "... which the units run" "ExecStop=/home/u/.local/bin/berth --user drain" "$(asu systemctl --user cat berth-drain.service)"
check "... the generator's output in ~/.config/systemd/user" test -f "$R/home/u/.config/systemd/user/berth@u1.service.d/10-berth.conf"
check_eq "... owned by the user" "u" "$(ct stat -c %U /home/u/.local/bin/berth)"
check_eq "workloads kept their invocations" "$ids" "$(for w in u1 u2; do uprop "berth@$w.service" InvocationID; done | xargs)"
run berth --user install
check_eq "install again: exit 0" "0" "$rc"
check_contains "... verified" "verified: berth-daemon.service active" "$out"
check_lacks "... writes nothing" "wrote" "$out"

workload u3 20
ct chown u:u /home/u/.config/berth/workloads/u3.toml
run berth --user reload
check_eq "berth --user reload: exit 0" "0" "$rc"
check_contains "... renders the new workload" "rendered the generator's output" "$out"
check "berth@u3 can start" asu systemctl --user start berth@u3.service
check_eq "... and runs" "active" "$(uprop berth@u3.service ActiveState)"

# Issue 31, item 4: add and remove write the per-user units too.
run berth --user add u4 --now -- /opt/berth-test/workload u4
check_eq "per-user berth --user add --now: exit 0" "0" "$rc"
check_eq "... whose unit runs the workload" "active" "$(uprop berth@u4.service ActiveState)"
check_contains "... from its drop-in" 'ExecStart="/opt/berth-test/workload" "u4"' "$(asu systemctl --user cat berth@u4.service)"
run berth --user remove u4 --stop
check_eq "per-user berth --user remove --stop: exit 0" "0" "$rc"
check "... removes its drop-in" test ! -e "$R/home/u/.config/systemd/user/berth@u4.service.d/10-berth.conf"
check_lacks "... and list no longer shows it" "u4" "$(asu berth --user list)"
check_contains "... and its unit would run nothing of it" "not-configured u4" "$(asu systemctl --user show -P ExecStart berth@u4.service)"

# A system-wide user generator arrives later (a package): reload hands over
# to it, removing the per-user copies of its output, which would shadow it.
ct ln -s /usr/lib/systemd/system-generators/berth-generator /usr/lib/systemd/user-generators/berth-generator
run berth --user reload
check_contains "reload after a system-wide user generator appeared" "removed 6 per-user copies" "$out"
check "... whose output now counts" test -f "$R/run/user/1000/systemd/generator/berth@u3.service.d/10-berth.conf"
check "... and no per-user copy shadows it" test ! -e "$R/home/u/.config/systemd/user/berth@u3.service.d/10-berth.conf"
check_eq "... workloads untouched" "active" "$(uprop berth@u3.service ActiveState)"

u1pid=$(uprop berth@u1.service MainPID)
run berth --user uninstall
check_eq "per-user uninstall: exit 0" "0" "$rc"
check_eq "... removes everything it wrote" "" "$(ct find /home/u/.config/systemd/user /home/u/.local/bin -name 'berth*')"
check "... leaves the workloads running" test -d "$R/proc/$u1pid"
run /opt/src/berth --user install
check_eq "installing again: exit 0" "0" "$rc"
check_eq "... the workloads kept their invocations throughout" "$ids" "$(for w in u1 u2; do uprop "berth@$w.service" InvocationID; done | xargs)"

# --- 3. power-off: the user manager's drain -----------------------------------------------
ct_poweroff 180
for w in u1 u2 u3; do
    check_contains "$w was stopped gracefully by the user drain" "stop-end" "$(cat "$CT_DIR/out/$w.log" 2>/dev/null)"
done
t() { awk -v e=stop-begin '$1 == e { print $2; exit }' "$CT_DIR/out/$1.log"; }
check "reverse start order: u3 before u2 before u1" python3 -c "import sys; a=[float(x) for x in sys.argv[1:]]; sys.exit(0 if a[0] <= a[1] <= a[2] else 1)" "$(t u3)" "$(t u2)" "$(t u1)"
check_contains "the user drain reported" "drain done" "$(ct_journal -o cat -t berth 2>/dev/null)"
