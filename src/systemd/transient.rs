//! Transient timers: a one-shot timer and the oneshot service it starts,
//! made over D-Bus (what `systemd-run --on-active=` does), for the
//! cluster's fence, which must fire when no berth process is left.

use std::time::Duration;

use zbus::Variant as Value;

use super::{Ops, Systemd, SystemdError};

impl Systemd {
    /// Starts `NAME.timer`, elapsing once `after` from now with an
    /// accuracy of 1 µs (the default of one minute would fire long after
    /// the moment it stands for), to start `NAME.service` running `argv`.
    /// A timer of that name already there is replaced.
    ///
    /// Two triggers, whichever comes first: `OnActiveSec=` counts on
    /// CLOCK_MONOTONIC (systemd 252 and 257 alike, unless WakeSystem=),
    /// which a suspend pauses, and is deaf to the wall clock being set;
    /// `OnCalendar=` at the same moment (to the microsecond: a whole
    /// second rounded down fired before a daemon back in time disarmed
    /// it) counts across a suspend: systemd fires a calendar event that
    /// passed while the host slept as it resumes.
    pub async fn arm_timer(
        &self,
        name: &str,
        description: &str,
        after: Duration,
        argv: &[String],
    ) -> Result<(), SystemdError> {
        let timer = format!("{name}.timer");
        let service = format!("{name}.service");
        // A transient unit of that name, active or not, must go first
        // (its stop job done, or the name is still taken).
        if let Ok(job) = self.stop(&timer).await {
            let _ = self.wait(&job, Some(Duration::from_secs(5))).await;
        }
        let usec = after.as_micros().max(1) as u64;
        // The base is named as in a timer file; the value is in µs.
        let on_active: Vec<(&str, u64)> = vec![("OnActiveSec", usec)];
        let at = crate::time::calendar_event(std::time::SystemTime::now() + after);
        let on_calendar: Vec<(&str, &str)> = vec![("OnCalendar", at.as_str())];
        let timer_props = [
            ("Description", Value::from(description)),
            ("TimersMonotonic", Value::from(on_active)),
            ("TimersCalendar", Value::from(on_calendar)),
            ("AccuracyUSec", Value::from(1u64)),
            ("RemainAfterElapse", Value::from(false)),
            // Gone once inactive, failed or not: the next arming finds
            // the names free.
            ("CollectMode", Value::from("inactive-or-failed")),
        ];
        let exec: Vec<(&str, Vec<&str>, bool)> =
            vec![(argv[0].as_str(), argv.iter().map(String::as_str).collect(), false)];
        let service_props = [
            ("Description", Value::from(description)),
            ("Type", Value::from("oneshot")),
            ("ExecStart", Value::from(exec)),
            ("CollectMode", Value::from("inactive-or-failed")),
        ];
        let aux: [(&str, &[(&str, Value<'_>)]); 1] = [(service.as_str(), &service_props)];
        self.bounded(
            "StartTransientUnit",
            &timer,
            self.manager
                .start_transient_unit(&timer, "replace", &timer_props, &aux),
        )
        .await?;
        Ok(())
    }
}
