//! Which machines etcd holds as present (their `machines/<id>` key, bound to their lease),
//! polled through the members' gateways on a thread of its own: the chaos checker's view of
//! an outage as fleet itself sees it. A machine is out of touch from when its lease expired
//! (its key went) to when it joined again, whatever fault or mix of faults caused it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::lab_etcd::keys_under;

/// How often etcd is asked.
const POLL: Duration = Duration::from_millis(200);

/// One machine's presence as last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Present, under the key made at `created`; since when (`None`: since before the log
    /// began). A key made again means the machine was away in between, seen or not.
    Present { since: Option<Instant>, created: Option<i64> },
    /// Its key is gone: its units may run elsewhere. Since when.
    Absent { since: Instant },
}

#[derive(Debug, Default)]
struct Seen {
    machines: BTreeMap<String, Presence>,
    longest_absence: Duration,
}

/// The log, updated by its thread until dropped.
pub struct PresenceLog {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl PresenceLog {
    /// Polls `machines/` under `prefix` at the members' `addresses` for the machines `ids`,
    /// which are taken as present when the log begins.
    pub fn start(addresses: Vec<String>, prefix: &str, ids: &[String]) -> Self {
        let machines = ids.iter().map(|id| (id.clone(), Presence::Present { since: None, created: None })).collect();
        let seen = Arc::new(Mutex::new(Seen { machines, longest_absence: Duration::ZERO }));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (seen, stop, machines) = (seen.clone(), stop.clone(), format!("{prefix}machines/"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(keys) = keys_under(&addresses, &machines) {
                        let now = Instant::now();
                        let Ok(mut seen) = seen.lock() else { return };
                        let Seen { machines: known, longest_absence } = &mut *seen;
                        for (id, presence) in known.iter_mut() {
                            let here = keys.get(&format!("{machines}{id}")).copied();
                            *presence = match (*presence, here) {
                                (Presence::Absent { since }, Some(created)) => {
                                    *longest_absence = (*longest_absence).max(now - since);
                                    Presence::Present { since: Some(now), created: Some(created) }
                                }
                                (Presence::Present { .. }, None) => Presence::Absent { since: now },
                                // The first reading, or the same key as before.
                                (Presence::Present { since, created: None }, Some(created)) => {
                                    Presence::Present { since, created: Some(created) }
                                }
                                (Presence::Present { since, created: Some(was) }, Some(created)) if was == created => {
                                    Presence::Present { since, created: Some(created) }
                                }
                                // Away and back between two readings: back from now.
                                (Presence::Present { .. }, Some(created)) => {
                                    Presence::Present { since: Some(now), created: Some(created) }
                                }
                                (absent, None) => absent,
                            };
                        }
                    }
                    std::thread::sleep(POLL);
                }
            })
        };
        Self { seen, stop, poller: Some(poller) }
    }

    /// Whether `id` was out of touch at some point within `grace` before now (or is still).
    pub fn out_of_touch_within(&self, id: &str, grace: Duration) -> bool {
        let Ok(seen) = self.seen.lock() else { return false };
        match seen.machines.get(id) {
            Some(Presence::Absent { .. }) => true,
            Some(Presence::Present { since: Some(since), .. }) => since.elapsed() <= grace,
            _ => false,
        }
    }

    /// The longest a machine was out of touch (ended absences only).
    pub fn longest_absence(&self) -> Duration {
        self.seen.lock().map(|seen| seen.longest_absence).unwrap_or_default()
    }
}

impl Drop for PresenceLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
    }
}
