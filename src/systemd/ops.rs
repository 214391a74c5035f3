//! [`Ops`]: everything berth asks of the service manager, as one trait.
//! [`Systemd`] implements it over the proxies; `fake::FakeOps` implements
//! it on tokio's paused clock for unit tests of the helpers' scheduling.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use zbus::proxy::CacheProperties;

use super::connection::Systemd;
use super::error::SystemdError;
use super::jobs::Registered;
use super::proxies::{JobProxy, SERVICE_INTERFACE, ServiceProxy, UNIT_INTERFACE, UnitProxy};
use super::types::{
    ActiveState, Change, ExitCode, Job, JobResult, JobType, LoadState, ServiceResult, UnitDetails,
    UnitFileState, UnitStatus, UnitTopology, WatchedPaths,
};
use crate::names::WORKLOAD_PATTERN;

/// What berth needs from the manager.
#[allow(async_fn_in_trait)]
pub trait Ops {
    /// Every loaded `berth@*.service`, and those of `existing` that are
    /// loaded (the `unit =` workloads' units).
    async fn list_workloads(&self, existing: &[String]) -> Result<Vec<UnitStatus>, SystemdError>;
    async fn active_state(&self, unit: &str) -> Result<ActiveState, SystemdError>;
    /// The unit's state and, for a service, its main process and last exit.
    async fn details(&self, unit: &str) -> Result<UnitDetails, SystemdError>;
    /// Dependencies and protections, for `berth check --live`.
    async fn topology(&self, unit: &str) -> Result<UnitTopology, SystemdError>;
    /// The JobType of a job, if it still exists.
    async fn job_type(&self, job: &str) -> Option<JobType>;
    async fn unit_file_state(&self, unit: &str) -> Result<UnitFileState, SystemdError>;

    async fn start(&self, unit: &str) -> Result<Job, SystemdError>;
    async fn stop(&self, unit: &str) -> Result<Job, SystemdError>;
    /// SIGKILL to every process of the unit.
    async fn kill(&self, unit: &str) -> Result<(), SystemdError>;
    /// SIGHUP to the unit's main process (`systemctl kill -s HUP
    /// --kill-whom=main`).
    async fn hang_up(&self, unit: &str) -> Result<(), SystemdError>;
    /// SIGUSR2 to the unit's main process: a libvirt guest's watcher
    /// destroys its guest at once (the drain's force-off for a guest).
    async fn ask_to_destroy(&self, unit: &str) -> Result<(), SystemdError>;
    async fn cancel(&self, unit: &str, job: &Job) -> Result<(), SystemdError>;
    /// Waits for a job to finish, up to `limit`; `None` on timeout.
    async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult>;

    /// `systemctl daemon-reload`: reruns the generators, reloads units.
    async fn reload(&self) -> Result<(), SystemdError>;
    /// The manager's SystemState: "running", "degraded", "stopping", …
    async fn system_state(&self) -> Result<String, SystemdError>;
    /// When this manager started (UserspaceTimestampMonotonic, µs): with
    /// the boot id, which run of the manager this is.
    async fn manager_started_us(&self) -> Result<u64, SystemdError>;
    /// `systemctl enable` without the reload.
    async fn enable_unit_file(&self, unit: &str) -> Result<(), SystemdError>;
    /// `systemctl disable` without the reload.
    async fn disable_unit_file(&self, unit: &str) -> Result<(), SystemdError>;

    /// State changes of the workload units (every `berth@` unit and those
    /// at `existing`) and new jobs, as they happen.
    async fn watch(&self, existing: WatchedPaths) -> Result<UnboundedReceiver<Change>, SystemdError>;
}

/// An InvocationID (16 bytes) as systemd prints it: 32 hex digits.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn job(path: String) -> Job {
    let id = path.rsplit('/').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    Job { path, id }
}

