//! `berth drain`: stop every running workload in reverse start order,
//! bounded in parallelism and by one deadline, with a typed outcome each.
//!
//! Runs as berth-drain.service's ExecStop during a real shutdown, or by
//! hand. Best effort: it always finishes, records and exits 0. [`plan`]
//! decides (pure), [`execute`] carries it out through `systemd::Ops`,
//! [`report`] tells each outcome (records, journal, `last-drain.json`).
//! A [`Companion`] rides along in cluster mode (told each outcome, a
//! fence beside the stops, a finish); [`stop_at_once`] is the one stop
//! path offered outside, for that fence.

pub mod companion;
pub mod execute;
pub mod plan;
pub mod progress;
pub mod report;

pub use companion::{Companion, run_with};
pub use execute::{run, run_telling, stop_at_once};
pub use plan::{DryRun, Target, dry_run};
pub use report::{SUMMARY_MESSAGE_ID, unreachable};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Loaded;
    use crate::events::Events;
    use crate::paths::Root;
    use crate::state::drain_report::{Outcome, Report};
    use crate::state::records::{RecordState, TransitionReason};
    use crate::systemd::fake::{Behaviour, FakeOps};
    use crate::testing::temp_root as setup;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn outcomes(report: &Report) -> BTreeMap<String, (Outcome, Option<&str>)> {
        report
            .workloads
            .iter()
            .map(|w| (w.workload.clone(), (w.outcome, w.code.as_deref())))
            .collect()
    }

    const SEC: Duration = Duration::from_secs(1);

    /// A drain whose deadline counts from now.
    async fn drain_now(ops: &FakeOps, root: &Root, loaded: &Loaded) -> Report {
        run(
            ops,
            root,
            loaded,
            &Events::new("test"),
            tokio::time::Instant::now(),
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn groups_run_in_reverse_order_and_parallelism_is_bounded() {
        let (_d, root, loaded) = setup(
            "drain_parallelism = 2",
            &[
                ("a", "order = 0"),
                ("b", "order = 10"),
                ("c", "order = 10"),
                ("d", "order = 10"),
                ("e", "order = 20"),
            ],
        );
        let ops = ["a", "b", "c", "d", "e"]
            .iter()
            .fold(FakeOps::default(), |f, n| f.unit(n, true, Behaviour::Takes(SEC)));
        let report = drain_now(&ops, &root, &loaded).await;
        assert!(
            outcomes(&report).values().all(|o| o.0 == Outcome::GracefulOff),
            "{report:?}"
        );
        assert_eq!(ops.peak("stop"), 2);
        let (e_begin, e_end) = ops.span("e", "stop");
        let group10: Vec<_> = ["b", "c", "d"].iter().map(|n| ops.span(n, "stop")).collect();
        assert!(
            group10.iter().all(|(b, _)| *b >= e_end),
            "group 10 began before group 20 ended"
        );
        let group10_end = group10.iter().map(|s| s.1).max().unwrap();
        assert!(ops.span("a", "stop").0 >= group10_end);
        // 1 s + 2 rounds of 1 s + 1 s.
        assert_eq!(ops.span("a", "stop").1 - e_begin, 4 * SEC);
    }

    /// Issue 10, defect 2: 20 held locks turned a 72 ms drain into 39.7 s
    /// (a blocking 1 s wait per lock, twice, on the drain's only thread).
    #[tokio::test(start_paused = true)]
    async fn held_locks_delay_neither_the_stops_nor_each_other() {
        let names: Vec<String> = (0..20).map(|i| format!("w{i}")).collect();
        let workloads: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "")).collect();
        let (_d, root, loaded) = setup("drain_parallelism = 20", &workloads);
        let ops = names.iter().fold(FakeOps::default(), |f, n| {
            f.unit(n, true, Behaviour::Takes(Duration::ZERO))
        });
        let _held: Vec<_> = names
            .iter()
            .map(|n| crate::state::lock::workload(&root, n).unwrap())
            .collect();
        let wall = std::time::Instant::now();
        let report = drain_now(&ops, &root, &loaded).await;
        assert!(
            outcomes(&report).values().all(|o| o.0 == Outcome::GracefulOff),
            "every stop goes ahead without its lock: {report:?}"
        );
        // One bounded wait, all at once, on the runtime's clock.
        assert!(report.elapsed_ms <= 1100, "{} ms", report.elapsed_ms);
        assert!(
            wall.elapsed() < Duration::from_secs(5),
            "the runtime's thread was blocked for {:?}",
            wall.elapsed()
        );
    }

    /// Issue 10: with a bus that stopped answering, calls queued behind
    /// the bound for 10 s each and the drain overran its TimeoutStopSec=,
    /// killed before writing its report.
    #[tokio::test(start_paused = true)]
    async fn a_bus_that_stops_answering_does_not_overrun_the_budget() {
        let (_d, root, loaded) = setup(
            "drain_deadline_s = 10",
            &[("ok", "order = 0"), ("stuck", "order = 10")],
        );
        let ops = FakeOps::default().unit("ok", true, Behaviour::Takes(SEC)).unit(
            "stuck",
            true,
            Behaviour::Unanswered,
        );
        // Connecting took 4 s of the budget already.
        let began = tokio::time::Instant::now() - 4 * SEC;
        let report = tokio::time::timeout(
            Duration::from_secs(3600),
            run(&ops, &root, &loaded, &Events::new("test"), began),
        )
        .await
        .expect("the drain ends on its own");
        let o = outcomes(&report);
        assert_eq!(o["stuck"], (Outcome::Failed, Some("E_SYSTEMD")));
        // 10 s deadline + 20 s to force and wait, counted from `began`:
        // inside the unit's TimeoutStopSec= (deadline + 30 s).
        assert_eq!(began.elapsed(), 30 * SEC);
        assert!(
            crate::state::drain_report::read(&root).is_ok(),
            "the report is written"
        );
        assert!(
            matches!(o["ok"].0, Outcome::GracefulOff | Outcome::ForcedOff),
            "at the deadline the later groups go at once, not behind the stuck one: {:?}",
            o["ok"]
        );
    }

    /// Issue 12, part 3: only a drain that a shutdown ran tells
    /// `autostart = "last-state"` what was running; each report says
    /// which it was and in which boot.
    #[tokio::test(start_paused = true)]
    async fn the_report_says_whether_a_shutdown_ran_it_in_which_run_and_how_it_found_each() {
        use crate::state::drain_report::Found;
        let (_d, root, loaded) = setup("", &[("a", ""), ("b", ""), ("c", "")]);
        for (state, shutdown) in [
            ("running", Some(false)),
            ("stopping", Some(true)),
            ("degraded", Some(false)),
        ] {
            let ops = FakeOps::default()
                .unit("a", true, Behaviour::Takes(SEC))
                .unit("b", false, Behaviour::Takes(SEC))
                .unit("c", false, Behaviour::Takes(SEC));
            ops.states
                .borrow_mut()
                .insert("berth@c.service".into(), crate::systemd::ActiveState::Failed);
            ops.manager_started_us.set(42);
            *ops.system_state.borrow_mut() = Some(state.into());
            let report = drain_now(&ops, &root, &loaded).await;
            assert_eq!(report.shutdown, shutdown, "{state}");
            let boot = crate::state::runs::boot_id().unwrap();
            assert_eq!(report.boot_id, boot);
            assert_eq!(report.run, format!("{boot}/42"));
            let found: BTreeMap<&str, Option<Found>> = report
                .workloads
                .iter()
                .map(|w| (w.workload.as_str(), w.found))
                .collect();
            assert_eq!(
                found,
                BTreeMap::from([
                    ("a", Some(Found::Running)),
                    ("b", Some(Found::Off)),
                    ("c", Some(Found::Failed))
                ])
            );
            let mut meant: Vec<&str> = report.meant_to_run().collect();
            meant.sort();
            assert_eq!(meant, ["a", "c"]);
            let (_, stored) = crate::state::drain_report::read(&root).unwrap();
            assert_eq!(stored.shutdown, shutdown);
        }
        assert_eq!(
            crate::state::runs::read(&root).current,
            format!("{}/42", crate::state::runs::boot_id().unwrap()),
            "the drain notes its run"
        );
    }

    /// Issue 31, item 8: a unit found deactivating counted as running, so
    /// last-state started again at the next boot what an admin was
    /// stopping when the shutdown began. Only a stop job older than the
    /// shutdown's (the drain unit's) is taken for such a stop.
    #[tokio::test(start_paused = true)]
    async fn a_stop_queued_before_the_shutdown_counts_as_off_for_last_state() {
        use crate::state::drain_report::Found;
        use crate::systemd::{ActiveState, JobType};
        let (_d, root, loaded) = setup(
            "",
            &[("admin", ""), ("shutdown", ""), ("exiting", ""), ("restart", "")],
        );
        let ops = FakeOps::default();
        let mut ops = ops;
        for w in ["admin", "shutdown", "exiting", "restart"] {
            ops = ops.unit(w, true, Behaviour::Takes(SEC));
            ops.states
                .borrow_mut()
                .insert(format!("berth@{w}.service"), ActiveState::Deactivating);
        }
        *ops.system_state.borrow_mut() = Some("stopping".into());
        ops.pending.borrow_mut().extend([
            ("berth@admin.service".to_string(), (10, JobType::Stop)),
            (crate::names::DRAIN.to_string(), (20, JobType::Stop)),
            ("berth@shutdown.service".to_string(), (21, JobType::Stop)),
            ("berth@restart.service".to_string(), (11, JobType::Restart)),
        ]);
        let report = drain_now(&ops, &root, &loaded).await;
        let found: BTreeMap<&str, Option<Found>> = report
            .workloads
            .iter()
            .map(|w| (w.workload.as_str(), w.found))
            .collect();
        assert_eq!(
            found,
            BTreeMap::from([
                ("admin", Some(Found::Stopping)),
                ("exiting", Some(Found::Running)),
                ("restart", Some(Found::Running)),
                ("shutdown", Some(Found::Running)),
            ])
        );
        let mut meant: Vec<&str> = report.meant_to_run().collect();
        meant.sort();
        assert_eq!(meant, ["exiting", "restart", "shutdown"]);
    }

    /// A workload waiting for systemd's restart (RestartSec= running) is
    /// stopped like a running one, whatever ActiveState shows it in
    /// (activating on 252 and 257, failed or inactive elsewhere): its stop
    /// job cancels the restart, which would otherwise start it behind a
    /// drain by hand.
    #[tokio::test(start_paused = true)]
    async fn a_workload_waiting_for_its_restart_gets_a_stop() {
        use crate::state::drain_report::Found;
        use crate::systemd::ActiveState;
        let (_d, root, loaded) = setup(
            "",
            &[
                ("old", "restart = \"on-failure\""),
                ("new", "restart = \"always\""),
                ("crashed", ""),
            ],
        );
        let ops = FakeOps::default()
            .unit("old", false, Behaviour::Takes(Duration::ZERO))
            .unit("new", false, Behaviour::Takes(Duration::ZERO))
            .unit("crashed", false, Behaviour::Takes(Duration::ZERO));
        for (unit, state, sub) in [
            ("old", ActiveState::Failed, "auto-restart"),
            ("new", ActiveState::Activating, "auto-restart-queued"),
            ("crashed", ActiveState::Failed, "failed"),
        ] {
            let unit = format!("berth@{unit}.service");
            ops.states.borrow_mut().insert(unit.clone(), state);
            ops.sub_states.borrow_mut().insert(unit, sub.into());
        }
        let report = drain_now(&ops, &root, &loaded).await;
        let got: BTreeMap<&str, (Outcome, Option<Found>)> = report
            .workloads
            .iter()
            .map(|w| (w.workload.as_str(), (w.outcome, w.found)))
            .collect();
        assert_eq!(
            got,
            BTreeMap::from([
                ("crashed", (Outcome::AlreadyOff, Some(Found::Failed))),
                ("new", (Outcome::GracefulOff, Some(Found::Restarting))),
                ("old", (Outcome::GracefulOff, Some(Found::Restarting))),
            ])
        );
        let mut stopped: Vec<String> = ops
            .spans
            .borrow()
            .iter()
            .filter(|s| s.1 == "stop")
            .map(|s| s.0.clone())
            .collect();
        stopped.sort();
        assert_eq!(stopped, ["berth@new.service", "berth@old.service"]);
    }

    /// Review of issue 11: systemd lists no alias, so an existing unit
    /// named by one looked AlreadyOff and was never stopped. It is asked
    /// for by its name.
    #[tokio::test(start_paused = true)]
    async fn an_existing_unit_systemd_does_not_list_is_asked_for_and_drained() {
        let (_d, root, loaded) = setup("", &[("db", "unit = \"mysql.service\"\nstop_delay_s = 3")]);
        let ops = FakeOps::default();
        ops.states
            .borrow_mut()
            .insert("mysql.service".into(), crate::systemd::ActiveState::Active);
        let report = drain_now(&ops, &root, &loaded).await;
        assert_eq!(outcomes(&report)["db"], (Outcome::GracefulOff, None));
        assert_eq!(report.workloads[0].unit, "mysql.service");
    }

    /// A libvirt guest that ignores ACPI is forced off by its watcher
    /// (virsh destroy), never by SIGKILL to its unit, which would end the
    /// watcher and leave QEMU running in libvirt's machine scope.
    #[tokio::test(start_paused = true)]
    async fn a_guest_ignoring_acpi_is_destroyed_by_its_watcher_at_its_stop_delay() {
        let (_d, root, loaded) = setup(
            "",
            &[
                ("vm", "libvirt = \"vm\"\nstop_delay_s = 3"),
                ("zap", "libvirt = \"zap\"\nstop_action = \"power_off\""),
            ],
        );
        let ops = FakeOps::default().unit("vm", true, Behaviour::IgnoresTerm).unit(
            "zap",
            true,
            Behaviour::IgnoresTerm,
        );
        let report = drain_now(&ops, &root, &loaded).await;
        let o = outcomes(&report);
        assert_eq!(o["vm"], (Outcome::ForcedOff, Some("E_DRAIN_FORCED_OFF")));
        assert_eq!(o["zap"].0, Outcome::PoweredOff);
        assert!(
            ops.killed.borrow().is_empty(),
            "no SIGKILL: {:?}",
            ops.killed.borrow()
        );
        let mut asked = ops.destroy_asked.borrow().clone();
        asked.sort();
        assert_eq!(asked, ["berth@vm.service", "berth@zap.service"]);
    }

    /// stop_action = "save": what the watcher left says how the stop
    /// ended: saved, or shut down after a failed save; taken once.
    #[tokio::test(start_paused = true)]
    async fn a_saved_guest_is_saved_and_a_failed_save_says_so() {
        let (_d, root, loaded) = setup(
            "",
            &[
                ("vm", "libvirt = \"vm\"\nstop_action = \"save\""),
                ("dev", "libvirt = \"dev\"\nstop_action = \"save\""),
            ],
        );
        let ops = FakeOps::default()
            .unit("vm", true, Behaviour::Takes(Duration::from_secs(1)))
            .unit("dev", true, Behaviour::Takes(Duration::from_secs(1)));
        // What each watcher left as it ended.
        let guests = root.runtime_dir().join("guests");
        std::fs::create_dir_all(&guests).unwrap();
        std::fs::write(guests.join("vm"), "saved\n").unwrap();
        std::fs::write(guests.join("dev"), "save-failed\n").unwrap();
        let report = drain_now(&ops, &root, &loaded).await;
        let o = outcomes(&report);
        assert_eq!(o["vm"], (Outcome::Saved, None));
        assert_eq!(o["dev"], (Outcome::GracefulOff, Some("E_DRAIN_SAVE_FAILED")));
        assert!(!guests.join("vm").exists(), "taken by the drain");
    }

    /// Seen in CI on systemd 252 under load: KillUnit answered EIO (the
    /// cgroup was going away) although the main process got SIGKILL and
    /// the unit went down; the drain reported Failed.
    #[tokio::test(start_paused = true)]
    async fn a_kill_that_reports_an_error_but_worked_is_forced_off() {
        let (_d, root, loaded) = setup("", &[("hard", "stop_delay_s = 3")]);
        let ops = FakeOps::default().unit("hard", true, Behaviour::IgnoresTerm);
        ops.kill_reports_eio.set(true);
        let report = drain_now(&ops, &root, &loaded).await;
        assert_eq!(
            outcomes(&report)["hard"],
            (Outcome::ForcedOff, Some("E_DRAIN_FORCED_OFF"))
        );
        assert!(
            report.workloads[0]
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("Input/output error")),
            "{report:?}"
        );
    }

    /// `systemctl start` racing a drain by hand replaces the drain's stop
    /// job (canceled, the unit still up): the stop is queued again, a few
    /// times within its budget, and the outcome follows the last one.
    #[tokio::test(start_paused = true)]
    async fn a_stop_job_a_racing_start_canceled_is_queued_again() {
        let (_d, root, loaded) = setup("", &[("db", "stop_delay_s = 3")]);
        let ops = FakeOps::default().unit("db", true, Behaviour::Takes(Duration::from_millis(500)));
        ops.stop_cancellations
            .borrow_mut()
            .insert("berth@db.service".into(), 1);
        let report = drain_now(&ops, &root, &loaded).await;
        assert_eq!(outcomes(&report)["db"], (Outcome::GracefulOff, None));
        let detail = report.workloads[0].detail.clone().unwrap_or_default();
        assert!(
            detail.contains("stop job canceled") && detail.contains("stopped again"),
            "{detail}"
        );
        // A start that keeps winning: Failed after the last try, saying so.
        let (_d, root, loaded) = setup("", &[("db", "stop_delay_s = 3")]);
        let ops = FakeOps::default().unit("db", true, Behaviour::Takes(Duration::from_millis(500)));
        ops.stop_cancellations
            .borrow_mut()
            .insert("berth@db.service".into(), 10);
        let report = drain_now(&ops, &root, &loaded).await;
        assert_eq!(outcomes(&report)["db"], (Outcome::Failed, Some("E_SYSTEMD")));
        assert_eq!(
            ops.stop_cancellations.borrow()["berth@db.service"],
            10 - 4,
            "one stop and three more"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_workload_that_ignores_sigterm_is_forced_at_its_stop_delay() {
        let (_d, root, loaded) = setup(
            "",
            &[
                ("hard", "stop_delay_s = 3"),
                ("soft", "stop_delay_s = 3\nforce_off_on_timeout = false"),
            ],
        );
        let ops = FakeOps::default()
            .unit("hard", true, Behaviour::IgnoresTerm)
            .unit("soft", true, Behaviour::IgnoresTerm);
        let report = drain_now(&ops, &root, &loaded).await;
        let o = outcomes(&report);
        assert_eq!(o["hard"], (Outcome::ForcedOff, Some("E_DRAIN_FORCED_OFF")));
        assert_eq!(o["soft"], (Outcome::TimedOut, Some("E_DRAIN_GUEST_TIMEOUT")));
        assert_eq!(*ops.killed.borrow(), ["berth@hard.service"]);
        assert_eq!(
            *ops.cancelled.borrow(),
            ["berth@soft.service"],
            "the abandoned stop job is cancelled"
        );
        let hard = report.workloads.iter().find(|w| w.workload == "hard").unwrap();
        assert_eq!(hard.elapsed_ms, 3000);
        let rec = crate::state::records::load(&root, "hard").unwrap().unwrap();
        assert_eq!(
            (rec.state, rec.last_transition_reason),
            (RecordState::Stopped, TransitionReason::Drain)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn power_off_already_off_and_orphans() {
        let (_d, root, loaded) = setup("", &[("zap", "stop_action = \"power_off\""), ("idle", "")]);
        let ops = FakeOps::default()
            .unit("zap", true, Behaviour::IgnoresTerm)
            .unit("idle", false, Behaviour::Takes(SEC))
            .unit("ghost", true, Behaviour::Takes(SEC));
        let report = drain_now(&ops, &root, &loaded).await;
        let o = outcomes(&report);
        assert_eq!(o["zap"].0, Outcome::PoweredOff);
        assert_eq!(o["idle"].0, Outcome::AlreadyOff);
        assert_eq!(
            o["ghost"].0,
            Outcome::GracefulOff,
            "a running unit without config is drained"
        );
        assert_eq!(
            report.workloads.last().unwrap().workload,
            "ghost",
            "orphans come last"
        );
    }

    /// What a `Progress` wrote, kept after the drain consumed it.
    #[derive(Clone, Default)]
    struct Sink(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 11, part 4: the console showed only systemd's "A stop job is
    /// running" during a long drain.
    #[tokio::test(start_paused = true)]
    async fn the_console_hears_of_each_stop_and_of_the_wait() {
        let (_d, root, loaded) = setup(
            "",
            &[
                ("slow", "order = 0"),
                ("quick", "order = 10"),
                ("idle", "order = 10"),
            ],
        );
        let ops = FakeOps::default()
            .unit("slow", true, Behaviour::Takes(12 * SEC))
            .unit("quick", true, Behaviour::Takes(SEC))
            .unit("idle", false, Behaviour::Takes(SEC));
        let sink = Sink::default();
        let out = sink.clone();
        let (tell, mut heard) = tokio::sync::mpsc::unbounded_channel();
        execute::run_showing(
            &ops,
            &root,
            &loaded,
            &Events::new("test"),
            tokio::time::Instant::now(),
            move |total| progress::Progress::to(out, total),
            Some(tell),
        )
        .await;
        // Each result is told as it comes (the cluster releases owner
        // keys by them), not at the end.
        let mut told = Vec::new();
        while let Ok(r) = heard.try_recv() {
            told.push((r.workload, r.outcome));
        }
        assert_eq!(
            told,
            [
                ("idle".to_string(), Outcome::AlreadyOff),
                ("quick".to_string(), Outcome::GracefulOff),
                ("slow".to_string(), Outcome::GracefulOff)
            ]
        );
        let text = String::from_utf8(sink.0.borrow().clone()).unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "berth: berth@quick.service GracefulOff after 1.0 s (1 of 2 done)",
                "berth: waiting for 1 workload, 175 s left before the deadline (stopping: berth@slow.service)",
                "berth: waiting for 1 workload, 170 s left before the deadline (stopping: berth@slow.service)",
                "berth: berth@slow.service GracefulOff after 12.0 s (2 of 2 done)",
            ],
            "nothing said of the workload that was not running"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_forces_everything_still_pending() {
        let (_d, root, loaded) = setup(
            "drain_parallelism = 1\ndrain_deadline_s = 5",
            &[
                ("s1", "stop_delay_s = 10"),
                ("s2", "stop_delay_s = 10"),
                ("s3", "stop_delay_s = 10"),
            ],
        );
        let ops = ["s1", "s2", "s3"]
            .iter()
            .fold(FakeOps::default(), |f, n| f.unit(n, true, Behaviour::IgnoresTerm));
        let began = tokio::time::Instant::now();
        let report = drain_now(&ops, &root, &loaded).await;
        assert!(
            outcomes(&report)
                .values()
                .all(|o| *o == (Outcome::ForcedOff, Some("E_DRAIN_DEADLINE"))),
            "{report:?}"
        );
        assert!(report.deadline_reached);
        assert_eq!(
            tokio::time::Instant::now() - began,
            5 * SEC,
            "nothing waits past the deadline"
        );
    }
}
