//! The systemd cgroup driver (`--cgroup-driver systemd`): every cgroup swiftlet creates is a
//! transient slice unit that systemd creates, configures and removes, asked over its D-Bus API
//! (`org.freedesktop.systemd1.Manager` on the system bus). Names map as the kubelet maps them
//! ([`crate::pod::cgroup_name`]): `/kubepods/burstable/pod<uid>` is the unit
//! `kubepods-burstable-pod<uid>.slice`, and that unit name is what the runtime gets as the
//! pod's cgroup parent.
//!
//! systemd owns the slices: were their files written behind its back alone, it would put its own
//! values back whenever it re-applies its units (a `daemon-reload`). So each setting is first
//! given to systemd as a unit property (`CPUWeight`/`CPUShares`, `CPUQuotaPerSecUSec` and
//! `CPUQuotaPeriodUSec`, `MemoryMax`/`MemoryLimit`, `TasksMax`), then written to the file as
//! on cgroupfs, as runc's systemd driver does: the file holds the exact number at once, and what
//! systemd writes later is the same.
//!
//! The files themselves are where the hierarchy underneath puts them (v1 or v2, [`super::driver`]).
use super::driver::{Controller, Driver, Hierarchy, Settings};
use super::{Error, Result};
use crate::pod::cgroup_name::{self, NoSliceName};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};

const DESTINATION: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const UNIT: &str = "org.freedesktop.systemd1.Unit";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
/// How long one D-Bus call may take: a hung systemd fails the pod's sync, it does not wedge it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a started or stopped slice may take to get there.
const SETTLE: Duration = Duration::from_secs(10);
/// systemd's "no limit" for the quota, memory and tasks properties.
const INFINITY: u64 = u64::MAX;

/// The systemd driver: unit names and D-Bus calls over the file layout of `files`.
#[derive(Debug)]
pub struct Systemd {
    files: std::sync::Arc<dyn Driver>,
    bus: zbus::blocking::Connection,
}

impl Systemd {
    /// Connects to systemd on the system bus. Fails, saying why, where systemd is not the
    /// init system or its bus cannot be reached.
    pub fn connect(files: std::sync::Arc<dyn Driver>) -> Result<Self> {
        let unreachable = |message: String| Error::Systemd {
            op: "connecting to systemd",
            unit: String::new(),
            message,
        };
        if !Path::new("/run/systemd/system").is_dir() {
            return Err(unreachable(
                "this host was not booted with systemd (/run/systemd/system is missing): use \
                 --cgroup-driver cgroupfs"
                    .into(),
            ));
        }
        let bus = zbus::blocking::connection::Builder::system()
            .and_then(|b| b.method_timeout(CALL_TIMEOUT).build())
            .map_err(|e| unreachable(format!("the system bus: {e}")))?;
        let driver = Self { files, bus };
        // One call now, so that a systemd that does not answer is found at start.
        let version: OwnedValue = driver
            .properties(MANAGER_PATH)?
            .call("Get", &(MANAGER, "Version"))
            .map_err(|e| unreachable(e.to_string()))?;
        let version = String::try_from(version).unwrap_or_default();
        tracing::info!(version, "cgroups through systemd");
        Ok(driver)
    }

    fn proxy<'a>(&self, path: &'a str, interface: &'a str) -> Result<zbus::blocking::Proxy<'a>> {
        zbus::blocking::proxy::Builder::new(&self.bus)
            .destination(DESTINATION)
            .and_then(|b| b.path(path))
            .and_then(|b| b.interface(interface))
            .map(|b| b.cache_properties(zbus::proxy::CacheProperties::No))
            .and_then(|b| b.build())
            .map_err(|e| Error::Systemd {
                op: "addressing",
                unit: path.to_owned(),
                message: e.to_string(),
            })
    }

