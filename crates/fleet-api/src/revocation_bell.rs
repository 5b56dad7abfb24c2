//! How open long polls learn that a machine was revoked: by one bell for all of them, not by
//! a timer each (ten thousand idle agents were twenty thousand wakeups a second). A
//! revocation made on this manager rings it at once; one made on another manager is found by
//! one task that, while any poll is open, reads the revoked machines every
//! [`REVOCATION_CHECK`] and rings when they changed. Each poll then checks its own machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::auth::Auth;

/// How soon a revocation made elsewhere ends the revoked machine's open poll.
pub const REVOCATION_CHECK: Duration = Duration::from_millis(500);

pub struct RevocationBell {
    rung: watch::Sender<u64>,
    open: watch::Sender<usize>,
    watching: AtomicBool,
}

impl Default for RevocationBell {
    fn default() -> Self {
        Self { rung: watch::channel(0).0, open: watch::channel(0).0, watching: AtomicBool::new(false) }
    }
}

/// A poll's place among the open ones, given up when it is dropped.
pub struct OpenPoll {
    bell: Arc<RevocationBell>,
}

impl Drop for OpenPoll {
    fn drop(&mut self) {
        self.bell.open.send_modify(|open| *open = open.saturating_sub(1));
    }
}

impl RevocationBell {
    /// A poll opens: the bell it waits on, and its place (the watch of revocations made
    /// elsewhere starts with the first poll, and looks only while polls are open).
    pub fn open_poll(self: &Arc<Self>, auth: &Auth) -> (watch::Receiver<u64>, OpenPoll) {
        if !self.watching.swap(true, Ordering::SeqCst) {
            tokio::spawn(watch_revocations(Arc::downgrade(self), self.open.subscribe(), auth.clone()));
        }
        self.open.send_modify(|open| *open += 1);
        let mut rung = self.rung.subscribe();
        rung.borrow_and_update();
        (rung, OpenPoll { bell: self.clone() })
    }

    /// A revocation was made: every open poll checks its machine.
    pub fn ring(&self) {
        self.rung.send_modify(|count| *count += 1);
    }
}

/// While polls are open, reads the revoked machines every [`REVOCATION_CHECK`] and rings when
/// they changed; ends with the bell. Its first read rings too: it has nothing to compare with,
/// and a machine revoked between a poll's admission and that read must not go unheard.
async fn watch_revocations(bell: Weak<RevocationBell>, mut open: watch::Receiver<usize>, auth: Auth) {
    let mut known = None;
    loop {
        if open.wait_for(|open| *open > 0).await.is_err() {
            return;
        }
        tokio::time::sleep(REVOCATION_CHECK).await;
        let Ok(now) = auth.revoked_machines().await else { continue };
        // No poll to hear it now: the next one will, against what was known before.
        if *open.borrow() == 0 {
            continue;
        }
        if known.as_ref() != Some(&now) {
            let Some(bell) = bell.upgrade() else { return };
            bell.ring();
            known = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use fleet_registry::{CredentialRegistry, RevokedMachine};
    use fleet_store_embedded::EmbeddedRegistry;

    use super::*;

    fn revoked(id: &str) -> RevokedMachine {
        RevokedMachine { id: id.to_string(), at: 1, key_sha256: None, forgotten: false }
    }

    async fn rings(rung: &mut watch::Receiver<u64>, what: &str) {
        tokio::time::timeout(Duration::from_secs(30), rung.changed())
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .expect("the bell lives");
    }

    #[tokio::test]
    async fn a_revocation_made_elsewhere_rings_the_open_polls_and_none_is_looked_for_without_them() {
        let dir = tempfile::tempdir().expect("a directory");
        let registry = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("the store"));
        let auth = Auth::new(registry.clone(), None);
        let bell = Arc::new(RevocationBell::default());
        let (mut rung, open) = bell.open_poll(&auth);
        rings(&mut rung, "the first read rings: nothing revoked before it goes unheard").await;
        // Another manager revokes a machine: the store has it, this manager's API never saw it.
        registry.revoke_machine(&revoked("m1")).await.expect("revoked");
        rings(&mut rung, "a revocation made elsewhere rings within the check").await;
        drop(open);
        assert_eq!(*bell.open.borrow(), 0, "the poll gave its place up");
        // No poll open: nothing is looked for; the next poll hears of what came meanwhile.
        registry.revoke_machine(&revoked("m2")).await.expect("revoked");
        let (mut rung, _open) = bell.open_poll(&auth);
        rings(&mut rung, "what came while no poll was open rings once one is").await;
    }

    #[tokio::test]
    async fn a_revocation_made_here_rings_at_once() {
        let dir = tempfile::tempdir().expect("a directory");
        let registry = Arc::new(EmbeddedRegistry::open(&dir.path().join("fleet.redb")).expect("the store"));
        let auth = Auth::new(registry, None);
        let bell = Arc::new(RevocationBell::default());
        let (mut rung, _open) = bell.open_poll(&auth);
        bell.ring();
        assert!(rung.has_changed().expect("the bell lives"));
        rung.changed().await.expect("rung");
    }
}
