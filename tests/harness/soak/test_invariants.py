#!/usr/bin/env python3
"""Table tests of the soak's verdicts (invariants.py report): each case is
a made-up run (samples, fault log, drain reports) with the counts it must
give, so that a checker which could not see a double run, a long gap or a
stop fails here. Run by `make check` and `make soak`."""
import contextlib
import io
import json
import os
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import invariants  # noqa: E402

BOUND = 50
HA = {"db": ["n1", "n2"]}
NODES = {"n1": "/x", "n2": "/y"}


def run(samples, faults=(), drains=(), ha=None, nodes=None):
    """samples: (t, frozen, {workload: nodes}) with nodes a string such as
    "n1,n2"; the spans between them are filled every 0.2 s (None: a span
    the checker did not sample)."""
    with tempfile.TemporaryDirectory() as soak:
        spec = {"nodes": nodes or NODES, "workloads": ["db", "web"], "ha": ha or HA,
                "unowned_bound_s": BOUND, "stop_delay_s": 2, "ttl_s": 5}
        with open(os.path.join(soak, "nodes.json"), "w") as f:
            json.dump(spec, f)
        with open(os.path.join(soak, "samples.log"), "w") as f:
            for (t, cold, where), nxt in zip(samples, list(samples[1:]) + [None]):
                end = nxt[0] if nxt else t + 0.1
                k = 0
                while where is not None and round(t + 0.2 * k, 3) < end:
                    line = f"{t + 0.2 * k:.3f} frozen={cold}"
                    for w in spec["workloads"]:
                        line += f" {w}={where.get(w, '')}"
                    if "owners" in where:
                        line += f" owners={where['owners']}"
                    f.write(line + "\n")
                    k += 1
        lines = list(faults)
        for i, (node, outcomes) in enumerate(drains):
            path = os.path.join(soak, f"drain{i}.json")
            with open(path, "w") as f:
                json.dump({"elapsed_ms": 5, "workloads": [{"workload": w, "outcome": o} for w, o in outcomes]}, f)
            lines.append(f"1.0 drain {node} {path}")
        with open(os.path.join(soak, "faults.log"), "w") as f:
            f.write("".join(line + "\n" for line in lines))
        with contextlib.redirect_stdout(io.StringIO()):
            invariants.report(soak)
        with open(os.path.join(soak, "counts.json")) as f:
            return json.load(f)


UP = ["0.0 up n1", "0.0 up n2"]
BOTH = {"db": "n1", "web": "n1,n2"}


