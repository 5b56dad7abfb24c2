//! The process's own figures, read from `/proc/self` at scrape time, under the names every
//! Prometheus client library uses (`process_*`).

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// Linux reports CPU times in `/proc` in units of USER_HZ, which is 100 on every architecture.
const USER_HZ: f64 = 100.0;

#[derive(Debug, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: f64,
    start_time_seconds: f64,
    virtual_bytes: f64,
    resident_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    threads: f64,
}

/// The figures from the text of `/proc/self/stat`, `/proc/self/status`, `/proc/self/limits`
/// and the boot time from `/proc/stat`.
fn parse(stat: &str, status: &str, limits: &str, boot_time: f64) -> ProcessFigures {
    // The command name (field 2) may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    // Counting from field 3 (state) at index 0.
    let field = |number: usize| fields.get(number - 3).and_then(|value| value.parse::<f64>().ok()).unwrap_or(0.0);
    let status_kib = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let max_fds = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse::<f64>().ok())
        .unwrap_or(0.0);
    ProcessFigures {
        cpu_seconds: (field(14) + field(15)) / USER_HZ,
        start_time_seconds: boot_time + field(22) / USER_HZ,
        virtual_bytes: field(23),
        resident_bytes: status_kib("VmRSS") * 1024.0,
        open_fds: 0.0,
        max_fds,
        threads: status_kib("Threads"),
    }
}

fn read_figures() -> Option<ProcessFigures> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let boot_time = read("/proc/stat")?
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    let mut figures =
        parse(&read("/proc/self/stat")?, &read("/proc/self/status")?, &read("/proc/self/limits")?, boot_time);
    figures.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count) as f64;
    Some(figures)
}

/// Adds the process's figures to `registry`; nothing where `/proc` cannot be read.
pub(crate) fn register(registry: &mut Registry) {
    let Some(figures) = read_figures() else {
        return;
    };
    let process = registry.sub_registry_with_prefix("process");
    process.register_with_unit(
        "cpu",
        "User and system CPU time spent",
        Unit::Seconds,
        ConstCounter::new(figures.cpu_seconds),
    );
    process.register_with_unit(
        "start_time",
        "Start time of the process since the Unix epoch",
        Unit::Seconds,
        ConstGauge::new(figures.start_time_seconds),
    );
    process.register_with_unit(
        "virtual_memory",
        "Virtual memory size",
        Unit::Bytes,
        ConstGauge::new(figures.virtual_bytes),
    );
    process.register_with_unit(
        "resident_memory",
        "Resident memory size",
        Unit::Bytes,
        ConstGauge::new(figures.resident_bytes),
    );
    process.register("open_fds", "Open file descriptors", ConstGauge::new(figures.open_fds));
    process.register("max_fds", "Limit on open file descriptors", ConstGauge::new(figures.max_fds));
    process.register("threads", "Threads of the process", ConstGauge::new(figures.threads));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_proc_files() {
        let stat = "4242 (fleet d) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1000 123456789 2000 18446744073709551615";
        let status = "Name:\tfleetd\nVmRSS:\t   10240 kB\nThreads:\t7\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let figures = parse(stat, status, limits, 1_700_000_000.0);
        assert_eq!(
            figures,
            ProcessFigures {
                cpu_seconds: 3.0,
                start_time_seconds: 1_700_000_010.0,
                virtual_bytes: 123_456_789.0,
                resident_bytes: 10_485_760.0,
                open_fds: 0.0,
                max_fds: 1024.0,
                threads: 7.0,
            }
        );
    }

    #[test]
    fn garbage_gives_zeros_not_a_panic() {
        assert_eq!(parse("", "", "", 0.0), ProcessFigures::default());
        assert_eq!(parse("1 (x", "VmRSS: lots", "Max open files unlimited", 0.0).resident_bytes, 0.0);
    }
}
