//! A unit's hard limits on its processes (`fleet_core::requirements::limits_of`): cgroup v2's
//! `memory.max` and `cpu.max` in the unit's cgroup where the hierarchy offers those
//! controllers; else, on a host whose memory and cpu controllers sit in cgroup v1 hierarchies,
//! a cgroup of the same name in each of those, which the unit's processes join beside their
//! v2 one. Where neither can be had, the unit runs unlimited and the log says so.

use std::io;
use std::path::{Path, PathBuf};

use fleet_core::Resources;

/// The period CPU quotas are counted in, in microseconds (systemd's).
pub const CPU_PERIOD_MICROS: u64 = 100_000;

/// The CPU time a unit of `millis` thousandths of a core may use per period (the kernel's
/// least is 1 ms).
fn quota_micros(millis: u64) -> u64 {
    (millis.saturating_mul(CPU_PERIOD_MICROS) / 1000).max(1000)
}

/// Where the v1 hierarchy holding `controller` is mounted, from `/proc/self/mountinfo` text
/// (a mount of the hierarchy's root only).
fn v1_mount(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        let mut filesystem = filesystem.split_whitespace();
        if filesystem.next()? != "cgroup" {
            return None;
        }
        let options = filesystem.nth(1)?;
        if !options.split(',').any(|option| option == controller) {
            return None;
        }
        let fields: Vec<&str> = mount.split_whitespace().collect();
        (fields.get(3) == Some(&"/")).then(|| fields.get(4).map(PathBuf::from)).flatten()
    })
}

/// This process's path in the v1 hierarchy holding `controller`, from `/proc/self/cgroup`
/// text (`N:cpu,cpuacct:/path`).
fn v1_path<'a>(proc_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|name| name == controller).then_some(path)
    })
}

/// The v1 cgroup of `unit` in the hierarchy of `controller`, below this fleetd's own there,
/// created if missing; `None` where there is no such hierarchy.
fn v1_unit_dir(controller: &str, base_name: &str, unit: &str) -> io::Result<Option<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let Some(mount) = v1_mount(&mountinfo, controller) else { return Ok(None) };
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let own = v1_path(&own, controller).unwrap_or("/").trim_matches('/').to_string();
    let dir = mount.join(own).join(base_name).join(unit);
    std::fs::create_dir_all(&dir)?;
    Ok(Some(dir))
}

/// Removes the (empty) unit cgroups of the base named `base_name` in the v1 hierarchies, and
/// the base there: what a clean shutdown, or the cleanup after a dead fleetd, leaves is nothing.
pub fn remove_v1_bases(base_name: &str) {
    let (Ok(mountinfo), Ok(own)) =
        (std::fs::read_to_string("/proc/self/mountinfo"), std::fs::read_to_string("/proc/self/cgroup"))
    else {
        return;
    };
    for controller in ["memory", "cpu"] {
        let Some(mount) = v1_mount(&mountinfo, controller) else { continue };
        let base = mount.join(v1_path(&own, controller).unwrap_or("/").trim_matches('/')).join(base_name);
        if let Ok(entries) = std::fs::read_dir(&base) {
            for entry in entries.flatten().filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir())) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let _ = std::fs::remove_dir(&base);
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", path.display())))
}

/// Lets the unit cgroups below `base` use the memory and cpu controllers, where the hierarchy
/// allows it (it does not where fleetd's own cgroup holds processes and is not the root).
pub fn enable_controllers(base: &Path) {
    for dir in [base.parent(), Some(base)].into_iter().flatten() {
        for controller in ["+memory", "+cpu"] {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), controller);
        }
    }
}

/// Applies `limits` to the unit whose v2 cgroup is `v2_dir` (the unit `unit` of the base named
/// `base_name`). Returns the v1 cgroups the unit's processes must join for them.
pub fn apply(v2_dir: &Path, base_name: &str, unit: &str, limits: Resources) -> io::Result<Vec<PathBuf>> {
    let mut v1_dirs = Vec::new();
    if limits.memory > 0 {
        let bytes = limits.memory.to_string();
        if v2_dir.join("memory.max").exists() {
            write(&v2_dir.join("memory.max"), &bytes)?;
        } else if let Some(dir) = v1_unit_dir("memory", base_name, unit)? {
            write(&dir.join("memory.limit_in_bytes"), &bytes)?;
            v1_dirs.push(dir);
        } else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no memory controller to limit memory with"));
        }
    }
    if limits.cpu_millis > 0 {
        let quota = quota_micros(limits.cpu_millis);
        if v2_dir.join("cpu.max").exists() {
            write(&v2_dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_MICROS}"))?;
        } else if let Some(dir) = v1_unit_dir("cpu", base_name, unit)? {
            write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_MICROS.to_string())?;
            write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
            v1_dirs.push(dir);
        } else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no cpu controller to limit CPU with"));
        }
    }
    Ok(v1_dirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
36 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
37 25 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
38 25 0:33 /nested /mnt/elsewhere rw - cgroup cgroup rw,pids
";

    #[test]
    fn v1_hierarchies_are_found_by_controller_and_only_at_their_root() {
        assert_eq!(v1_mount(MOUNTINFO, "memory"), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(v1_mount(MOUNTINFO, "cpu"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(v1_mount(MOUNTINFO, "pids"), None, "a mount of a subtree is not the hierarchy");
        assert_eq!(v1_mount(MOUNTINFO, "hugetlb"), None);
        let own =
            "12:memory:/system.slice/fleet.service\n4:cpu,cpuacct:/system.slice\n0::/system.slice/fleet.service\n";
        assert_eq!(v1_path(own, "memory"), Some("/system.slice/fleet.service"));
        assert_eq!(v1_path(own, "cpu"), Some("/system.slice"));
        assert_eq!(v1_path(own, "blkio"), None);
    }

    #[test]
    fn a_cpu_quota_is_its_share_of_the_period_and_never_below_the_kernels_least() {
        assert_eq!(quota_micros(500), 50_000);
        assert_eq!(quota_micros(2000), 200_000);
        assert_eq!(quota_micros(1), 1000);
    }
}
