//! Watches the async runtime's workers from a thread of its own. A worker that runs for
//! [`STALL`] without coming back to park is held by one task that blocks its thread (a system
//! call that hangs, a long computation), or swamped; either way the tasks queued behind it
//! wait, and one in its LIFO slot cannot be taken by another worker. The log then says so,
//! once per stretch, with what each thread of fleetd is doing in the kernel (state, wait
//! channel, system call, read from `/proc`): a fleetd whose units stayed in their start
//! could not say where it stood.

use std::time::{Duration, Instant};

/// How long a worker may run without parking before the log says so.
pub const STALL: Duration = Duration::from_secs(2);
/// How often the workers are looked at.
const SAMPLE: Duration = Duration::from_millis(250);

/// One worker that ran without a break.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    pub worker: usize,
    pub running_for: Duration,
}

/// What the watch knows of each worker: its park/unpark count when last seen to move, and
/// since when it has not moved; whether its current stretch was told.
#[derive(Debug)]
pub struct StallTracker {
    workers: Vec<(u64, Instant, bool)>,
    stall: Duration,
}

impl StallTracker {
    pub fn new(workers: usize, now: Instant, stall: Duration) -> Self {
        Self { workers: vec![(0, now, false); workers], stall }
    }

    /// Takes in worker `worker`'s park/unpark count at `now` (odd: parked); says whether it has
    /// now run for the stall's length without a break, once per stretch.
    pub fn saw(&mut self, worker: usize, park_unpark: u64, now: Instant) -> Option<Stall> {
        let (count, since, told) = self.workers.get_mut(worker)?;
        if *count != park_unpark {
            (*count, *since, *told) = (park_unpark, now, false);
            return None;
        }
        let running_for = now.saturating_duration_since(*since);
        let parked = park_unpark % 2 == 1;
        if parked || *told || running_for < self.stall {
            return None;
        }
        *told = true;
        Some(Stall { worker, running_for })
    }
}

/// Starts the watch on `runtime`'s workers, logging each stall.
pub fn start(runtime: &tokio::runtime::Handle) {
    let metrics = runtime.metrics();
    let started = std::thread::Builder::new().name("fleet-stall-watch".into()).spawn(move || {
        watch(&metrics, STALL, |stall| {
            tracing::warn!(
                worker = stall.worker,
                running_for = ?stall.running_for,
                threads = %threads_in_kernel(),
                "a runtime worker has run without a break: a task may be blocking its thread, and the tasks behind it wait"
            );
        });
    });
    if let Err(error) = started {
        tracing::warn!(%error, "cannot start the watch of the runtime's workers");
    }
}

/// Looks at the workers every [`SAMPLE`] for ever, telling `report` of each stall.
fn watch(metrics: &tokio::runtime::RuntimeMetrics, stall: Duration, mut report: impl FnMut(Stall)) {
    let workers = metrics.num_workers();
    let mut tracker = StallTracker::new(workers, Instant::now(), stall);
    loop {
        std::thread::sleep(SAMPLE);
        let now = Instant::now();
        for worker in 0..workers {
            if let Some(stall) = tracker.saw(worker, metrics.worker_park_unpark_count(worker), now) {
                report(stall);
            }
        }
    }
}

/// Every thread of this process but the caller that is not idle in the runtime's waits: its name, thread
/// ID, state, kernel wait channel and system call (`running` when in user space).
pub fn threads_in_kernel() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return String::new() };
    // SAFETY: gettid has no preconditions.
    let own = unsafe { libc::gettid() }.to_string();
    let mut threads: Vec<String> = tasks
        .flatten()
        .filter(|task| task.file_name().to_string_lossy() != own.as_str())
        .filter_map(|task| {
            let dir = task.path();
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).map(|text| text.trim().to_string());
            let name = read("comm").ok()?;
            let state = read("stat").ok()?.rsplit_once(") ")?.1.split_whitespace().next()?.to_string();
            let wchan = read("wchan").unwrap_or_default();
            let syscall = read("syscall").ok().map(|call| describe_syscall(&call)).unwrap_or_default();
            // A worker parked on its futex or in epoll is where an idle one should be.
            let idle = state == "S" && (syscall.starts_with("futex") || syscall.starts_with("epoll_wait"));
            (!idle).then(|| format!("{name}[{}] {state} {wchan} {syscall}", task.file_name().to_string_lossy()))
        })
        .collect();
    threads.sort();
    threads.join("; ")
}