    fn manager(&self) -> Result<zbus::blocking::Proxy<'_>> {
        self.proxy(MANAGER_PATH, MANAGER)
    }

    fn properties<'a>(&self, path: &'a str) -> Result<zbus::blocking::Proxy<'a>> {
        self.proxy(path, PROPERTIES)
    }

    /// The unit's `ActiveState`, `None` when systemd has no such unit loaded.
    fn active_state(&self, unit: &str) -> Result<Option<String>> {
        let path: OwnedObjectPath = match self.manager()?.call("GetUnit", &(unit,)) {
            Ok(p) => p,
            Err(e) if method_error(&e) == Some(NO_SUCH_UNIT) => return Ok(None),
            Err(e) => return Err(failed("looking up", unit, e)),
        };
        let state: OwnedValue = match self
            .properties(path.as_str())?
            .call("Get", &(UNIT, "ActiveState"))
        {
            Ok(v) => v,
            // Unloaded between the two calls.
            Err(e) if method_error(&e).is_some() => return Ok(None),
            Err(e) => return Err(failed("reading the state of", unit, e)),
        };
        Ok(String::try_from(state).ok())
    }

    /// Waits until `unit` is in `want` (`None`: gone); false when [`SETTLE`] passed first.
    fn settle(&self, unit: &str, want: Option<&str>) -> Result<bool> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let state = self.active_state(unit)?;
            if state.as_deref() == want || (want.is_none() && state.as_deref() == Some("inactive"))
            {
                return Ok(true);
            }
            if state.as_deref() == Some("failed") || start.elapsed() > SETTLE {
                return Ok(false);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    fn slice(&self, name: &str) -> Result<String> {
        cgroup_name::slice_unit(name).map_err(unsafe_name)
    }

    /// Where systemd puts the slice of cgroup `name`, relative to each hierarchy's root.
    fn slice_dir(name: &str) -> Result<String> {
        cgroup_name::slice_dir(name).map_err(unsafe_name)
    }
}

/// The unit properties that carry `settings` on `hierarchy`.
fn resource_properties(
    hierarchy: Hierarchy,
    settings: &Settings,
) -> Vec<(&'static str, Value<'static>)> {
    let v2 = hierarchy == Hierarchy::V2;
    let mut props = Vec::new();
    if let Some(shares) = settings.cpu_shares {
        props.push(if v2 {
            ("CPUWeight", Value::U64(super::shares_to_weight(shares)))
        } else {
            ("CPUShares", Value::U64(shares))
        });
    }
    if let Some((quota, period)) = settings.cpu_quota {
        // systemd keeps the quota per second of wall time, with a precision of 10 ms
        // (1%): rounded up, as runc does. The file then gets the exact quota.
        let per_sec = quota.map_or(INFINITY, |q| {
            let us = q.saturating_mul(1_000_000) / period.max(1);
            us.div_ceil(10_000).saturating_mul(10_000)
        });
        props.push(("CPUQuotaPerSecUSec", Value::U64(per_sec)));
        props.push(("CPUQuotaPeriodUSec", Value::U64(period)));
    }
    if let Some(limit) = settings.memory_limit {
        let key = if v2 { "MemoryMax" } else { "MemoryLimit" };
        props.push((key, Value::U64(limit.unwrap_or(INFINITY))));
    }
    if let Some(limit) = settings.pids_limit {
        props.push(("TasksMax", Value::U64(limit.unwrap_or(INFINITY))));
    }
    props
}

