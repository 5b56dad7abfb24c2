//! A cgroup v2 per unit, where the hierarchy is writable: the one record of a unit's
//! processes that the unit can neither leave (a `setsid`, a double fork) nor forge (an
//! emptied or rewritten environment), so stopping a unit and cleaning up after a dead
//! fleetd reach every process it started.
//!
//! Layout: `<fleetd's own cgroup>/fleet-units.<id>/<unit name>`, where `<id>` is derived
//! from the state directory, so two fleetds on one host never share units.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cgroup_procs::CgroupProcs;

/// The directory holding one fleetd's unit cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupBase {
    /// Where it is on the file system.
    dir: PathBuf,
    /// Its path inside the hierarchy, as `/proc/<pid>/cgroup` names it.
    hierarchy_path: String,
}

/// Where the cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo` text.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        if filesystem.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        // The fifth field is the mount point; the fourth its root inside the hierarchy.
        let fields: Vec<&str> = mount.split_whitespace().collect();
        if fields.get(3) != Some(&"/") {
            return None;
        }
        fields.get(4).map(PathBuf::from)
    })
}

/// A process's cgroup v2 path, from `/proc/<pid>/cgroup` text (the `0::` line).
fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|line| line.strip_prefix("0::"))
}

/// Where fleetd mounts the cgroup v2 hierarchy itself when nothing mounted it (a host that
/// mounts only cgroup v1 controllers): one place per host, found again by later fleetds.
pub const OWN_MOUNT: &str = "/run/fleet/cgroup2";

/// Mounts the cgroup v2 hierarchy at [`OWN_MOUNT`] (root only, and only where the kernel has
/// one: it is one hierarchy however often it is mounted).
fn mount_own() -> io::Result<PathBuf> {
    let dir = PathBuf::from(OWN_MOUNT);
    std::fs::create_dir_all(&dir)?;
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let kind = c"cgroup2";
    // SAFETY: every pointer is a NUL-terminated string that lives across the call; no data.
    let mounted = unsafe { libc::mount(kind.as_ptr(), target.as_ptr(), kind.as_ptr(), 0, std::ptr::null()) };
    if mounted != 0 {
        return Err(io::Error::last_os_error());
    }
    tracing::info!(dir = %dir.display(), "mounted the cgroup v2 hierarchy to hold units' processes");
    Ok(dir)
}

impl CgroupBase {
    /// Prepares the base for the supervisor marked `marker`, or `None` where there is no
    /// writable cgroup v2 hierarchy (then process groups and the marker are what is left).
    /// Where none is mounted, it mounts one of its own if it may.
    pub fn prepare(marker: &str) -> Option<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = match cgroup2_mount(&mountinfo) {
            Some(mount) => mount,
            None => match mount_own() {
                Ok(mount) => mount,
                Err(error) => {
                    tracing::info!(%error, "no cgroup v2 hierarchy is mounted, and none can be mounted here");
                    return None;
                }
            },
        };
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let own = unified_path(&own)?.trim_end_matches('/').to_string();
        let name = format!("fleet-units.{:016x}", fnv1a(marker.as_bytes()));
        let hierarchy_path = format!("{own}/{name}");
        let dir = mount.join(hierarchy_path.trim_start_matches('/'));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                tracing::info!(dir = %dir.display(), %error, "no writable cgroup v2 hierarchy: units are tracked by process group and marker");
                return None;
            }
        }
        // Writing into cgroup.procs is what placing a unit needs: check it once here.
        if !dir.join("cgroup.procs").exists() {
            return None;
        }
        Some(Self { dir, hierarchy_path })
    }

    /// A base at a known place, for the keeper (which is told where it is).
    pub fn at(dir: PathBuf) -> Self {
        Self { dir, hierarchy_path: String::new() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The base's own name, which its unit cgroups in v1 hierarchies sit below too.
    pub fn name(&self) -> String {
        self.dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// Where `unit`'s cgroup is in its hierarchy (`/fleet-units.…/web.service`), as
    /// `/proc/PID/cgroup` and `systemctl status` name a cgroup.
    pub fn path_of(&self, unit: &str) -> String {
        format!("{}/{unit}", self.hierarchy_path)
    }

    /// The cgroup of `unit`, created if missing.
    pub fn unit(&self, unit: &str) -> io::Result<UnitCgroup> {
        if unit.is_empty() || unit.contains('/') || unit.starts_with('.') || unit.starts_with("cgroup.") {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{unit:?} cannot name a cgroup")));
        }
        let dir = self.dir.join(unit);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
        let procs = CgroupProcs::of_dirs([dir.as_path()])?;
        Ok(UnitCgroup { hierarchy_path: self.path_of(unit), dir, procs, limited_in: Vec::new() })
    }

    /// What a process joins to be one of `unit`'s processes, while the unit has a cgroup here
    /// (its cgroup v2; on a hybrid host, not the v1 ones that hold its limits).
    pub fn running_unit(&self, unit: &str) -> Option<CgroupProcs> {
        if unit.is_empty() || unit.contains('/') || unit.starts_with('.') || unit.starts_with("cgroup.") {
            return None;
        }
        let dir = self.dir.join(unit);
        dir.is_dir().then(|| CgroupProcs::of_dirs([dir.as_path()]).ok()).flatten()
    }

    /// Kills every process in `unit`'s cgroup, if it has one.
    pub fn kill_unit(&self, unit: &str) {
        if unit.is_empty() || unit.contains('/') || unit.starts_with('.') || unit.starts_with("cgroup.") {
            return;
        }
        let dir = self.dir.join(unit);
        if dir.is_dir() {
            UnitCgroup::existing(dir).kill_all();
        }
    }

    /// Kills every process in every unit cgroup below the base and removes those cgroups:
    /// what a fleetd that died left behind. Returns how many processes it found.
    pub fn kill_everything(&self) -> usize {
        self.kill_everything_but(&std::collections::BTreeSet::new())
    }

    /// [`CgroupBase::kill_everything`] but for the cgroups of the units in `kept` (those an
    /// earlier image of this fleetd handed over, which run on).
    pub fn kill_everything_but(&self, kept: &std::collections::BTreeSet<String>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut found = 0;
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|unit| kept.contains(unit)) {
                continue;
            }
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                let unit = UnitCgroup::existing(entry.path());
                found += unit.pids().len();
                unit.kill_all();
                let deadline = Instant::now() + Duration::from_secs(5);
                while unit.populated() && Instant::now() < deadline {
                    unit.kill_all();
                    std::thread::sleep(Duration::from_millis(5));
                }
                unit.remove();
            }
        }
        if kept.is_empty() {
            super::limits::remove_v1_bases(&self.name());
        }
        found
    }
}

