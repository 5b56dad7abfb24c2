//! The journal questions managers relay to this machine on its change stream (or long polls),
//! as the one journal-answering facet every kind of machine has
//! ([`fleet_registry::JournalInbox`]): fleetd answers them by the same reconciler whether the
//! questions come through etcd or through a manager.

use async_trait::async_trait;
use fleet_registry::{ChangeSignal, JournalInbox, JournalQuestion, Result};

use crate::registry::RemoteRegistry;

#[async_trait]
impl JournalInbox for RemoteRegistry {
    async fn journal_questions(&self, machine: &str) -> Result<Vec<(String, JournalQuestion)>> {
        self.check_machine(machine)?;
        Ok(self.journal_asks().waiting())
    }

    fn journal_question_changes(&self, _machine: &str) -> ChangeSignal {
        self.journal_asks().changes()
    }

    /// Taken away before it is sent: an answer the manager could not take is not sent again
    /// (the asker has its own deadline, and says no answer came).
    async fn answer_journal(&self, machine: &str, id: &str, answer: &[u8]) -> Result<()> {
        self.check_machine(machine)?;
        // An id this machine never gave out names nothing waiting.
        let Ok(id) = id.parse::<u64>() else { return Ok(()) };
        if !self.journal_asks().take(id) {
            return Ok(());
        }
        self.post_journal_answer(id, answer.to_vec()).await
    }
}