/// The D-Bus error name of a failed method call.
fn method_error(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

fn failed(op: &'static str, unit: &str, e: zbus::Error) -> Error {
    Error::Systemd {
        op,
        unit: unit.to_owned(),
        message: e.to_string(),
    }
}

fn unsafe_name(e: NoSliceName) -> Error {
    Error::UnsafeName(e.0)
}

impl Driver for Systemd {
    fn hierarchy(&self) -> Hierarchy {
        self.files.hierarchy()
    }

    fn dir(&self, controller: Controller, name: &str) -> Result<PathBuf> {
        self.files.dir(controller, &Self::slice_dir(name)?)
    }

    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        self.files.dirs(&Self::slice_dir(name)?)
    }

    fn all_dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        self.files.all_dirs(&Self::slice_dir(name)?)
    }

    fn cpu_weight(&self, shares: u64) -> u64 {
        self.files.cpu_weight(shares)
    }

    fn default_cpu_weight(&self) -> u64 {
        self.files.default_cpu_weight()
    }

    fn memory_limit_file(&self) -> &'static str {
        self.files.memory_limit_file()
    }

    fn cpu_usage_dir(&self, name: &str) -> Result<PathBuf> {
        self.files.cpu_usage_dir(&Self::slice_dir(name)?)
    }

    fn managed(&self) -> bool {
        true
    }

    fn runtime_parent(&self, name: &str) -> Result<String> {
        self.slice(name)
    }

    fn container_child<'a>(&self, id: &'a str) -> std::borrow::Cow<'a, str> {
        cgroup_name::container_cgroup(id, true)
    }

    /// Starts the transient slice (its parents are started by systemd as its dependencies)
    /// and waits until it is active, so that the files hold systemd's values when read. A
    /// slice that exists already is started if it is not active.
    fn create_managed(&self, name: &str) -> Result<Option<bool>> {
        let unit = self.slice(name)?;
        let parent = cgroup_name::parent_slice_unit(name).map_err(unsafe_name)?;
        let props: Vec<(&str, Value<'_>)> = vec![
            (
                "Description",
                Value::from(format!("swiftlet cgroup {name}")),
            ),
            ("Wants", Value::from(vec![parent.as_str()])),
            ("DefaultDependencies", Value::Bool(false)),
            ("CPUAccounting", Value::Bool(true)),
            ("MemoryAccounting", Value::Bool(true)),
            ("TasksAccounting", Value::Bool(true)),
        ];
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        let manager = self.manager()?;
        let fresh = match manager.call::<_, _, OwnedObjectPath>(
            "StartTransientUnit",
            &(unit.as_str(), "replace", props, aux),
        ) {
            Ok(_) => true,
            Err(e) if method_error(&e) == Some(UNIT_EXISTS) => {
                if self.active_state(&unit)?.as_deref() != Some("active") {
                    manager
                        .call::<_, _, OwnedObjectPath>("StartUnit", &(unit.as_str(), "replace"))
                        .map_err(|e| failed("starting", &unit, e))?;
                }
                false
            }
            Err(e) => return Err(failed("creating the slice", &unit, e)),
        };
        if !self.settle(&unit, Some("active"))? {
            return Err(Error::Systemd {
                op: "starting",
                unit,
                message: format!(
                    "not active after {SETTLE:?} (state {:?})",
                    self.active_state(&self.slice(name)?)?
                ),
            });
        }
        tracing::debug!(unit, fresh, "slice started");
        // The files hold systemd's values, not the kernel's defaults: read before written.
        Ok(Some(false))
    }

    fn declare(&self, name: &str, settings: &Settings) -> Result<()> {
        let props = resource_properties(self.files.hierarchy(), settings);
        if props.is_empty() {
            return Ok(());
        }
        let unit = self.slice(name)?;
        self.manager()?
            .call::<_, _, ()>("SetUnitProperties", &(unit.as_str(), true, props))
            .map_err(|e| failed("setting the properties of", &unit, e))
    }

    /// Stops the slice (systemd kills what is left in it and removes its cgroups) and waits
    /// until it is gone. A slice systemd does not know is no error; what systemd leaves behind
    /// the caller removes as on cgroupfs.
    fn remove_managed(&self, name: &str) -> Result<()> {
        let unit = self.slice(name)?;
        match self
            .manager()?
            .call::<_, _, OwnedObjectPath>("StopUnit", &(unit.as_str(), "replace"))
        {
            Ok(_) => {}
            Err(e) if method_error(&e) == Some(NO_SUCH_UNIT) => return Ok(()),
            Err(e) => return Err(failed("stopping", &unit, e)),
        }
        if !self.settle(&unit, None)? {
            tracing::warn!(unit, "slice not stopped in time");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_become_the_properties_runc_would_set() {
        let props = |v2: bool, s: &Settings| {
            resource_properties(if v2 { Hierarchy::V2 } else { Hierarchy::V1 }, s)
        };
        let s = Settings {
            cpu_shares: Some(512),
            cpu_quota: Some((Some(25_000), 100_000)),
            memory_limit: Some(Some(64 << 20)),
            pids_limit: Some(None),
        };
        let v2 = props(true, &s);
        assert_eq!(
            v2,
            vec![
                ("CPUWeight", Value::U64(super::super::shares_to_weight(512))),
                ("CPUQuotaPerSecUSec", Value::U64(250_000)),
                ("CPUQuotaPeriodUSec", Value::U64(100_000)),
                ("MemoryMax", Value::U64(64 << 20)),
                ("TasksMax", Value::U64(u64::MAX)),
            ]
        );
        let v1 = props(false, &s);
        assert_eq!(v1[0], ("CPUShares", Value::U64(512)));
        assert_eq!(v1[3], ("MemoryLimit", Value::U64(64 << 20)));
        // 1m of cpu: 100 us of quota per 100 ms is 1 ms per second, rounded up to 10 ms.
        let tiny = Settings {
            cpu_quota: Some((Some(100), 100_000)),
            ..Default::default()
        };
        assert_eq!(
            props(true, &tiny)[0],
            ("CPUQuotaPerSecUSec", Value::U64(10_000))
        );
        let unlimited = Settings {
            cpu_quota: Some((None, 100_000)),
            memory_limit: Some(None),
            ..Default::default()
        };
        assert_eq!(
            props(true, &unlimited),
            vec![
                ("CPUQuotaPerSecUSec", Value::U64(u64::MAX)),
                ("CPUQuotaPeriodUSec", Value::U64(100_000)),
                ("MemoryMax", Value::U64(u64::MAX)),
            ]
        );
    }
}