impl CgroupBase {
    /// Removes the unit cgroups that are empty, then the base itself if nothing is left:
    /// what a clean shutdown leaves behind is nothing.
    pub fn remove_if_empty(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten().filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir())) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        super::limits::remove_v1_bases(&self.name());
    }
}

/// One unit's cgroup.
#[derive(Clone, Debug)]
pub struct UnitCgroup {
    dir: PathBuf,
    hierarchy_path: String,
    /// Its `cgroup.procs`, then those of `limited_in`: ready for a child to write itself into
    /// between fork and exec.
    procs: CgroupProcs,
    /// The unit's cgroups in v1 hierarchies that hold its limits (a hybrid host).
    limited_in: Vec<PathBuf>,
}

impl UnitCgroup {
    fn existing(dir: PathBuf) -> Self {
        let procs = CgroupProcs::of_dirs([dir.as_path()]).unwrap_or_default();
        Self { dir, hierarchy_path: String::new(), procs, limited_in: Vec::new() }
    }

    /// Limits the unit's processes to `limits` (see [`super::limits`]).
    pub fn limit(&mut self, base_name: &str, unit: &str, limits: fleet_core::Resources) -> io::Result<()> {
        for dir in super::limits::apply(&self.dir, base_name, unit, limits)? {
            self.procs.push(&dir)?;
            self.limited_in.push(dir);
        }
        Ok(())
    }

    /// What a process joins to be one of the unit's (this cgroup and its v1 ones).
    pub fn procs(&self) -> &CgroupProcs {
        &self.procs
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|line| line.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Whether any process is left in the cgroup.
    pub fn populated(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(events) => events.lines().any(|line| line == "populated 1"),
            Err(_) => !self.pids().is_empty(),
        }
    }

    /// Whether `pid` is one of this unit's processes: the check a PID file's content must
    /// pass before fleetd, as root, signals it.
    pub fn contains(&self, pid: u32) -> bool {
        if self.hierarchy_path.is_empty() {
            return self.pids().contains(&pid);
        }
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|text| unified_path(&text) == Some(self.hierarchy_path.as_str()))
    }

    /// Sends `signal` to every process in the cgroup.
    pub fn signal(&self, signal: i32) {
        for pid in self.pids() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Kills every process in the cgroup: through `cgroup.kill` where the kernel has it
    /// (no fork can race it), else SIGKILL to each process listed now.
    pub fn kill_all(&self) {
        let by_kernel = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .and_then(|mut file| std::io::Write::write_all(&mut file, b"1"))
            .is_ok();
        if !by_kernel {
            self.signal(libc::SIGKILL);
        }
    }

    /// Removes the (empty) cgroup, and its v1 ones; a cgroup still in use stays.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
        for dir in &self.limited_in {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// FNV-1a: a stable, dependency-free name for a base from its state directory.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mount_and_own_path() {
        let mountinfo = "25 1 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(mountinfo), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let nested = "41 31 0:38 /sub /mnt rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(nested), None, "a bind of a subtree does not show the whole hierarchy");
        assert_eq!(
            unified_path("4:memory:/x\n0::/system.slice/fleetd.service\n"),
            Some("/system.slice/fleetd.service")
        );
        assert_eq!(unified_path("4:memory:/x\n"), None);
    }

    #[test]
    fn unit_names_that_cannot_be_cgroups_are_refused() {
        let base = CgroupBase::at(PathBuf::from("/nonexistent"));
        for name in ["", "a/b", "..", ".hidden", "cgroup.procs"] {
            assert!(base.unit(name).is_err(), "{name}");
        }
    }
}
