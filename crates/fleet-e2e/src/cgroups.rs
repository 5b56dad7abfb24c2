//! Reading the kernel's cgroups from a test: where a hierarchy is mounted, and which cgroup a
//! process is in.

use std::path::PathBuf;

/// Where the cgroup hierarchy of `filesystem` (`cgroup2`, or `cgroup` with `controller`) is
/// mounted at its root.
pub fn mount_of(filesystem: &str, controller: &str) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split_whitespace();
        let kind = fs.next()?;
        let options = fs.nth(1).unwrap_or_default();
        let wanted = kind == filesystem && (kind == "cgroup2" || options.split(',').any(|o| o == controller));
        let fields: Vec<&str> = mount.split_whitespace().collect();
        (wanted && fields.get(3) == Some(&"/")).then(|| PathBuf::from(fields[4]))
    })
}

/// The directory of the cgroup v2 that `pid` is in, where a cgroup v2 hierarchy is mounted.
pub fn cgroup2_dir_of(pid: u32) -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    Some(mount_of("cgroup2", "")?.join(path.trim_start_matches('/')))
}