class Verdicts(unittest.TestCase):
    # Owned on n2's live lease, running on n1 only: stuck on n2.
    STUCK = {"db": "n1", "web": "n1,n2", "owners": "db:n2"}
    OWNED = {"db": "n2", "web": "n1,n2", "owners": "db:n2"}

    def test_owned_but_not_running_past_the_reconcile_and_a_start(self):
        c = run([(0, "", self.OWNED), (10, "", self.STUCK), (20, "", self.OWNED)], UP)
        self.assertEqual(c["owned_not_running"], 1)
        self.assertAlmostEqual(c["owned_not_running_longest_s"], 9.8, delta=0.25)

    def test_owned_and_started_within_the_allowance_is_not_stuck(self):
        c = run([(0, "", self.OWNED), (10, "", self.STUCK), (14, "", self.OWNED)], UP)
        self.assertEqual(c["owned_not_running"], 0)
        self.assertGreater(c["owner_samples"], 0)

    def test_a_key_on_a_dead_lease_or_an_unknown_owner_is_not_stuck(self):
        stale = dict(self.STUCK, owners="db:n2~")
        unknown = dict(self.STUCK, owners="?")
        for mid in (stale, unknown):
            c = run([(0, "", self.OWNED), (10, "", mid), (30, "", self.OWNED)], UP)
            self.assertEqual(c["owned_not_running"], 0, mid)

    def test_an_owner_under_a_fault_is_not_stuck(self):
        c = run([(0, "", self.OWNED), (10, "", self.STUCK), (30, "", self.OWNED)],
                UP + ["9.0 down n2 partition", "29.0 up n2"])
        self.assertEqual(c["owned_not_running"], 0)
        # ... but it is once it has been up longer than the allowance.
        c = run([(0, "", self.OWNED), (10, "", self.STUCK), (30, "", self.OWNED)],
                UP + ["9.0 down n2 partition", "12.0 up n2"])
        self.assertEqual(c["owned_not_running"], 1)

    def test_after_injected_start_failures_one_more_backoff_step_is_excused(self):
        # Starts failed on n2 for 6 s (10 to 16): excused until 22.
        faults = UP + ["10.0 down n2 start-failures", "16.0 up n2"]
        c = run([(0, "", self.OWNED), (10, "", self.STUCK), (22.4, "", self.OWNED)], faults)
        self.assertEqual(c["owned_not_running"], 0)
        c = run([(0, "", self.OWNED), (10, "", self.STUCK), (28, "", self.OWNED)], faults)
        self.assertEqual(c["owned_not_running"], 1)

    def test_a_manual_drain_may_stop_the_non_ha_workload(self):
        for kind, want in (("manual-drain", 0), ("failed-start", 0), ("start-failures", 1), ("partition", 1)):
            c = run([(0, "", BOTH), (10, "", {"db": "n1", "web": "n2"}), (12, "", BOTH)],
                    UP + [f"9.0 down n1 {kind}", "11.0 up n1"])
            self.assertEqual(c["non_ha_stops"], want, kind)

    def test_a_quiet_run_counts_nothing(self):
        c = run([(0, "", BOTH), (100, "", BOTH)], UP)
        self.assertEqual((c["double_runs"], c["unowned_past_bound"], c["stops_by_daemon_restart"],
                          c["non_ha_stops"], c["drains"], c["unsettled"]), (0, 0, 0, 0, 0, 0))
        self.assertEqual(c["longest_sample_gap_s"], 0.2)
        self.assertTrue(c["final_ha_running_once"])
        self.assertTrue(c["final_non_ha_everywhere"])

    def test_the_final_state(self):
        c = run([(0, "", BOTH), (10, "", {"db": "n1,n2", "web": "n1"})], UP)
        self.assertFalse(c["final_ha_running_once"])
        self.assertFalse(c["final_non_ha_everywhere"])

    def test_samples_must_cover_the_faults(self):
        self.assertTrue(run([(0, "", BOTH), (100, "", BOTH)], UP + ["50.0 end"])["samples_cover_the_run"])
        self.assertFalse(run([(0, "", BOTH), (100, "", BOTH)], UP + ["150.0 end"])["samples_cover_the_run"])
        late = UP + ["2.0 down n1 partition", "3.0 up n1", "50.0 end"]
        self.assertFalse(run([(5, "", BOTH), (100, "", BOTH)], late)["samples_cover_the_run"])

    def test_no_samples_at_all(self):
        with tempfile.TemporaryDirectory() as soak:
            with open(os.path.join(soak, "nodes.json"), "w") as f:
                json.dump({"nodes": NODES, "workloads": ["db"], "ha": HA, "unowned_bound_s": BOUND,
                           "stop_delay_s": 2, "ttl_s": 5}, f)
            open(os.path.join(soak, "samples.log"), "w").close()
            open(os.path.join(soak, "faults.log"), "w").close()
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(invariants.report(soak), 1)

    def test_two_running_copies_are_a_double_run(self):
        c = run([(0, "", BOTH), (10, "", {"db": "n1,n2", "web": "n1,n2"}), (11, "", BOTH)], UP)
        self.assertEqual(c["double_runs"], 1)

    def test_a_copy_on_a_frozen_root_does_not_run(self):
        c = run([(0, "", BOTH), (10, "n1", {"db": "n1,n2", "web": "n1,n2"}), (11, "", {"db": "n2", "web": "n1,n2"})],
                UP)
        self.assertEqual(c["double_runs"], 0)

    STALL = UP + ["20.0 down n1 long-stall", "20.0 stall n1 db", "30.0 stall-thaw n1", "31.0 up n1"]

    def test_a_double_run_just_after_the_long_thaw_is_the_stalled_window(self):
        c = run([(0, "", BOTH), (20, "n1", {"db": "n1,n2", "web": "n1,n2"}),
                 (30, "", {"db": "n1,n2", "web": "n1,n2"}), (31.4, "", {"db": "n2", "web": "n1,n2"})], self.STALL)
        self.assertEqual(c["double_runs"], 0)
        self.assertEqual(c["stale_copies_survived"], 0)
        self.assertAlmostEqual(c["stalled_window_s"], 1.4, delta=0.25)

    def test_after_the_stall_the_stale_copy_must_not_be_the_one_left(self):
        c = run([(0, "", BOTH), (20, "n1", {"db": "n1,n2", "web": "n1,n2"}),
                 (30, "", {"db": "n1,n2", "web": "n1,n2"}), (31.4, "", BOTH)], self.STALL)
        self.assertEqual(c["stale_copies_survived"], 1)

    def test_a_peer_lost_to_another_fault_first_is_not_a_surviving_stale_copy(self):
        # The peer's root is killed 1 s after the thaw; the stale copy
        # stops 1.8 s after it, within stop_delay_s + 4.
        faults = self.STALL + ["31.0 down n2 root-kill", "40.0 up n2"]
        c = run([(0, "", BOTH), (20, "n1", {"db": "n1,n2", "web": "n1,n2"}),
                 (30, "", {"db": "n1,n2", "web": "n1,n2"}), (31.0, "", {"db": "n1", "web": "n1"}),
                 (31.8, "", {"web": "n1"}), (37, "", {"web": "n1"}), (41, "", {"db": "n2", "web": "n1,n2"})],
                faults)
        self.assertEqual(c["stale_copies_survived"], 0)

    def test_the_stalled_host_may_take_it_again_once_its_stale_copy_is_gone(self):
        # The peer reboots after the thaw (its old lease revoked): the
        # stalled host stops its stale copy, then rightly takes db again.
        faults = self.STALL + ["31.0 down n2 root-kill-boot", "33.0 up n2"]
        c = run([(0, "", BOTH), (20, "n1", {"db": "n1,n2", "web": "n1,n2"}),
                 (30, "", {"db": "n1,n2", "web": "n1,n2"}), (31.0, "", {"db": "n1", "web": "n1"}),
                 (32.6, "", {"web": "n1"}), (34.5, "", {"db": "n1", "web": "n1,n2"}),
                 (37, "", {"db": "n1", "web": "n1,n2"})], faults)
        self.assertEqual(c["stale_copies_survived"], 0)

    def test_a_stale_copy_still_running_past_the_bound_survived(self):
        faults = self.STALL + ["31.0 down n2 root-kill", "40.0 up n2"]
        c = run([(0, "", BOTH), (20, "n1", {"db": "n1,n2", "web": "n1,n2"}),
                 (30, "", {"db": "n1,n2", "web": "n1,n2"}), (31.0, "", {"db": "n1", "web": "n1"}),
                 (37, "", {"db": "n1", "web": "n1"}), (41, "", {"db": "n2", "web": "n1,n2"})], faults)
        self.assertEqual(c["stale_copies_survived"], 1)

    def test_the_stall_excuses_only_what_the_stalled_host_owned(self):
        faults = UP + ["20.0 down n1 long-stall", "20.0 stall n1", "30.0 stall-thaw n1", "31.0 up n1"]
        c = run([(0, "", BOTH), (20, "n1", {"db": "n1,n2", "web": "n1,n2"}),
                 (30, "", {"db": "n1,n2", "web": "n1,n2"}), (31.4, "", {"db": "n2", "web": "n1,n2"})], faults)
        self.assertEqual(c["double_runs"], 1)

    def test_the_stall_excuses_only_a_double_run_on_the_stalled_host(self):
        three = {"n1": "/x", "n2": "/y", "n3": "/z"}
        ha = {"db": ["n1", "n2", "n3"]}
        every = {"db": "n2", "web": "n1,n2,n3"}
        c = run([(0, "", every), (30, "", {"db": "n2,n3", "web": "n1,n2,n3"}), (31.4, "", every)],
                ["0.0 up n1", "0.0 up n2", "0.0 up n3", "20.0 down n1 long-stall", "20.0 stall n1 db",
                 "30.0 stall-thaw n1", "31.0 up n1"], ha=ha, nodes=three)
        self.assertEqual(c["double_runs"], 1)

    def test_a_double_run_that_began_before_the_thaw_is_not_the_stall(self):
        c = run([(0, "", BOTH), (25, "", {"db": "n1,n2", "web": "n1,n2"}), (31.4, "", {"db": "n2", "web": "n1,n2"})],
                self.STALL)
        self.assertEqual(c["double_runs"], 1)

    def test_a_double_run_long_after_the_thaw_is_not(self):
        c = run([(0, "", BOTH), (40, "", {"db": "n1,n2", "web": "n1,n2"}), (41, "", BOTH)],
                UP + ["20.0 down n1 long-stall", "30.0 stall-thaw n1", "31.0 up n1"])
        self.assertEqual(c["double_runs"], 1)
        self.assertEqual(c["stalled_window_s"], 0.0)

    def test_nowhere_past_the_bound_while_a_candidate_is_up(self):
        c = run([(0, "", BOTH), (10, "", {"web": "n1,n2"}), (10 + BOUND + 5, "", BOTH)], UP)
        self.assertEqual(c["unowned_past_bound_any_candidate"], 1)
        self.assertEqual(c["unowned_past_bound"], 1)

    def test_nowhere_within_the_bound_is_fine(self):
        c = run([(0, "", BOTH), (10, "", {"web": "n1,n2"}), (10 + BOUND - 5, "", BOTH)], UP)
        self.assertEqual(c["unowned_past_bound_any_candidate"], 0)
        self.assertEqual(c["unowned_past_bound"], 0)

    def test_a_node_that_is_no_candidate_does_not_count(self):
        c = run([(0, "", BOTH), (10, "", {"web": "n1,n2"}), (10 + BOUND + 5, "", BOTH)],
                UP + ["9.0 down n1 partition", "200.0 up n1"], ha={"db": ["n1"]})
        self.assertEqual(c["unowned_past_bound_any_candidate"], 0)
        self.assertEqual(c["unowned_past_bound"], 0)

    def test_a_candidate_before_the_taker_coming_back_is_no_excuse(self):
        # n1 (first) was down and came back 20 s into the gap; n2 was up
        # throughout, past the bound: judged (n2 takes while n1 waits).
        gap = [(0, "", BOTH), (10, "", {"web": "n1,n2"})]
        faults = UP + ["5.0 down n1 root-kill-boot", "30.0 up n1"]
        c = run(gap + [(30 + BOUND - 5, "", BOTH)], faults)
        self.assertEqual(c["unowned_past_bound_any_candidate"], 1)
        # The narrower rule of the first version excused it.
        self.assertEqual(c["unowned_past_bound"], 0)
        self.assertEqual(run(gap + [(30 + BOUND + 5, "", BOTH)], faults)["unowned_past_bound"], 1)

    def test_nowhere_while_every_candidate_had_a_fault_is_fine(self):
        c = run([(0, "", BOTH), (10, "", {"web": "n1,n2"}), (10 + BOUND + 5, "", BOTH)],
                UP + ["9.0 down all etcd-restart", "30.0 up n1", "30.0 up n2"])
        self.assertEqual(c["unowned_past_bound_any_candidate"], 0)
        self.assertEqual(c["unowned_past_bound"], 0)

    def test_a_stop_during_a_daemon_restart(self):
        c = run([(0, "", BOTH), (10, "", {"web": "n1,n2"}), (20, "", BOTH)],
                UP + ["9.0 down n1 daemon-kill", "11.0 up n1"])
        self.assertEqual(c["stops_by_daemon_restart"], 1)

    def test_a_stop_after_a_daemon_restart_is_put_down_to_it(self):
        # Healthy again at 11 s; a stop 5 s later (a fence timer the new
        # daemon failed to disarm) is still the restart's doing.
        for kind in ("daemon-kill", "daemon-stop-within-grace"):
            c = run([(0, "", BOTH), (16, "", {"web": "n1,n2"}), (20, "", BOTH)],
                    UP + [f"9.0 down n1 {kind}", "11.0 up n1"])
            self.assertEqual(c["stops_by_daemon_restart"], 1, kind)

    def test_a_daemon_restart_on_another_node_is_not_the_cause(self):
        c = run([(0, "", BOTH), (20, "", {"web": "n1,n2"}), (30, "", BOTH)],
                UP + ["19.0 down n2 daemon-kill", "21.0 up n2"])
        self.assertEqual(c["stops_by_daemon_restart"], 0)
        self.assertEqual(c["ha_stops_without_a_fault"], 1)

    def test_a_stop_during_a_partition_is_not_a_restart_stop(self):
        c = run([(0, "", BOTH), (10, "", {"web": "n1,n2"}), (20, "", BOTH)],
                UP + ["9.0 down n1 partition", "11.0 up n1"])
        self.assertEqual(c["stops_by_daemon_restart"], 0)
        self.assertEqual(c["ha_stops_without_a_fault"], 0)

    def test_an_ha_stop_long_after_the_fault_is_unexplained(self):
        c = run([(0, "", BOTH), (40, "", {"web": "n1,n2"}), (50, "", BOTH)],
                UP + ["9.0 down n1 partition", "11.0 up n1"])
        self.assertEqual(c["ha_stops_without_a_fault"], 1)

    def test_a_root_frozen_is_no_stop(self):
        c = run([(0, "", BOTH), (10, "n1", BOTH), (12, "", BOTH)], UP + ["9.0 down n1 root-freeze", "13.0 up n1"])
        self.assertEqual((c["stops_by_daemon_restart"], c["non_ha_stops"], c["ha_stops_without_a_fault"]), (0, 0, 0))

    def test_unsettled_and_missing_drains_are_counted(self):
        c = run([(0, "", BOTH), (10, "", BOTH)], UP + ["5.0 unsettled n1", "6.0 drain-missing n2"])
        self.assertEqual((c["unsettled"], c["drains_missing"]), (1, 1))

    def test_the_non_ha_workload_stops_only_with_its_root(self):
        stop = [(0, "", BOTH), (20, "", {"db": "n1", "web": "n2"}), (30, "", BOTH)]
        self.assertEqual(run(stop, UP)["non_ha_stops"], 1)
        self.assertEqual(run(stop, UP + ["19.0 down n1 partition", "21.0 up n1"])["non_ha_stops"], 1)
        self.assertEqual(run(stop, UP + ["19.0 down n1 poweroff-boot", "25.0 up n1"])["non_ha_stops"], 0)
        self.assertEqual(run(stop, UP + ["19.0 down n1 root-kill-boot", "25.0 up n1"])["non_ha_stops"], 0)
        # Until the first "up" and a while after: the boot.
        self.assertEqual(run(stop, ["0.0 up n2", "15.0 up n1"])["non_ha_stops"], 0)

    def test_drain_outcomes(self):
        c = run([(0, "", BOTH), (10, "", BOTH)], UP,
                [("n1", [("db", "GracefulOff"), ("web", "AlreadyOff")]), ("n2", [("db", "ForcedOff")])])
        self.assertEqual(c["drains"], 2)
        self.assertEqual(c["drain_outcomes"], {"GracefulOff": 1, "AlreadyOff": 1, "ForcedOff": 1})
        self.assertEqual(c["drain_outcomes_not_graceful"], 1)

    def test_a_gap_in_sampling_shows(self):
        c = run([(0, "", BOTH), (10, "", None), (15, "", BOTH)], UP)
        self.assertGreaterEqual(c["longest_sample_gap_s"], 4.8)


