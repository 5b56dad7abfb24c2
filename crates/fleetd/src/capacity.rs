//! What this machine offers units that reserve memory or CPU: fleet.conf's `capacity_memory`
//! and `capacity_cpu` where given, else what the kernel reports less the system's reserve.

use fleet_core::Resources;

use fleetd::config::Config;

/// This machine's capacity, read from the kernel where fleet.conf does not give it; `None`
/// when the kernel's memory cannot be read and fleet.conf does not say (it then limits
/// nothing).
pub fn of_this_machine(config: &Config) -> Option<Resources> {
    let memory = match config.capacity_memory {
        Some(memory) => memory,
        None => kernel_memory()?.saturating_sub(config.system_reserved_memory),
    };
    let cpu_millis = match config.capacity_cpu {
        Some(cpu) => cpu,
        None => kernel_cpu_millis().saturating_sub(config.system_reserved_cpu),
    };
    Some(Resources { memory, cpu_millis })
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn kernel_memory() -> Option<u64> {
    mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The CPUs this process may run on (its affinity and cgroup quota), in thousandths.
fn kernel_cpu_millis() -> u64 {
    std::thread::available_parallelism().map_or(1, |cpus| cpus.get() as u64) * 1000
}

/// The `MemTotal:  16318588 kB` line of a meminfo text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       16318588 kB\nMemFree:         1234 kB\n";
        assert_eq!(mem_total(meminfo), Some(16_318_588 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);
    }

    #[test]
    fn fleet_conf_gives_the_capacity_else_the_kernel_less_the_reserve() {
        let given = Config { capacity_memory: Some(2 << 30), capacity_cpu: Some(1500), ..Config::default() };
        assert_eq!(of_this_machine(&given), Some(Resources { memory: 2 << 30, cpu_millis: 1500 }));
        let kernel = of_this_machine(&Config::default()).expect("this machine's /proc/meminfo");
        let total = kernel_memory().expect("MemTotal");
        assert_eq!(kernel.memory, total - (256 << 20), "the default reserve is 256M");
        assert_eq!(kernel.cpu_millis, kernel_cpu_millis());
    }
}
