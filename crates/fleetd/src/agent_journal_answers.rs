//! A manager answers the journal questions other fleetds put through the store to the pull
//! agents it holds: an agent cannot reach the store, so the question would wait for an answer
//! nobody writes. One watch follows every machine's questions; each question for an agent this
//! manager hears from is carried on the agent's stream (`fleet_api::journal_relay`), and its
//! answer, or the agent's error, written back for the asker. A question is carried once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fleet_api::agent_presence::AgentPresence;
use fleet_api::journal_relay::JournalRelay;
use fleet_api::schema::RelayedJournal;
use fleet_registry::{JournalQuestions, PutQuestion};
use fleet_runtime::{Next, Reconciler, Triggers};
use tokio::task::JoinSet;

/// How long the agent is given: less than the asker waits for the store's answer
/// (`fleet_api`'s relay wait, 10 s), so an agent's late answer is not written for nobody.
pub const AGENT_WAIT: Duration = Duration::from_secs(7);

pub struct AgentJournalAnswers {
    questions: Arc<dyn JournalQuestions>,
    relay: Arc<JournalRelay>,
    presence: Arc<AgentPresence>,
    /// The ids of the questions carried (or being carried) and still in the store: each is
    /// carried once, and forgotten when its asker takes it away.
    carried: HashSet<String>,
    /// The questions being carried (they go with this reconciler).
    carrying: JoinSet<()>,
    triggers: Triggers,
}

impl AgentJournalAnswers {
    pub fn new(questions: Arc<dyn JournalQuestions>, relay: Arc<JournalRelay>, presence: Arc<AgentPresence>) -> Self {
        let triggers = Triggers::none().with(questions.every_journal_question_changes());
        Self { questions, relay, presence, carried: Default::default(), carrying: JoinSet::new(), triggers }
    }

    /// The questions to carry now: put to an agent held here and not carried yet. Forgets the
    /// questions no longer in the store.
    fn take_to_carry(&mut self, put: Vec<PutQuestion>) -> Vec<PutQuestion> {
        let carried = &mut self.carried;
        carried.retain(|id| put.iter().any(|question| &question.id == id));
        put.into_iter()
            .filter(|question| self.presence.knows(&question.machine))
            .filter(|question| carried.insert(question.id.clone()))
            .collect()
    }
}

impl Reconciler for AgentJournalAnswers {
    type Error = fleet_registry::RegistryError;
    const NAME: &'static str = "agents' journal answers";

    async fn pass(&mut self) -> Result<Next, Self::Error> {
        while self.carrying.try_join_next().is_some() {}
        // The store bounds the questions in flight in the whole cluster
        // (`fleet_core::journal_relay::MOST_IN_FLIGHT_IN_CLUSTER`), so these tasks are few.
        let questions = self.questions.clone();
        let put = questions.every_journal_question().await?;
        for put in self.take_to_carry(put) {
            let (questions, relay) = (self.questions.clone(), self.relay.clone());
            self.carrying.spawn(async move {
                let PutQuestion { machine, id, question } = put;
                let answer =
                    match relay.ask(&machine, &question.unit, question.lines, question.status, AGENT_WAIT).await {
                        Ok(Some(answer)) => answer,
                        // No answer in time: the asker says so.
                        Ok(None) => return,
                        Err(busy) => RelayedJournal::Failed { error: busy.to_string() },
                    };
                let answer = serde_json::to_vec(&answer).unwrap_or_default();
                if let Err(error) = questions.answer_journal(&machine, &id, &answer).await {
                    tracing::warn!(machine, %error, "cannot write a pull agent's journal answer");
                }
            });
        }
        Ok(Next::OnChange)
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}
