//! How many live feeds (`/ui/events`) each identity holds open, bounded: a feed is a held
//! connection and a task, so one credential (or anonymous callers together) cannot open them
//! without end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The most feeds one identity holds open at once.
pub const PER_IDENTITY: usize = 8;
/// The most feeds open at once, all identities together.
pub const IN_ALL: usize = 1024;

#[derive(Default)]
pub struct FeedSlots {
    open: Mutex<HashMap<String, usize>>,
}

/// One feed's slot, given back when the feed ends.
pub struct FeedSlot {
    slots: Arc<FeedSlots>,
    identity: String,
}

/// No slot is free: the identity's own bound, or the bound of all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoSlot {
    #[error("at most {PER_IDENTITY} live views are open per identity; close one first")]
    Identity,
    #[error("this fleetd serves {IN_ALL} live views already; try again later")]
    Everyone,
}

impl FeedSlots {
    /// A slot for a feed of `identity`.
    pub fn take(self: &Arc<Self>, identity: &str) -> Result<FeedSlot, NoSlot> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.values().sum::<usize>() >= IN_ALL {
            return Err(NoSlot::Everyone);
        }
        let held = open.entry(identity.to_string()).or_default();
        if *held >= PER_IDENTITY {
            return Err(NoSlot::Identity);
        }
        *held += 1;
        Ok(FeedSlot { slots: self.clone(), identity: identity.to_string() })
    }
}

impl Drop for FeedSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(held) = open.get_mut(&self.identity) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_identity_holds_a_bounded_number_and_gets_them_back() {
        let slots = Arc::new(FeedSlots::default());
        let held: Vec<FeedSlot> = (0..PER_IDENTITY).map(|_| slots.take("token:a").unwrap()).collect();
        assert_eq!(slots.take("token:a").err(), Some(NoSlot::Identity));
        assert!(slots.take("token:b").is_ok(), "another identity has its own");
        drop(held);
        assert!(slots.take("token:a").is_ok(), "closed feeds give their slots back");
        let many: Vec<FeedSlot> =
            (0..IN_ALL).filter_map(|n| slots.take(&format!("token:{}", n / PER_IDENTITY)).ok()).collect();
        assert_eq!(slots.take("token:zz").err(), Some(NoSlot::Everyone));
        drop(many);
        assert!(slots.open.lock().unwrap().is_empty());
    }
}
