//! The holder: the thread of `berth fence-watch` that keeps the watchdog
//! device. It shares nothing with the daemon but the deadline file, and
//! nothing with the backstop's stops but the process: a stop that blocks
//! does not stop the petting, and a holder that stops petting (hung,
//! frozen, killed) lets the device reset the host.
//!
//! [`hold`] runs against a [`World`]: the real one reads CLOCK_BOOTTIME,
//! the deadline file and systemd; the tests' is simulated.

use std::time::Duration;

use super::device::Device;
use super::{Starve, Unit, may_close, verdict};

/// Each HA workload's unit, or why systemd did not tell.
pub type Looked = Result<Vec<(String, Unit)>, String>;

/// The holder's window on the host.
pub trait World {
    /// CLOCK_BOOTTIME.
    fn now(&self) -> Duration;
    /// How long the host has been suspended in this boot
    /// (CLOCK_BOOTTIME − CLOCK_MONOTONIC): it grows only across a
    /// suspend.
    fn asleep(&self) -> Duration;
    /// The fence deadline the daemon last recorded.
    fn deadline(&self) -> Option<Duration>;
    /// Each HA workload's unit, asked of systemd within a bound.
    fn look(&mut self) -> Looked;
    fn sleep(&mut self, d: Duration);
    /// The holder was asked to stop (SIGTERM).
    fn stop_asked(&self) -> bool;
    /// Told after each judgement whether a pet was allowed. The kernel
    /// pets the device when it is closed without the magic character (an
    /// exit, a crash) and when its timeout is set: only while a pet is
    /// allowed may the process end or another take the device over.
    fn judged(&mut self, pet_allowed: bool);
    /// The lease's fence margin as berth.toml says now, when it can be
    /// read: the shorter of it and the one the holder began with counts.
    fn margin(&mut self) -> Option<Duration>;
    /// Removes the armed file: `owner-check` refuses every start from
    /// then on.
    fn disarm(&mut self);
    fn info(&mut self, text: &str);
    fn warn(&mut self, text: &str);
}

/// How [`hold`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Stopped with every HA workload down: closed without a reset.
    Closed,
    /// The device failed: it is left counting.
    Failed(String),
}

/// The least growth of the time asleep that counts as a suspend: the two
/// clocks are read a few µs apart, and no suspend is this short.
pub const RESUMED: Duration = Duration::from_millis(50);

/// How often the device is petted: four times per timeout, so that a
/// slow look or a late wake-up does not cost the host.
pub fn pet_every(timeout: Duration) -> Duration {
    (timeout / 4).max(Duration::from_millis(250))
}

