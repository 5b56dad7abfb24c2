//! How many live feeds (the web view's `/ui/events`, the event streams of `/fleet/v1/events`) each identity holds open, bounded: a feed is a held
//! connection and a task, so one credential (or anonymous callers together) cannot open them
//! without end. All together they hold at most half of a listener's connections
//! ([`FeedSlots::for_connections`]), so live views never starve the rest of the API (issue 67:
//! 45 of them against `api_max_connections = 40` left no connection for anyone else).

use fleet_core::unpoisoned::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The most feeds one identity holds open at once.
pub const PER_IDENTITY: usize = 8;
/// The most feeds open at once, all identities together.
pub const IN_ALL: usize = 1024;

pub struct FeedSlots {
    open: Mutex<HashMap<String, usize>>,
    in_all: usize,
}

impl Default for FeedSlots {
    fn default() -> Self {
        Self { open: Mutex::default(), in_all: IN_ALL }
    }
}

/// One feed's slot, given back when the feed ends.
pub struct FeedSlot {
    slots: Arc<FeedSlots>,
    identity: String,
}

/// No slot is free: the identity's own bound, or the bound of all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoSlot {
    #[error("at most {PER_IDENTITY} live feeds (web views and event streams) are open per identity; close one first")]
    Identity,
    #[error("this fleetd serves all the live feeds (web views and event streams) it may already; try again later")]
    Everyone,
}

impl FeedSlots {
    /// The slots of a fleetd whose listeners take `connections` each: half of them at most.
    pub fn for_connections(connections: usize) -> Self {
        Self { open: Mutex::default(), in_all: (connections / 2).clamp(1, IN_ALL) }
    }

    /// A slot for a feed of `identity`.
    pub fn take(self: &Arc<Self>, identity: &str) -> Result<FeedSlot, NoSlot> {
        let mut open = self.open.locked();
        if open.values().sum::<usize>() >= self.in_all {
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

impl FeedSlots {
    /// [`FeedSlots::take`], or the 429 that refuses the feed. The connection goes with the
    /// refusal: a refused feed keeps no connection of the listener's for the keep-alive's
    /// while (issue 67).
    pub fn take_or_refuse(self: &Arc<Self>, identity: &str) -> Result<FeedSlot, Box<axum::response::Response>> {
        use axum::http::{HeaderValue, StatusCode, header};
        use axum::response::IntoResponse;
        self.take(identity).map_err(|full| {
            let refused = crate::error::ApiError::new(StatusCode::TOO_MANY_REQUESTS, full.to_string());
            let mut refused = refused.into_response();
            refused.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            Box::new(refused)
        })
    }
}

impl Drop for FeedSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.locked();
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

    /// Regression (issue 67): 45 live views against 40 connections starved the API.
    #[test]
    fn live_views_hold_at_most_half_of_a_listeners_connections() {
        let slots = Arc::new(FeedSlots::for_connections(40));
        let held: Vec<FeedSlot> = (0..45).filter_map(|n| slots.take(&format!("token:{n}")).ok()).collect();
        assert_eq!(held.len(), 20, "half of the 40");
        assert_eq!(slots.take("token:late").err(), Some(NoSlot::Everyone));
        assert_eq!(FeedSlots::for_connections(100_000).in_all, IN_ALL, "never more than the bound of all");
    }
}