/// `/proc/…/syscall`'s first field, named for the calls a thread is likely found in (x86-64's
/// numbers; elsewhere the number as it is).
fn describe_syscall(line: &str) -> String {
    let number = line.split_whitespace().next().unwrap_or_default();
    match number {
        "running" => number.to_string(),
        _ => syscall_name(number).map_or_else(|| format!("syscall {number}"), str::to_string),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn syscall_name(_number: &str) -> Option<&'static str> {
    None
}

#[cfg(target_arch = "x86_64")]
fn syscall_name(number: &str) -> Option<&'static str> {
    let name = match number {
        "0" => "read",
        "1" => "write",
        "7" => "poll",
        "23" => "select",
        "35" => "nanosleep",
        "56" => "clone",
        "57" => "fork",
        "59" => "execve",
        "61" => "wait4",
        "73" => "flock",
        "74" => "fsync",
        "75" => "fdatasync",
        "82" => "rename",
        "84" => "rmdir",
        "202" => "futex",
        "230" => "clock_nanosleep",
        "232" => "epoll_wait",
        "257" => "openat",
        "281" => "epoll_pwait",
        "435" => "clone3",
        _ => return None,
    };
    Some(name)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn a_worker_is_told_once_per_stretch_without_a_break() {
        let start = Instant::now();
        let stall = Duration::from_secs(2);
        let mut tracker = StallTracker::new(2, start, stall);
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        assert_eq!(tracker.saw(0, 4, at(0)), None, "the first look sets the count");
        assert_eq!(tracker.saw(0, 4, at(1)), None, "running, not yet long");
        assert_eq!(tracker.saw(0, 4, at(2)), Some(Stall { worker: 0, running_for: stall }));
        assert_eq!(tracker.saw(0, 4, at(5)), None, "told once per stretch");
        assert_eq!(tracker.saw(0, 6, at(6)), None, "it parked and came back: a new stretch");
        assert_eq!(tracker.saw(0, 6, at(9)), Some(Stall { worker: 0, running_for: Duration::from_secs(3) }));
        assert_eq!(tracker.saw(1, 3, at(0)), None);
        assert_eq!(tracker.saw(1, 3, at(9)), None, "a parked worker (odd count) is idle, however long");
        assert_eq!(tracker.saw(7, 0, at(9)), None, "no such worker");
    }

    /// A task that blocks its worker's thread is found by the watch, and the thread is shown
    /// in its system call (it sleeps on the thread until the watch has told).
    #[test]
    fn a_task_that_blocks_its_worker_is_found() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let told = Arc::new(AtomicBool::new(false));
        let blocked = told.clone();
        runtime.spawn(async move {
            while !blocked.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let metrics = runtime.handle().metrics();
        let (stalls, seen) = std::sync::mpsc::channel();
        let watching = told.clone();
        std::thread::spawn(move || {
            watch(&metrics, Duration::from_millis(300), |stall| {
                let _ = stalls.send((stall, threads_in_kernel()));
                watching.store(true, Ordering::SeqCst);
            })
        });
        let (stall, threads) = seen.recv_timeout(Duration::from_secs(60)).expect("the blocked worker is told");
        assert!(stall.running_for >= Duration::from_millis(300), "{stall:?}");
        assert!(threads.contains("tokio-rt-worker"), "the worker is among the threads shown: {threads}");
        assert!(threads.contains("nanosleep"), "in its system call: {threads}");
    }
}
