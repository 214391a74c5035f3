#!/usr/bin/env bash
# harness-job: minutes=0.6
# Issue 12, part 3: autostart = "last-state" over seven boots of one host.
#  1. first boot, no drain recorded: the last state is unknown and every
#     last-state workload starts;
#  2. after a power-off with one workload stopped by the admin: what was
#     running (a ForcedOff one too) starts again, the stopped one stays
#     off, a workload added since starts, true and false do as they say;
#  3. after `berth drain` by hand and a power loss: that drain does not
#     count, everything starts;
#  4. a clean power-off with one stopped and one crashed (failed): the
#     crashed one starts, the stopped one stays off;
#  5. after a power loss in boot 4, the drain of boot 3 is stale: everything
#     starts;
#  6. a boot with berth.freeze on the kernel command line starts nothing;
#  7. its drain found everything off, which says nothing: everything starts.
source "$(dirname "$0")/../lib.sh"
scenario_begin 26-last-state

# power_loss: the container's PID 1 killed from the host, no shutdown.
power_loss() {
    kill -9 "$CT_PID"
    ct_wait_exit 30
}
boot() {
    ct_boot last-state "$REPO/tests/harness/config/last-state"
    ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
    BOOT_ID=$(ct cat /proc/sys/kernel/random/boot_id)
}
state() { ct_prop "berth@$1.service" ActiveState; }
autostart_log() { ct journalctl -b -u berth-autostart.service -o cat --no-pager; }
report() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($1)" "$CT_DIR/state/last-drain.json"; }
expect() {
    local when=$1 w
    shift
    for w in "$@"; do
        case $w in
            -*) check_eq "$when: ${w#-} stays off" inactive "$(state "${w#-}")" ;;
            *) check_eq "$when: $w started" active "$(state "$w")" ;;
        esac
    done
}

# 1. First boot.
boot
boot1=$BOOT_ID
expect "boot 1 (no drain recorded)" up stopped stubborn always -never
check_contains "boot 1 says why" 'last state unknown: no drain has been recorded' "$(autostart_log)"
ct systemctl stop berth@stopped.service berth@always.service
ct_poweroff 60

# 2. After a clean power-off; a workload added while the host was off.
printf 'exec = ["/opt/berth-test/workload", "added"]\n' >"$CT_DIR/etc-berth/workloads/added.toml"
check_eq "the drain of boot 1 says a shutdown ran it" True "$(report 'r["shutdown"]')"
check_eq "the drain of boot 1 records its boot id" "$boot1" "$(report 'r["boot_id"]')"
check_contains "... and its run" "$boot1/" "$(report 'r["run"]')"
check_eq "stubborn was forced off" ForcedOff "$(report '[w["outcome"] for w in r["workloads"] if w["workload"] == "stubborn"][0]')"
check_eq "stopped was found off" off "$(report '[w["found"] for w in r["workloads"] if w["workload"] == "stopped"][0]')"
CT_KEEP_STATE=1 boot
boot2=$BOOT_ID
check "each container boot has a boot id of its own ($boot1, $boot2)" test "$boot1" != "$boot2"
expect "boot 2 (after a power-off)" up -stopped stubborn always -never added
log=$(autostart_log)
check_contains "boot 2 names the drain it goes by" "last state: the shutdown drain of run $boot1/" "$log"
check_contains "boot 2 says why stopped stays off" \
    'not starting berth@stopped.service: autostart = "last-state" and it was stopped when the last shutdown drain began' "$log"
check_contains "boot 2 says why added starts" \
    'starting berth@added.service (autostart = "last-state"): it was added since the last shutdown drain' "$log"
check_contains "the ledger knows boot 1 came before" "\"previous\": \"$boot1/" "$(cat "$CT_DIR/state/runs.json")"

# 3. A drain by hand, then power lost: that drain does not count.
ct berth drain >/dev/null 2>&1
check_eq "a drain by hand says so in its report" False "$(report 'r["shutdown"]')"
check_contains "berth drain --last says who ran it" "by hand" "$(ct berth drain --last)"
power_loss
CT_KEEP_STATE=1 boot
expect "boot 3 (after a drain by hand and a power loss)" up stopped stubborn always -never added
check_contains "boot 3 says the drain was by hand" "was run by hand, not by a shutdown" "$(autostart_log)"

# 4. A clean power-off with stopped stopped and up crashed (no restart:
# failed).
ct systemctl stop berth@stopped.service
ct systemctl kill -s KILL berth@up.service
check "up crashed: its unit failed" wait_for 10 sh -c "[ \"\$(nsenter -t $CT_PID -a systemctl show -P ActiveState berth@up.service)\" = failed ]"
ct_poweroff 60
check_eq "up was found failed" failed "$(report '[w["found"] for w in r["workloads"] if w["workload"] == "up"][0]')"
CT_KEEP_STATE=1 boot
boot4=$BOOT_ID
expect "boot 4 (after a power-off)" up -stopped stubborn always -never added
check_contains "berth drain --last names the shutdown's boot" "by the shutdown of boot" "$(ct berth drain --last)"

# 5. Power lost in boot 4: the drain of boot 3 is not of the previous run.
power_loss
CT_KEEP_STATE=1 boot
expect "boot 5 (after a power loss)" up stopped stubborn always -never added
check_contains "boot 5 says the drain is stale" "is not of the previous run" "$(autostart_log)"
check_contains "the ledger knows boot 4 came before" "\"previous\": \"$boot4/" "$(cat "$CT_DIR/state/runs.json")"
ct_poweroff 60

# 6. A frozen boot starts nothing; its drain finds everything off.
CT_KEEP_STATE=1 ct_boot last-state "" berth.freeze
expect "boot 6 (berth.freeze)" -up -stopped -stubborn -always -never -added
ct_poweroff 60
check_contains "the drain of a frozen boot says so" "berth.freeze" "$(report 'r["node_frozen"]')"

# 7. What was off in a frozen boot says nothing: everything starts.
CT_KEEP_STATE=1 boot
expect "boot 7 (after a frozen boot)" up stopped stubborn always -never added
check_contains "boot 7 says why" "the node was frozen in the run the last drain" "$(autostart_log)"
ct_poweroff 60
