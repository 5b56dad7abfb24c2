//! Answers the journal questions other fleetds of the cluster put to this machine
//! (`fleet_registry::JournalInbox`: through etcd on a member, relayed by its manager on a pull
//! agent): each is answered from the unit manager, as this machine's own API would answer it,
//! when the inbox says one was put. The one answering path for every kind of machine.

use std::sync::Arc;

use fleet_api::LocalMachine;
use fleet_registry::JournalInbox;
use fleet_runtime::{Next, Reconciler, Triggers};

pub struct JournalAnswers {
    questions: Arc<dyn JournalInbox>,
    local: LocalMachine,
    triggers: Triggers,
}

impl JournalAnswers {
    pub fn new(questions: Arc<dyn JournalInbox>, local: LocalMachine) -> Self {
        let triggers = Triggers::none().with(questions.journal_question_changes(&local.machine_id));
        Self { questions, local, triggers }
    }
}

impl Reconciler for JournalAnswers {
    type Error = fleet_registry::RegistryError;
    const NAME: &'static str = "journal answers";

    async fn pass(&mut self) -> Result<Next, Self::Error> {
        let machine = self.local.machine_id.clone();
        for (id, question) in self.questions.journal_questions(&machine).await? {
            let answer = self.local.relayed_journal(&question.unit, question.lines, question.status).await;
            if let fleet_api::schema::RelayedJournal::Failed { error } = &answer {
                tracing::warn!(unit = question.unit, %error, "cannot read a unit's journal for another fleetd");
            }
            let answer = serde_json::to_vec(&answer).unwrap_or_default();
            self.questions.answer_journal(&machine, &id, &answer).await?;
        }
        Ok(Next::OnChange)
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}
