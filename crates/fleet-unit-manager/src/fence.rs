//! The fence of the units that asked to run at most once (`[X-Fleet] AtMostOnce=`), as a
//! manager with a keeper holds it: the moment by which they must have stopped unless fleetd
//! moves it on (their machine's presence may have lapsed then), and which units it covers.
//! Once fleetd has armed a fence (its machine's presence lives under a lease), such a unit
//! starts only under a fence that covers it and has not passed: a fleetd frozen in the middle
//! of a pass and woken after its presence lapsed cannot start it again. Where the presence
//! never lapses (one machine on the embedded store), fleetd arms none and nothing is fenced.

use std::collections::BTreeSet;

use fleet_core::UnitFile;
use fleet_core::requirements::asks_at_most_once;
use tokio::time::Instant;

use crate::{Result, UnitManagerError};

#[derive(Debug, Default)]
pub struct Fence {
    armed: Option<(Instant, BTreeSet<String>)>,
    /// Whether fleetd ever armed one: from then on, starts are checked.
    in_force: bool,
    /// The units loaded whose file asks to run at most once.
    asking: BTreeSet<String>,
}

impl Fence {
    pub fn loaded(&mut self, name: &str, file: &UnitFile) {
        if asks_at_most_once(file) {
            self.asking.insert(name.to_string());
        } else {
            self.asking.remove(name);
        }
    }

    pub fn unloaded(&mut self, name: &str) {
        self.asking.remove(name);
    }

    /// Replaces the fence; no units lifts it.
    pub fn arm(&mut self, deadline: Instant, units: &[String]) {
        self.in_force = true;
        self.armed = (!units.is_empty()).then(|| (deadline, units.iter().cloned().collect()));
    }

    /// Whether `name` may start now.
    pub fn check_start(&self, name: &str, now: Instant) -> Result<()> {
        if !self.in_force || !self.asking.contains(name) {
            return Ok(());
        }
        match &self.armed {
            Some((deadline, units)) if *deadline > now && units.contains(name) => Ok(()),
            _ => Err(UnitManagerError::Fenced { unit: name.to_string() }),
        }
    }

    /// The units whose fence has passed at `now`, taken out of it: a keeper kills them.
    pub fn take_due(&mut self, now: Instant) -> Vec<String> {
        match &self.armed {
            Some((deadline, _)) if *deadline <= now => {
                self.armed.take().map(|(_, units)| units.into_iter().collect()).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_unit_that_asked_starts_only_under_a_fence_that_holds() {
        let once = UnitFile::parse("[Service]\nExecStart=/bin/true\n[X-Fleet]\nAtMostOnce=true\n").unwrap();
        let plain = UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
        let mut fence = Fence::default();
        fence.loaded("once.service", &once);
        fence.loaded("plain.service", &plain);
        let now = Instant::now();
        assert!(fence.check_start("once.service", now).is_ok(), "no fence was ever armed: none is in force");
        fence.arm(now, &[]);
        assert!(fence.check_start("plain.service", now).is_ok(), "no fence needed");
        assert!(fence.check_start("once.service", now).is_err(), "no fence covers it");
        fence.arm(now + Duration::from_secs(4), &["once.service".to_string()]);
        assert!(fence.check_start("once.service", now).is_ok());
        assert!(fence.take_due(now).is_empty());
        let later = now + Duration::from_secs(4);
        assert!(fence.check_start("once.service", later).is_err(), "the fence passed");
        assert_eq!(fence.take_due(later), ["once.service"]);
        assert!(fence.take_due(later).is_empty(), "taken once");
    }
}
