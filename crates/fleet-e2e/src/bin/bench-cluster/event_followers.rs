//! With `events=N`: N followers of the engine fleetd's event stream during (a), each a real
//! `fleetctl events --follow -o json --kind placed` over HTTPS with a viewer token (eight a
//! token: a credential holds at most eight live feeds). Each counts the placements it is
//! told of; the bench waits until every one has all of them, and says how long after the
//! units were all launched that was, and what the followers cost.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_e2e::https_listener::{Listener, write_private};
use fleet_e2e::{Fleetd, binary, cpu_seconds};

/// Followers one token serves (the API's bound per identity).
const PER_TOKEN: usize = 8;

pub struct Followers {
    children: Vec<Child>,
    told: Vec<Arc<AtomicU64>>,
}

impl Followers {
    /// `count` followers of `fleetd`'s stream through `listener`, from the first event on.
    pub fn start(fleetd: &Fleetd, listener: &Listener, count: usize) -> Self {
        let (mut children, mut told) = (Vec::new(), Vec::new());
        for token_index in 0..count.div_ceil(PER_TOKEN) {
            let name = format!("follower-{token_index}");
            let token = fleetd.ok(&["token", "create", "--role", "viewer", &name]).stdout.trim().to_string();
            let token_file = listener.dir().join(&name);
            write_private(&token_file, &token);
            for _ in 0..PER_TOKEN.min(count - token_index * PER_TOKEN) {
                let mut child = Command::new(binary("fleetctl"))
                    .args(["--endpoint", &listener.endpoint()])
                    .arg(format!("--ca-file={}", listener.ca_file.display()))
                    .arg(format!("--token-file={}", token_file.display()))
                    .args(["events", "--follow", "-o", "json", "--kind", "placed"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("fleetctl events --follow");
                let counted = Arc::new(AtomicU64::new(0));
                let (stdout, count_here) = (child.stdout.take().expect("its output"), counted.clone());
                std::thread::spawn(move || {
                    for _ in BufReader::new(stdout).lines().map_while(Result::ok) {
                        count_here.fetch_add(1, Ordering::Relaxed);
                    }
                });
                children.push(child);
                told.push(counted);
            }
        }
        Self { children, told }
    }

    /// Waits until every follower was told of `events` placements (at most `limit`); how
    /// long that took, or `None`.
    pub fn wait_for(&self, events: u64, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.told.iter().all(|told| told.load(Ordering::Relaxed) >= events) {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The fewest and the most placements a follower was told of.
    pub fn told(&self) -> (u64, u64) {
        let counts = self.told.iter().map(|told| told.load(Ordering::Relaxed));
        (counts.clone().min().unwrap_or(0), counts.max().unwrap_or(0))
    }

    /// The followers' CPU seconds so far, all together.
    pub fn cpu_seconds(&self) -> f64 {
        self.children.iter().map(|child| cpu_seconds(child.id())).sum()
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
