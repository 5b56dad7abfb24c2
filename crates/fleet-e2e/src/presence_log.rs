//! Which machines etcd holds as present (their `machines/<id>` key, bound to their lease),
//! polled through the members' gateways on a thread of its own: the chaos checker's view of
//! an outage as fleet itself sees it. A machine is out of touch from when its lease expired
//! (its key went) to when it joined again, whatever fault or mix of faults caused it.
//!
//! A poll can lag (a member that does not answer makes it wait), so an absence is recorded as
//! an interval from the last reading that still saw the machine's key to the first that saw
//! it back (or a new key: away and back between two readings), and double runs are judged
//! against those intervals after the fact, never against a reading that may come late.
//!
//! When no member answers at all (etcd lost its quorum or its leader), no machine can learn
//! anything from etcd, whatever its lease says: such a silence, from the last answered poll to
//! the next, counts as every machine out of touch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::lab_etcd::keys_under;

/// How often etcd is asked.
const POLL: Duration = Duration::from_millis(200);

/// One machine as the readings saw it.
#[derive(Debug)]
struct Machine {
    /// The last reading that saw its key, and the key's creation revision then.
    present_at: Instant,
    created: Option<i64>,
    /// Whether the last reading found no key.
    absent: bool,
    /// Its absences: from the last reading that saw it to the first that saw it back
    /// (`None`: not back yet).
    absences: Vec<(Instant, Option<Instant>)>,
}

/// The stretches when no member answered: from the last answered poll to the next one
/// (`None`: none yet).
#[derive(Debug)]
struct Silences {
    last_answer: Instant,
    silent: bool,
    stretches: Vec<(Instant, Option<Instant>)>,
}

impl Silences {
    fn record(&mut self, answered: bool, now: Instant) {
        match (answered, self.silent) {
            (true, true) => {
                if let Some(last) = self.stretches.last_mut() {
                    last.1 = Some(now);
                }
            }
            (false, false) => self.stretches.push((self.last_answer, None)),
            _ => {}
        }
        self.silent = !answered;
        if answered {
            self.last_answer = now;
        }
    }
}

/// The log, updated by its thread until dropped.
pub struct PresenceLog {
    machines: Arc<Mutex<BTreeMap<String, Machine>>>,
    silences: Arc<Mutex<Silences>>,
    /// When the last poll that ended (answered or not) began: what happened before that is
    /// recorded.
    last_poll: Arc<Mutex<Instant>>,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl PresenceLog {
    /// Polls `machines/` under `prefix` at the members' `addresses` for the machines `ids`,
    /// which are taken as present when the log begins.
    pub fn start(addresses: Vec<String>, prefix: &str, ids: &[String]) -> Self {
        let began = Instant::now();
        let machines: BTreeMap<String, Machine> = ids
            .iter()
            .map(|id| (id.clone(), Machine { present_at: began, created: None, absent: false, absences: Vec::new() }))
            .collect();
        let machines = Arc::new(Mutex::new(machines));
        let silences = Arc::new(Mutex::new(Silences { last_answer: began, silent: false, stretches: Vec::new() }));
        let last_poll = Arc::new(Mutex::new(began));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (machines, silences, stop) = (machines.clone(), silences.clone(), stop.clone());
            let last_poll = last_poll.clone();
            let prefix = format!("{prefix}machines/");
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let asked = Instant::now();
                    let keys = keys_under(&addresses, &prefix);
                    let now = Instant::now();
                    if let Ok(mut silences) = silences.lock() {
                        silences.record(keys.is_some(), now);
                    }
                    if let Some(keys) = keys {
                        let Ok(mut machines) = machines.lock() else { return };
                        for (id, machine) in machines.iter_mut() {
                            record(machine, keys.get(&format!("{prefix}{id}")).copied(), now);
                        }
                    }
                    if let Ok(mut last_poll) = last_poll.lock() {
                        *last_poll = asked;
                    }
                    std::thread::sleep(POLL);
                }
            })
        };
        Self { machines, silences, last_poll, stop, poller: Some(poller) }
    }

    /// Whether a poll that began after `at` has ended: the log then holds what etcd said of
    /// the time up to `at` (a poll can lag by seconds while members do not answer).
    pub fn has_read_after(&self, at: Instant) -> bool {
        self.last_poll.lock().is_ok_and(|last| *last > at)
    }

    /// How much of `[from, to]` none of the machines `ids` spent out of touch (etcd silent
    /// included), or within `grace` of being back: the part of a double run no outage
    /// accounts for.
    pub fn unexcused(&self, ids: &[String], from: Instant, to: Instant, grace: Duration) -> Duration {
        let Ok(machines) = self.machines.lock() else { return Duration::ZERO };
        let Ok(silences) = self.silences.lock() else { return Duration::ZERO };
        let mut covers: Vec<(Instant, Instant)> = ids
            .iter()
            .filter_map(|id| machines.get(id))
            .flat_map(|machine| machine.absences.iter())
            .chain(&silences.stretches)
            .map(|(start, back)| (*start, back.map_or(to, |back| back + grace)))
            .collect();
        covers.sort();
        let (mut uncovered, mut reached) = (Duration::ZERO, from);
        for (start, end) in covers {
            if start > reached {
                uncovered += start.min(to).saturating_duration_since(reached);
            }
            reached = reached.max(end);
        }
        if reached < to {
            uncovered += to - reached;
        }
        uncovered
    }

    /// What the readings saw of the machines `ids` and of etcd's silences near `[from, to]`,
    /// in seconds from `from`: the evidence a judged episode is explained by (or not).
    pub fn seen_around(&self, ids: &[String], from: Instant, to: Instant) -> String {
        let near = |start: Instant, end: Option<Instant>| {
            let reach = Duration::from_secs(15);
            start <= to + reach && end.is_none_or(|end| end + reach >= from)
        };
        let offset = |at: Instant| {
            if at >= from { (at - from).as_secs_f64() } else { -(from - at).as_secs_f64() }
        };
        let spans = |stretches: &[(Instant, Option<Instant>)]| -> Vec<String> {
            stretches
                .iter()
                .filter(|(start, end)| near(*start, *end))
                .map(|(start, end)| match end {
                    Some(end) => format!("{:+.1} s to {:+.1} s", offset(*start), offset(*end)),
                    None => format!("{:+.1} s on", offset(*start)),
                })
                .collect()
        };
        let mut lines = Vec::new();
        if let Ok(machines) = self.machines.lock() {
            for id in ids {
                let Some(machine) = machines.get(id) else { continue };
                let away = spans(&machine.absences);
                lines.push(format!(
                    "{id}: away {}; last seen {:+.1} s (key created at revision {:?})",
                    if away.is_empty() { "never near this".to_string() } else { away.join(", ") },
                    offset(machine.present_at),
                    machine.created
                ));
            }
        }
        if let Ok(silences) = self.silences.lock() {
            let silent = spans(&silences.stretches);
            if !silent.is_empty() {
                lines.push(format!("etcd answered no one: {}", silent.join(", ")));
            }
        }
        lines.join("; ")
    }

    /// The longest no etcd member answered (ended silences only).
    pub fn longest_silence(&self) -> Duration {
        let Ok(silences) = self.silences.lock() else { return Duration::ZERO };
        silences.stretches.iter().filter_map(|(start, back)| back.map(|back| back - *start)).max().unwrap_or_default()
    }

    /// The longest a machine was out of touch (ended absences only, as the readings bound
    /// them).
    pub fn longest_absence(&self) -> Duration {
        let Ok(machines) = self.machines.lock() else { return Duration::ZERO };
        machines
            .values()
            .flat_map(|machine| machine.absences.iter())
            .filter_map(|(start, back)| back.map(|back| back - *start))
            .max()
            .unwrap_or_default()
    }
}