/// Judges, pets, and on a stop request closes once nothing runs. Never
/// returns while HA workloads may run here: a stop request then waits
/// for them (the unit's stop timeout ends that wait with a reset).
pub fn hold<D: Device, W: World>(mut device: D, margin: Duration, world: &mut W) -> End {
    let every = pet_every(device.timeout());
    let timeout_s = device.timeout().as_secs();
    let mut starving: Option<Starve> = None;
    let mut disarmed = false;
    let mut said_held = false;
    let mut asleep = world.asleep();
    loop {
        let began = world.now();
        // A suspend to RAM may have left the hardware disabled (its
        // driver has no resume hook), and a pet would not start it again.
        let slept = world.asleep().saturating_sub(asleep);
        asleep += slept;
        if slept >= RESUMED {
            if let Err(e) = device.rearm() {
                return End::Failed(format!("re-arming it after a suspend failed: {e}"));
            }
            world.info(&format!(
                "cluster: watchdog: the host slept {} ms: re-armed (timeout {timeout_s} s), as a suspend may have disabled it",
                slept.as_millis()
            ));
        }
        let margin = world.margin().map_or(margin, |m| m.min(margin));
        if world.stop_asked() {
            if !disarmed {
                world.disarm();
                disarmed = true;
            }
            // Looked at after the disarm: a start that passed
            // owner-check before it is activating, so up, here.
            match world.look() {
                Ok(units) => {
                    let refs: Vec<(&str, Unit)> = units.iter().map(|(n, u)| (n.as_str(), *u)).collect();
                    match may_close(&refs) {
                        Ok(()) => {
                            return match device.close_disarmed() {
                                Ok(()) => {
                                    world.info(
                                        "cluster: watchdog: no HA workload runs here: closed without a reset",
                                    );
                                    End::Closed
                                }
                                Err(e) => End::Failed(format!("the magic close failed: {e}")),
                            };
                        }
                        Err(why) => {
                            if !said_held {
                                said_held = true;
                                world.warn(&format!(
                                    "cluster: watchdog: asked to stop, but {why}: held until they stop; killed before that, the host resets within {timeout_s} s"
                                ));
                            }
                        }
                    }
                }
                Err(why) => {
                    if !said_held {
                        said_held = true;
                        world.warn(&format!(
                            "cluster: watchdog: asked to stop, but the HA workloads cannot be seen ({why}): held"
                        ));
                    }
                }
            }
        }
        let now = world.now();
        let deadline = world.deadline();
        let judged = if deadline.is_none_or(|d| now < d) {
            Ok(())
        } else {
            match world.look() {
                Ok(units) => {
                    let refs: Vec<(&str, Unit)> = units.iter().map(|(n, u)| (n.as_str(), *u)).collect();
                    verdict(deadline, margin, world.now(), &refs)
                }
                Err(why) => Err(Starve::Unobserved { why }),
            }
        };
        world.judged(judged.is_ok());
        match judged {
            Ok(()) => {
                if let Err(e) = device.pet() {
                    return End::Failed(format!("petting it failed: {e}"));
                }
                if starving.take().is_some() {
                    world.info(
                        "cluster: watchdog: nothing here can outlive the lease any more: petting it again",
                    );
                }
            }
            Err(why) => {
                // Said when the reason changes, not every look.
                if starving.as_ref() != Some(&why) {
                    world.warn(&format!(
                        "cluster: watchdog: not petting it: {why}; the host resets within {timeout_s} s of the last pet unless that changes"
                    ));
                }
                starving = Some(why);
            }
        }
        // One look and pet per period, however long the look took.
        world.sleep(every.saturating_sub(world.now().saturating_sub(began)));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::super::device::{Done, Fake};
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    /// A simulated host: a clock moved only by sleeps, a deadline, and a
    /// script of what each HA unit is at a time.
    struct Sim {
        clock: Arc<Mutex<Duration>>,
        deadline: Option<Duration>,
        /// `units(now)`: the units, or why they cannot be seen.
        units: Box<dyn Fn(Duration) -> Looked>,
        stop_at: Option<Duration>,
        disarmed_at: Option<Duration>,
        /// Each judgement: whether a pet (or a close) was allowed.
        judged: Vec<bool>,
        /// The margin berth.toml says now.
        margin_now: Option<Duration>,
        said: Vec<String>,
        /// Ends the test: a holder that never returns runs until then.
        until: Duration,
        /// `asleep(now)`: the time the host spent suspended by then.
        asleep: Box<dyn Fn(Duration) -> Duration>,
    }

    impl World for Sim {
        fn now(&self) -> Duration {
            *self.clock.lock().unwrap()
        }
        fn asleep(&self) -> Duration {
            (self.asleep)(self.now())
        }
        fn deadline(&self) -> Option<Duration> {
            self.deadline
        }
        fn look(&mut self) -> Looked {
            (self.units)(self.now())
        }
        fn sleep(&mut self, d: Duration) {
            let mut c = self.clock.lock().unwrap();
            *c += d;
            assert!(*c < self.until, "still held at {:?}", *c);
        }
        fn stop_asked(&self) -> bool {
            self.stop_at.is_some_and(|t| self.now() >= t)
        }
        fn disarm(&mut self) {
            self.disarmed_at = Some(self.now());
        }
        fn judged(&mut self, pet_allowed: bool) {
            self.judged.push(pet_allowed);
        }
        fn margin(&mut self) -> Option<Duration> {
            self.margin_now
        }
        fn info(&mut self, text: &str) {
            self.said.push(text.to_string());
        }
        fn warn(&mut self, text: &str) {
            self.said.push(text.to_string());
        }
    }

    fn sim(
        deadline: Option<Duration>,
        units: impl Fn(Duration) -> Result<Vec<(String, Unit)>, String> + 'static,
    ) -> Sim {
        Sim {
            clock: Arc::new(Mutex::new(Duration::ZERO)),
            deadline,
            units: Box::new(units),
            stop_at: None,
            disarmed_at: None,
            judged: Vec::new(),
            margin_now: None,
            said: Vec::new(),
            until: 600 * S,
            asleep: Box::new(|_| Duration::ZERO),
        }
    }

    fn fake(sim: &Sim) -> (Fake, Arc<Mutex<Vec<Done>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let clock = sim.clock.clone();
        (
            Fake {
                timeout: 10 * S,
                log: log.clone(),
                clock: Box::new(move || *clock.lock().unwrap()),
            },
            log,
        )
    }

    fn last_pet(log: &Mutex<Vec<Done>>) -> Option<Duration> {
        log.lock().unwrap().iter().rev().find_map(|d| match d {
            Done::Pet(t) => Some(*t),
            _ => None,
        })
    }

    /// Runs the holder until the simulated clock reaches `sim.until`
    /// (the Sim's sleep panics there) or it returns.
    fn run(mut sim: Sim, device: Fake) -> (Option<End>, Sim) {
        let margin = 4 * S;
        let end =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hold(device, margin, &mut sim))).ok();
        (end, sim)
    }

    fn db(u: Unit) -> Looked {
        Ok(vec![("db".to_string(), u)])
    }

    #[test]
    fn pets_four_times_a_timeout() {
        assert_eq!(pet_every(10 * S), 2500 * MS);
        assert_eq!(pet_every(S), 250 * MS);
    }

    #[test]
    fn a_live_lease_is_petted_without_asking_systemd() {
        let mut s = sim(Some(1000 * S), |_| {
            panic!("systemd asked while the lease is live")
        });
        s.until = 60 * S;
        let (d, log) = fake(&s);
        let (end, _) = run(s, d);
        assert_eq!(end, None, "held to the end of the test");
        let pets = log.lock().unwrap().len();
        assert_eq!(pets, 24, "one pet every 2.5 s over 60 s");
    }

    /// The daemon's lease deadline passes at 20 s; db keeps running: the
    /// last pet comes no later than the lease's expiry (deadline + margin).
    #[test]
    fn a_workload_that_outlives_the_lease_starves_the_device_before_its_expiry() {
        let mut s = sim(Some(20 * S), |_| db(Unit::Up));
        s.until = 60 * S;
        let (d, log) = fake(&s);
        let (end, s) = run(s, d);
        assert_eq!(end, None);
        let last = last_pet(&log).expect("petted while the lease lived");
        assert!(last < 20 * S + super::super::FENCE_LATE, "last pet at {last:?}");
        // No close (a pet by the kernel) allowed once it starves.
        assert_eq!(s.judged.first(), Some(&true));
        assert_eq!(s.judged.last(), Some(&false));
        // Each reason said once, when it began.
        assert_eq!(s.said.len(), 2, "{:?}", s.said);
        assert!(s.said[0].contains("nothing stops db"), "{:?}", s.said);
        assert!(s.said[1].contains("the lease has expired"), "{:?}", s.said);
    }

    /// berth.toml now gives a shorter margin (a lower TTL) than the one
    /// the holder began with: the shorter counts, so the expiry comes
    /// sooner and the last pet with db up with it.
    #[test]
    fn a_shorter_margin_in_berth_toml_counts() {
        let mut s = sim(Some(20 * S), |now| {
            db(if now < 20 * S {
                Unit::Up
            } else {
                Unit::Stopping {
                    for_: now - 20 * S,
                    bound: 35 * S,
                }
            })
        });
        s.until = 60 * S;
        s.margin_now = Some(S);
        let (d, log) = fake(&s);
        let (_, _) = run(s, d);
        // Expiry at 21 s, not 24 s (the margin of 4 s it began with).
        let last = last_pet(&log).unwrap();
        assert!(last < 21 * S, "last pet at {last:?}");
    }

    /// A look that takes long does not stretch the period between pets.
    #[test]
    fn a_slow_look_does_not_stretch_the_period() {
        struct Slow(Sim);
        impl World for Slow {
            fn now(&self) -> Duration {
                self.0.now()
            }
            fn asleep(&self) -> Duration {
                self.0.asleep()
            }
            fn deadline(&self) -> Option<Duration> {
                self.0.deadline()
            }
            fn look(&mut self) -> Looked {
                // Each look takes 2 s of the 2.5 s period.
                *self.0.clock.lock().unwrap() += 2 * S;
                self.0.look()
            }
            fn sleep(&mut self, d: Duration) {
                self.0.sleep(d)
            }
            fn stop_asked(&self) -> bool {
                self.0.stop_asked()
            }
            fn disarm(&mut self) {}
            fn judged(&mut self, _: bool) {}
            fn margin(&mut self) -> Option<Duration> {
                None
            }
            fn info(&mut self, _: &str) {}
            fn warn(&mut self, _: &str) {}
        }
        let mut s = sim(Some(Duration::ZERO), |now| {
            db(Unit::Stopping {
                for_: now,
                bound: 1000 * S,
            })
        });
        s.until = 30 * S;
        // A margin of 1000 s: db stopping, the lease never expiring.
        let (d, log) = fake(&s);
        let mut slow = Slow(s);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hold(d, 1000 * S, &mut slow)));
        let pets: Vec<Duration> = log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|d| match d {
                Done::Pet(t) => Some(*t),
                _ => None,
            })
            .collect();
        for w in pets.windows(2) {
            assert!(w[1] - w[0] <= 2500 * MS, "{pets:?}");
        }
        assert!(pets.len() >= 10, "{pets:?}");
    }

    /// The fence stops db within its bound: petted throughout.
    #[test]
    fn a_stop_within_its_bound_keeps_the_petting() {
        let mut s = sim(Some(20 * S), |now| {
            if now < 20 * S {
                db(Unit::Up)
            } else if now < 22 * S {
                db(Unit::Stopping {
                    for_: now - 20 * S,
                    bound: 35 * S,
                })
            } else {
                db(Unit::Down)
            }
        });
        s.until = 60 * S;
        let (d, log) = fake(&s);
        let (_, s) = run(s, d);
        assert!(last_pet(&log).unwrap() > 55 * S);
        assert!(s.said.is_empty(), "{:?}", s.said);
    }

    /// systemd does not answer once the deadline passed: not petted.
    #[test]
    fn units_nobody_can_see_starve_the_device() {
        let mut s = sim(Some(20 * S), |_| Err("LoadUnit timed out".into()));
        s.until = 60 * S;
        let (d, log) = fake(&s);
        let (_, s) = run(s, d);
        assert!(last_pet(&log).unwrap() < 20 * S);
        assert!(s.said[0].contains("LoadUnit timed out"), "{:?}", s.said);
    }

    /// A stop asked with nothing running: disarmed, then closed.
    #[test]
    fn a_stop_with_nothing_running_closes_without_a_reset() {
        let mut s = sim(Some(1000 * S), |_| db(Unit::Down));
        s.stop_at = Some(10 * S);
        let (d, log) = fake(&s);
        let (end, s) = run(s, d);
        assert_eq!(end, Some(End::Closed));
        assert_eq!(s.disarmed_at, Some(10 * S));
        assert_eq!(log.lock().unwrap().last(), Some(&Done::ClosedDisarmed));
    }

    /// A stop asked while db runs: held (and petted while the lease
    /// lives) until db is down, then closed.
    #[test]
    fn a_stop_while_a_workload_runs_waits_for_it() {
        let mut s = sim(Some(1000 * S), |now| {
            db(if now < 30 * S { Unit::Up } else { Unit::Down })
        });
        s.stop_at = Some(10 * S);
        let (d, log) = fake(&s);
        let (end, s) = run(s, d);
        assert_eq!(end, Some(End::Closed));
        assert!(last_pet(&log).unwrap() >= 27 * S, "petted while held");
        assert!(s.now() >= 30 * S);
        assert_eq!(
            s.said.iter().filter(|t| t.contains("held until")).count(),
            1,
            "{:?}",
            s.said
        );
    }

    /// A suspend to RAM between two looks (30 s asleep, seen at the look
    /// at 20 s): re-armed once, before that look's pet, and petted on.
    #[test]
    fn a_resume_rearms_the_device_before_petting_it() {
        let mut s = sim(Some(1000 * S), |_| db(Unit::Up));
        s.until = 40 * S;
        s.asleep = Box::new(|now| if now >= 20 * S { 30 * S } else { Duration::ZERO });
        let (d, log) = fake(&s);
        let (_, s) = run(s, d);
        let log = log.lock().unwrap();
        let rearms: Vec<usize> = (0..log.len())
            .filter(|i| matches!(log[*i], Done::Rearmed(_)))
            .collect();
        assert_eq!(rearms.len(), 1, "{log:?}");
        assert_eq!(log[rearms[0]], Done::Rearmed(20 * S));
        assert_eq!(log[rearms[0] + 1], Done::Pet(20 * S), "petted right after");
        assert!(
            s.said.iter().any(|t| t.contains("slept 30000 ms: re-armed")),
            "{:?}",
            s.said
        );
    }

    /// The two clocks read apart by less than a suspend could take: no
    /// re-arm, however often.
    #[test]
    fn clock_jitter_is_no_resume() {
        let mut s = sim(Some(1000 * S), |_| db(Unit::Up));
        s.until = 60 * S;
        // 10 ms more at every look (2.5 s apart).
        s.asleep = Box::new(|now| now / 250);
        let (d, log) = fake(&s);
        let _ = run(s, d);
        assert!(
            !log.lock().unwrap().iter().any(|d| matches!(d, Done::Rearmed(_))),
            "re-armed on jitter"
        );
    }

    /// A resume while starving re-arms too (starting the count again: the
    /// reset comes one timeout after the resume, as from a device that
    /// slept with the host), and the starving goes on: no pet after.
    #[test]
    fn a_resume_while_starving_rearms_and_stays_unpetted() {
        let mut s = sim(Some(20 * S), |_| db(Unit::Up));
        s.until = 60 * S;
        s.asleep = Box::new(|now| if now >= 40 * S { 15 * S } else { Duration::ZERO });
        let (d, log) = fake(&s);
        let _ = run(s, d);
        let last = last_pet(&log).unwrap();
        let log = log.lock().unwrap();
        assert!(
            log.iter().any(|d| matches!(d, Done::Rearmed(t) if *t >= 40 * S)),
            "{log:?}"
        );
        assert!(last < 24 * S, "no pet once the lease expired: {log:?}");
    }
}
