//! Reservations enforced: under the native supervisor a unit's processes run under its limits,
//! read back here from the kernel's cgroup files (cgroup v2's `memory.max` and `cpu.max` where
//! the hierarchy has those controllers, the v1 memory and cpu hierarchies on a hybrid host):
//! `[X-Fleet] Memory=` and `CPU=` where the unit sets no limit of its own, its own
//! `MemoryMax=` and `CPUQuota=` where it does.

use std::path::PathBuf;
use std::time::Duration;

use fleet_e2e::cgroups::mount_of;
use fleet_e2e::{Fleetd, unit_processes, write_unit};

/// The process running `/bin/sleep <marker>` among the supervisor's.
fn process_of(fleet: &Fleetd, marker: &str) -> Option<u32> {
    unit_processes(&fleet.state_dir()).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| cmdline.split(|byte| *byte == 0).any(|arg| arg == marker.as_bytes()))
    })
}

/// The limit `pid` runs under, read from the cgroup files: (memory bytes, CPU quota per
/// 100 ms period in µs); `None` for no limit.
fn limits_of(pid: u32) -> (Option<u64>, Option<u64>) {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("the process's cgroups");
    let path_in = |wanted: &str| {
        cgroups.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches =
                if wanted.is_empty() { controllers.is_empty() } else { controllers.split(',').any(|c| c == wanted) };
            matches.then(|| path.trim_start_matches('/').to_string())
        })
    };
    let read = |path: PathBuf| std::fs::read_to_string(&path).ok().map(|text| text.trim().to_string());
    let v2 = mount_of("cgroup2", "").zip(path_in("")).map(|(mount, path)| mount.join(path));
    let memory = match v2.as_ref().and_then(|dir| read(dir.join("memory.max"))) {
        Some(max) => max.parse().ok(),
        None => {
            let dir = mount_of("cgroup", "memory").zip(path_in("memory")).map(|(mount, path)| mount.join(path));
            // v1 says "no limit" with the largest page-aligned number.
            dir.and_then(|dir| read(dir.join("memory.limit_in_bytes")))
                .and_then(|text| text.parse().ok())
                .filter(|bytes| *bytes < 1 << 60)
        }
    };
    let cpu = match v2.as_ref().and_then(|dir| read(dir.join("cpu.max"))) {
        Some(max) => max.split_whitespace().next().and_then(|quota| quota.parse().ok()),
        None => {
            let dir = mount_of("cgroup", "cpu").zip(path_in("cpu")).map(|(mount, path)| mount.join(path));
            dir.and_then(|dir| read(dir.join("cpu.cfs_quota_us")))
                .and_then(|text| text.parse::<i64>().ok())
                .and_then(|quota| u64::try_from(quota).ok())
        }
    };
    (memory, cpu)
}

#[test]
fn native_units_run_under_their_reservations_or_their_own_limits() {
    let fleet = Fleetd::start("e2e0limits000001", &[]);
    let dir = tempfile::tempdir().expect("dir");
    let reserving = write_unit(
        dir.path(),
        "reserving.service",
        "[Service]\nExecStart=/bin/sleep 100001\n[X-Fleet]\nMemory=64M\nCPU=0.5\n",
    );
    let own = write_unit(
        dir.path(),
        "own.service",
        "[Service]\nExecStart=/bin/sleep 100002\nMemoryMax=96M\nCPUQuota=25%\n[X-Fleet]\nMemory=64M\nCPU=1\n",
    );
    let free = write_unit(dir.path(), "free.service", "[Service]\nExecStart=/bin/sleep 100003\n");
    fleet.ok(&["start", "--no-block", &reserving, &own, &free]);
    fleet.wait_until("the three units run", Duration::from_secs(20), |f| {
        ["100001", "100002", "100003"].iter().all(|marker| process_of(f, marker).is_some())
    });
    let pid = |marker: &str| process_of(&fleet, marker).expect("its process");
    let mib = 1 << 20;
    assert_eq!(limits_of(pid("100001")), (Some(64 * mib), Some(50_000)), "its reservation limits it");
    assert_eq!(limits_of(pid("100002")), (Some(96 * mib), Some(25_000)), "its own limits win");
    assert_eq!(
        limits_of(pid("100003")),
        limits_of(fleet.pid()),
        "a unit that reserves nothing runs under fleetd's own"
    );
}