/// One reading of one machine: its key's creation revision, or `None` when it has none.
fn record(machine: &mut Machine, key: Option<i64>, now: Instant) {
    match key {
        None if !machine.absent => {
            machine.absent = true;
            machine.absences.push((machine.present_at, None));
        }
        None => {}
        Some(created) => {
            let made_again = machine.created.is_some_and(|was| was != created);
            if machine.absent {
                if let Some(last) = machine.absences.last_mut() {
                    last.1 = Some(now);
                }
            } else if made_again {
                // Away and back between two readings.
                machine.absences.push((machine.present_at, Some(now)));
            }
            machine.absent = false;
            machine.created = Some(created);
            machine.present_at = now;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absences_excuse_what_they_cover_and_their_grace() {
        let t0 = Instant::now();
        let at = |seconds: u64| t0 + Duration::from_secs(seconds);
        let mut machine = Machine { present_at: t0, created: Some(1), absent: false, absences: Vec::new() };
        record(&mut machine, Some(1), at(1));
        record(&mut machine, None, at(3));
        record(&mut machine, Some(5), at(6));
        // Away and back between two readings: a new key.
        record(&mut machine, Some(9), at(20));
        assert_eq!(machine.absences, vec![(at(1), Some(at(6))), (at(6), Some(at(20)))]);
        // etcd answered no one from 30 s (the last answer) to 34 s.
        let mut silences = Silences { last_answer: t0, silent: false, stretches: Vec::new() };
        silences.record(true, at(30));
        silences.record(false, at(31));
        silences.record(false, at(33));
        silences.record(true, at(34));
        assert_eq!(silences.stretches, vec![(at(30), Some(at(34)))]);
        let log = PresenceLog {
            machines: Arc::new(Mutex::new(BTreeMap::from([("m".to_string(), machine)]))),
            silences: Arc::new(Mutex::new(silences)),
            last_poll: Arc::new(Mutex::new(at(34))),
            stop: Arc::new(AtomicBool::new(true)),
            poller: None,
        };
        let ids = ["m".to_string()];
        assert_eq!(log.unexcused(&ids, at(2), at(24), Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(log.unexcused(&ids, at(0), at(1), Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(log.unexcused(&["other".to_string()], at(0), at(5), Duration::ZERO), Duration::from_secs(5));
        assert_eq!(log.longest_absence(), Duration::from_secs(14));
        // A silence excuses every machine, the grace after it included.
        assert_eq!(
            log.unexcused(&["other".to_string()], at(29), at(38), Duration::from_secs(3)),
            Duration::from_secs(2)
        );
        assert_eq!(log.longest_silence(), Duration::from_secs(4));
        assert!(log.has_read_after(at(33)) && !log.has_read_after(at(34)));
        // The evidence, for a report: relative to the episode's start.
        assert_eq!(
            log.seen_around(&ids, at(2), at(24)),
            "m: away -1.0 s to +4.0 s, +4.0 s to +18.0 s; last seen +18.0 s (key created at revision Some(9)); \
             etcd answered no one: +28.0 s to +32.0 s"
        );
    }
}
