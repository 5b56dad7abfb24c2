//! The shape of every loop that runs only on the engine leader, on the one reconciler
//! runtime: a pass whenever the leadership is taken or what it reads changes, or when
//! something it looks after is due; nothing while this fleetd does not lead.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::{Lifecycle, Next, Reconciler, Triggers};

/// What runs on the engine leader only, one pass at a time.
pub trait LeaderPass: Send {
    type Error: Display + Send;
    /// Names it in the log: "`NAME` failed".
    const NAME: &'static str;
    /// How long to let a burst of changes gather before a pass.
    const SETTLE: Duration = Duration::ZERO;
    /// One pass; says when the next is due at the latest (a change brings it sooner).
    fn pass(&mut self) -> impl Future<Output = Result<Next, Self::Error>> + Send;
    /// How long to let a burst of changes gather before a pass, given how long the last one
    /// took: [`LeaderPass::SETTLE`] unless the pass says otherwise.
    fn settle(&self, took: Duration) -> Duration {
        let _ = took;
        Self::SETTLE
    }
}

/// Runs `pass` while `leads` says this fleetd leads, on each move of `changes` and when it
/// asked, until `lifecycle` ends it.
pub async fn while_leading<P: LeaderPass>(
    pass: P,
    changes: Triggers,
    leads: watch::Receiver<bool>,
    lifecycle: watch::Receiver<Lifecycle>,
) {
    let mut triggers = changes;
    triggers.add(leads.clone());
    crate::run(WhileLeading { pass, leads, triggers }, lifecycle).await;
}

struct WhileLeading<P> {
    pass: P,
    leads: watch::Receiver<bool>,
    triggers: Triggers,
}

impl<P: LeaderPass> Reconciler for WhileLeading<P> {
    type Error = P::Error;
    const NAME: &'static str = P::NAME;
    // A pass in progress does not hold up a shutdown (its store calls may wait out their
    // timeouts when the store is gone): its writes are idempotent, the next leader's pass
    // completes what it left.
    const STOP_CUTS_PASS: bool = true;

    async fn pass(&mut self) -> Result<Next, P::Error> {
        if !*self.leads.borrow() {
            return Ok(Next::OnChange);
        }
        self.pass.pass().await
    }

    fn settle(&mut self, took: Duration) -> Duration {
        self.pass.settle(took)
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}