impl Ops for Systemd {
    async fn list_workloads(&self, existing: &[String]) -> Result<Vec<UnitStatus>, SystemdError> {
        // Each name a pattern of itself: unit names hold no `*?[`, and
        // systemd matches with FNM_NOESCAPE, so the backslash of an escape
        // such as `\x2d` is literal (scenario 20 lists one).
        let mut patterns = vec![WORKLOAD_PATTERN];
        patterns.extend(existing.iter().map(String::as_str));
        let rows = self
            .bounded(
                "ListUnitsByPatterns",
                WORKLOAD_PATTERN,
                self.manager.list_units_by_patterns(&[], &patterns),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|u| UnitStatus {
                load_state: LoadState::from(u.load_state),
                active_state: ActiveState::from(u.active_state),
                sub_state: u.sub_state,
                path: u.path.as_str().to_string(),
                job: (u.job_id != 0).then(|| (u.job_id, JobType::from(u.job_type))),
                name: u.name,
            })
            .collect())
    }

    async fn active_state(&self, unit: &str) -> Result<ActiveState, SystemdError> {
        let path = self
            .bounded("LoadUnit", unit, self.manager.load_unit(unit))
            .await?;
        let proxy = UnitProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| SystemdError::new("LoadUnit", unit, e))?;
        let state = self
            .bounded("Get ActiveState of", unit, proxy.active_state())
            .await?;
        Ok(ActiveState::from(state))
    }

    async fn details(&self, unit: &str) -> Result<UnitDetails, SystemdError> {
        let properties = self.unit_properties(unit).await?;
        let service = ServiceProxy::builder(&self.conn)
            .path(properties.inner().path().clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| SystemdError::new("LoadUnit", unit, e))?;
        let is_service = unit.ends_with(".service");
        // One round trip for all of them: the Service reads go out with the
        // Unit GetAll, and count only if the unit turns out to be loaded.
        let (u, result, code, status, pid, restarts) = tokio::join!(
            self.bounded("GetAll Unit of", unit, properties.unit(UNIT_INTERFACE)),
            self.bounded("Get Result of", unit, async {
                if is_service {
                    service.result().await
                } else {
                    Ok(String::new())
                }
            }),
            self.bounded("Get ExecMainCode of", unit, async {
                if is_service {
                    service.exec_main_code().await
                } else {
                    Ok(0)
                }
            }),
            self.bounded("Get ExecMainStatus of", unit, async {
                if is_service {
                    service.exec_main_status().await
                } else {
                    Ok(0)
                }
            }),
            self.bounded("Get MainPID of", unit, async {
                if is_service {
                    service.main_pid().await
                } else {
                    Ok(0)
                }
            }),
            self.bounded("Get NRestarts of", unit, async {
                if is_service {
                    service.n_restarts().await
                } else {
                    Ok(0)
                }
            }),
        );
        let u = u?;
        let mut details = UnitDetails {
            load_state: LoadState::from(u.load_state),
            active_state: ActiveState::from(u.active_state),
            job_id: u.job.0,
            invocation_id: hex(&u.invocation_id),
            sub_state: u.sub_state,
            ..Default::default()
        };
        if is_service && details.load_state == LoadState::Loaded {
            details.result = ServiceResult::from(result?);
            details.exec_main_code = ExitCode::from_code(code?);
            details.exec_main_status = status?;
            details.main_pid = pid?;
            // A count, not the state: its read failing is no failed
            // observation.
            details.n_restarts = restarts.ok();
        }
        Ok(details)
    }

    async fn topology(&self, unit: &str) -> Result<UnitTopology, SystemdError> {
        let properties = self.unit_properties(unit).await?;
        let u = self
            .bounded("GetAll Unit of", unit, properties.unit(UNIT_INTERFACE))
            .await?;
        let mut t = UnitTopology {
            load_state: LoadState::from(u.load_state),
            active_state: ActiveState::from(u.active_state),
            requires: u.requires,
            requisite: u.requisite,
            stop_propagated_from: u.stop_propagated_from.unwrap_or_default(),
            binds_to: u.binds_to,
            part_of: u.part_of,
            conflicts: u.conflicts,
            conflicted_by: u.conflicted_by,
            after: u.after,
            drop_ins: u.drop_in_paths,
            refuse_manual_stop: u.refuse_manual_stop,
            ignore_on_isolate: u.ignore_on_isolate,
            id: u.id,
            before: u.before,
            triggered_by: u.triggered_by,
            fragment_path: u.fragment_path,
            source_path: u.source_path,
            wanted_by: u.wanted_by.into_iter().chain(u.required_by).collect(),
            left_active_mono_us: u.active_exit_timestamp_monotonic,
            ..Default::default()
        };
        if unit.ends_with(".service") && t.load_state == LoadState::Loaded {
            let s = self
                .bounded("GetAll Service of", unit, properties.service(SERVICE_INTERFACE))
                .await?;
            t.slice = s.slice;
            t.timeout_stop_us = s.timeout_stop_usec;
            t.exec_stop = s.exec_stop.into_iter().map(|c| c.argv).collect();
            t.exec_start = s.exec_start.into_iter().map(|c| c.argv).collect();
            t.control_group = s.control_group;
        }
        Ok(t)
    }

    async fn job_type(&self, job: &str) -> Option<JobType> {
        let proxy = JobProxy::builder(&self.conn)
            .path(job)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .ok()?;
        let kind = self.bounded("Get JobType of", job, proxy.job_type()).await.ok()?;
        Some(JobType::from(kind))
    }

    async fn unit_file_state(&self, unit: &str) -> Result<UnitFileState, SystemdError> {
        let state = self
            .bounded("GetUnitFileState", unit, self.manager.get_unit_file_state(unit))
            .await?;
        Ok(UnitFileState::from(state))
    }

    async fn start(&self, unit: &str) -> Result<Job, SystemdError> {
        let path = self
            .queue_job("StartUnit", unit, self.manager.start_unit(unit, "replace"))
            .await?;
        Ok(job(path))
    }

    async fn stop(&self, unit: &str) -> Result<Job, SystemdError> {
        let path = match &self.together {
            Some(together) => self.stop_with_others(together, unit).await?,
            None => {
                self.queue_job("StopUnit", unit, self.manager.stop_unit(unit, "replace"))
                    .await?
            }
        };
        Ok(job(path))
    }

    async fn hang_up(&self, unit: &str) -> Result<(), SystemdError> {
        self.bounded("KillUnit", unit, self.manager.kill_unit(unit, "main", 1))
            .await
    }

    async fn ask_to_destroy(&self, unit: &str) -> Result<(), SystemdError> {
        let usr2 = nix::sys::signal::Signal::SIGUSR2 as i32;
        self.bounded("KillUnit", unit, self.manager.kill_unit(unit, "main", usr2))
            .await
    }

    async fn kill(&self, unit: &str) -> Result<(), SystemdError> {
        self.bounded("KillUnit", unit, self.manager.kill_unit(unit, "all", 9))
            .await
    }

    async fn cancel(&self, unit: &str, job: &Job) -> Result<(), SystemdError> {
        self.bounded("CancelJob", unit, self.manager.cancel_job(job.id))
            .await
    }

    async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult> {
        let registered = match self.jobs.lock() {
            Ok(mut jobs) => jobs.register(&job.path),
            Err(_) => Registered::Done(JobResult::Disconnected),
        };
        let rx = match registered {
            Registered::Done(result) => return Some(result),
            Registered::Waiting(rx) => rx,
        };
        let result = match limit {
            Some(limit) => tokio::time::timeout(limit, rx).await.ok()?,
            None => rx.await,
        };
        Some(result.unwrap_or(JobResult::Disconnected))
    }

    async fn reload(&self) -> Result<(), SystemdError> {
        self.bounded("Reload", "the manager", self.manager.reload()).await
    }

    async fn system_state(&self) -> Result<String, SystemdError> {
        self.bounded("Get SystemState of", "the manager", self.manager.system_state())
            .await
    }

    async fn manager_started_us(&self) -> Result<u64, SystemdError> {
        self.bounded(
            "Get UserspaceTimestampMonotonic of",
            "the manager",
            self.manager.userspace_timestamp_monotonic(),
        )
        .await
    }

    async fn enable_unit_file(&self, unit: &str) -> Result<(), SystemdError> {
        self.bounded(
            "EnableUnitFiles",
            unit,
            self.manager.enable_unit_files(&[unit], false, false),
        )
        .await
        .map(drop)
    }

    async fn disable_unit_file(&self, unit: &str) -> Result<(), SystemdError> {
        self.bounded(
            "DisableUnitFiles",
            unit,
            self.manager.disable_unit_files(&[unit], false),
        )
        .await
        .map(drop)
    }

    async fn watch(&self, existing: WatchedPaths) -> Result<UnboundedReceiver<Change>, SystemdError> {
        self.watch_changes(existing).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_come_from_the_path() {
        assert_eq!(job("/org/freedesktop/systemd1/job/4242".into()).id, 4242);
    }
}
