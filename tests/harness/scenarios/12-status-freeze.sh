#!/usr/bin/env bash
# harness-job: minutes=0.3
# Issue 5 (first slice): `berth status` and the freeze verbs, against the
# real units: a node freeze blocks the autostart unit by its condition, an
# instance freeze is skipped by autostart, an explicit start still works,
# re-freezing keeps frozen_at, and status shows all of it plus the last
# drain after the next boot.
source "$(dirname "$0")/../lib.sh"
scenario_begin 12-status-freeze

ct_boot status "$REPO/tests/harness/config/pair"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
sleep 6 # one supervisor pass after the autostart
js() { ct /usr/bin/berth status --json | python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1], {}, {'v': v}))" "$1"; }
check_eq "status: installed and loaded" "True True" "$(js "v['installed'], v['loaded']" | tr -d '(),')"
check_eq "status: the daemon is healthy" "healthy" "$(js "v['daemon']['health']")"
check_eq "status: not frozen" "None" "$(js "v['frozen']['frozen_scope']")"
check_contains "status text" "berth-daemon.service: active" "$(ct /usr/bin/berth status)"

check "berth freeze (node)" ct /usr/bin/berth freeze --reason "disk swap"
check "the node flag is written" test -f "$CT_DIR/state/freeze/node"
first=$(js "v['frozen']['frozen_at']")
check_eq "status shows the node freeze" "node disk swap" "$(js "v['frozen']['frozen_scope'] + ' ' + v['frozen']['reason']")"
sleep 1.1
ct /usr/bin/berth freeze >/dev/null
check_eq "re-freezing keeps frozen_at" "$first" "$(js "v['frozen']['frozen_at']")"
ct systemctl restart berth-autostart.service
check_eq "a frozen node skips the autostart unit" "no" "$(ct_prop berth-autostart.service ConditionResult)"
check "berth thaw (node)" ct /usr/bin/berth thaw
check_eq "thawed" "None" "$(js "v['frozen']['frozen_scope']")"
check_contains "thawing again is fine" "was not frozen" "$(ct /usr/bin/berth thaw)"

check "berth freeze a" ct /usr/bin/berth freeze a --reason "upgrade"
check_eq "status shows the instance freeze" "instance a" "$(js "v['frozen']['frozen_scope'] + ' ' + v['frozen']['instances'][0]['workload']")"
ct systemctl stop berth@a.service berth@b.service
ct systemctl restart berth-autostart.service
check_eq "autostart skips the frozen instance" "inactive" "$(ct_prop berth@a.service ActiveState)"
check_eq "... and starts the other" "active" "$(ct_prop berth@b.service ActiveState)"
check_contains "... saying why" "not starting berth@a.service: frozen since" "$(ct journalctl -b -u berth-autostart.service --no-pager)"
check "an explicit systemctl start still works" ct systemctl start berth@a.service
check "berth thaw a" ct /usr/bin/berth thaw a
check_eq "a bad name is a usage error" 2 "$(ct /usr/bin/berth freeze 'a/b' >/dev/null 2>&1; echo $?)"

ct_poweroff 120
CT_KEEP_STATE=1 ct_boot status ""
check_contains "after the next boot, status shows the last drain" "GracefulOff" "$(ct /usr/bin/berth status --json)"
ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
