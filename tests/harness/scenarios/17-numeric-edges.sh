#!/usr/bin/env bash
# harness-job: minutes=0.2 after=unit-tests
# Issue 10, defect 5, on systemd itself: every numeric edge value berth
# accepts (the files of tests/verify.rs, kept with BERTH_KEEP_EDGES) is
# loaded by PID 1 with no parse warning, on both systemd versions; and a
# LimitNOFILE above fs.nr_open, which systemd lowers at start, is read back
# from the running workload.
source "$(dirname "$0")/../lib.sh"
scenario_begin 17-numeric-edges

config=$HARNESS_DIR/run/edges-config
rm -rf "$config"
mkdir -p "$config/workloads"
(cd "$REPO" && BERTH_KEEP_EDGES="$config/workloads" \
    cargo test --locked -q --test verify numeric_edges_berth_accepts_are_applied_by_systemd) \
    >"$HARNESS_DIR/run/edges-cargo.log" 2>&1 || die "the edge files could not be made; see $HARNESS_DIR/run/edges-cargo.log"
edges=$(find "$config/workloads" -name '*.toml' | wc -l)
for value in '"18446744073709551614"' '"infinity"'; do
    w=nofile-$([ "$value" = '"infinity"' ] && echo inf || echo max)
    printf 'exec = ["/opt/berth-test/workload", "%s", "quick"]\n[service]\nLimitNOFILE = %s\n' "$w" "$value" \
        >"$config/workloads/$w.toml"
done

ct_boot edges "$config"
ct systemctl is-active --wait berth-autostart.service >/dev/null 2>&1 || true
gen=/proc/$CT_PID/root/run/systemd/generator
mapfile -t units < <(cd "$gen" && ls -d berth@*.service.d | sed 's/\.d$//' | grep -v '^berth@nofile-')
log "  $edges edge files, ${#units[@]} accepted by the generator"
check "most edges are refused, some accepted" test "${#units[@]}" -gt 0 -a "${#units[@]}" -lt "$edges"

# A control that the check below must catch: a value systemd ignores.
ct mkdir -p /run/systemd/system/berth@control.service.d
ct sh -c 'printf "[Service]\nMemoryMax=banana\n" >/run/systemd/system/berth@control.service.d/99-control.conf'
since=$(ct date '+%Y-%m-%d %H:%M:%S')
sleep 1.1 # journalctl --since has whole seconds
# A reload parses again what is loaded (the daemon loaded the configured
# units); loading parses the rest. PID 1 logs every value it ignores.
ct systemctl daemon-reload
# (-P prints an empty line between units.)
loaded=$(ct systemctl show -P LoadState "${units[@]}" berth@control.service | grep -v '^$' | sort | uniq -c)
check_eq "every accepted edge unit loads" "$(( ${#units[@]} + 1 )) loaded" "$(echo $loaded)"
warnings=$(ct journalctl _PID=1 --since "$since" -o cat --no-pager | grep -E '\.conf:[0-9]+:' || true)
check_contains "the control's ignored value is logged (the check can fail)" "99-control.conf" "$warnings"
check_eq "no accepted edge value is ignored or refused by systemd $(ct systemctl --version | awk 'NR == 1 { print $2 }')" "" \
    "$(grep -v 99-control.conf <<<"$warnings" || true)"

# LimitNOFILE above fs.nr_open: started, and lowered to PID 1's hard limit.
nr_open=$(ct cat /proc/sys/fs/nr_open)
pid1_hard=$(ct awk '/^Max open files/ { print $5 }' /proc/1/limits)
for w in nofile-max nofile-inf; do
    check_eq "berth@$w started" active "$(ct_prop "berth@$w.service" ActiveState)"
    pid=$(ct_prop "berth@$w.service" MainPID)
    applied=$(ct awk '/^Max open files/ { print $4, $5 }' "/proc/$pid/limits")
    check_eq "berth@$w runs with soft and hard = PID 1's hard limit ($pid1_hard; fs.nr_open $nr_open)" \
        "$pid1_hard $pid1_hard" "$applied"
    log "  measured: berth@$w LimitNOFILE=$(ct_prop "berth@$w.service" LimitNOFILE) applied as $applied"
done
check "PID 1's hard limit is within fs.nr_open" test "$pid1_hard" -le "$nr_open"

ct_poweroff 120
check "power-off completed" test -z "$CT_PID"