class Watch(unittest.TestCase):
    def test_it_reads_populated_and_frozen_cgroups(self):
        with tempfile.TemporaryDirectory() as soak, tempfile.TemporaryDirectory() as cg:
            def unit(root, w, populated):
                d = os.path.join(cg, root, "payload", "berth.slice", f"berth@{w}.service")
                os.makedirs(d)
                with open(os.path.join(d, "cgroup.events"), "w") as f:
                    f.write(f"populated {int(populated)}\nfrozen 0\n")
            for root, frozen in (("a", "0"), ("b", "1")):
                os.makedirs(os.path.join(cg, root))
                with open(os.path.join(cg, root, "cgroup.freeze"), "w") as f:
                    f.write(frozen + "\n")
            unit("a", "db", True)
            unit("a", "web", True)
            unit("b", "db", False)
            unit("b", "web", True)
            with open(os.path.join(soak, "nodes.json"), "w") as f:
                json.dump({"nodes": {"n1": os.path.join(cg, "a"), "n2": os.path.join(cg, "b"),
                                     "n3": os.path.join(cg, "gone")}, "workloads": ["db", "web"]}, f)
            t = threading.Timer(0.5, lambda: open(os.path.join(soak, "stop"), "w").close())
            t.start()
            invariants.watch(soak)
            t.join()
            with open(os.path.join(soak, "samples.log")) as f:
                lines = f.read().splitlines()
            self.assertGreaterEqual(len(lines), 2)
            self.assertEqual(lines[0].split()[1:], ["frozen=n2", "db=n1", "web=n1,n2"])


if __name__ == "__main__":
    unittest.main()
