//! Journal questions between etcd members: the asking fleetd puts a question under the asked
//! machine's prefix, under a short lease of its own; the machine, which follows that prefix,
//! writes its answer beside it under the same lease and takes the question away; the asker
//! reads the answer and revokes the lease, which takes whatever is left with it. An answer
//! stays in etcd's history until the next compaction, so what is relayed is bounded
//! (`fleet_core::journal_relay`): the API bounds each asker's rate and this fleetd's relays,
//! this store the questions in flight in the whole cluster and each answer's size.

use fleet_core::unpoisoned::Locked;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};
use fleet_core::journal_relay::MOST_IN_FLIGHT_IN_CLUSTER;
use fleet_registry::codec::{decode_listed, encode};
use fleet_registry::{
    ChangeSignal, JournalInbox, JournalQuestion, JournalQuestions, PutQuestion, RegistryError, Result,
};
use serde::{Deserialize, Serialize};

use super::EtcdRegistry;
use super::caches::Cache;
use super::keys::KeyRange;
use super::mirror::Mirror;
use super::session::{grant, revoke};

/// How long a question and its answer live at most (a crashed asker's are gone by then).
const QUESTION_LIFETIME: Duration = Duration::from_secs(30);
/// How often the asker looks for the answer.
const ANSWER_POLL: Duration = Duration::from_millis(100);
/// The largest answer written (the answering fleetd keeps its answer within it; an answer
/// past it, from a fleetd of another version, is replaced by an error).
const MOST_ANSWER_BYTES: usize = fleet_core::journal_relay::MOST_ANSWER_BYTES;

/// A question as stored: what is asked, and the lease the answer goes under.
#[derive(Clone, Serialize, Deserialize)]
struct Stored {
    question: JournalQuestion,
    lease: i64,
}

fn question_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 12];
    // A failing random source leaves zeros: questions then share an id, and the later one
    // waits for the earlier's answer, which names its unit.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[async_trait]
impl JournalInbox for EtcdRegistry {
    async fn journal_questions(&self, machine: &str) -> Result<Vec<(String, JournalQuestion)>> {
        let stored = self.questions_under(&self.keys().journal_questions(machine)).await?;
        Ok(stored.into_iter().map(|(id, stored)| (id, stored.question)).collect())
    }

    fn journal_question_changes(&self, machine: &str) -> ChangeSignal {
        self.question_changes(self.keys().journal_questions(machine))
    }

    async fn answer_journal(&self, machine: &str, id: &str, answer: &[u8]) -> Result<()> {
        let question_key = self.keys().journal_question(machine, id);
        let reply = self.connection().get(&question_key, None).await?;
        let Some(stored) = reply.kvs().first().and_then(|kv| decode_listed::<Stored>(&question_key, kv.value())) else {
            return Ok(());
        };
        let too_large;
        let answer = if answer.len() > MOST_ANSWER_BYTES {
            too_large = format!(r#"{{"error":"its answer was larger than {MOST_ANSWER_BYTES} bytes"}}"#).into_bytes();
            &too_large
        } else {
            answer
        };
        let txn = Txn::new().and_then([
            TxnOp::put(
                self.keys().journal_answer(id),
                answer.to_vec(),
                Some(PutOptions::new().with_lease(stored.lease)),
            ),
            TxnOp::delete(question_key, None),
        ]);
        // The asker may have given up (its lease gone): then nothing is written.
        let _ = self.connection().txn(txn).await;
        Ok(())
    }
}

#[async_trait]
impl JournalQuestions for EtcdRegistry {
    async fn ask_journal(&self, machine: &str, question: &JournalQuestion, wait: Duration) -> Result<Option<Vec<u8>>> {
        let connection = self.connection();
        let all = self.keys().all_journal_questions();
        let asked = connection.get(&all, Some(GetOptions::new().with_prefix().with_count_only())).await?;
        if usize::try_from(asked.count()).unwrap_or(usize::MAX) >= MOST_IN_FLIGHT_IN_CLUSTER {
            return Err(RegistryError::Unavailable(format!(
                "the cluster has {MOST_IN_FLIGHT_IN_CLUSTER} journal questions in flight already; try again shortly"
            )));
        }
        let lease = grant(connection, QUESTION_LIFETIME).await?;
        let id = question_id();
        let stored = Stored { question: question.clone(), lease };
        let asked =
            connection.write(&[(self.keys().journal_question(machine, &id), Some(encode(&stored)))], lease).await;
        if let Err(error) = asked {
            let _ = revoke(connection, lease).await;
            return Err(error);
        }
        let answer_key = self.keys().journal_answer(&id);
        let deadline = tokio::time::Instant::now() + wait;
        let answer = loop {
            match connection.get(&answer_key, None).await {
                Ok(reply) if !reply.kvs().is_empty() => break reply.kvs().first().map(|kv| kv.value().to_vec()),
                Ok(_) | Err(_) if tokio::time::Instant::now() >= deadline => break None,
                Ok(_) | Err(_) => tokio::time::sleep(ANSWER_POLL).await,
            }
        };
        // The question, and any answer, go with the lease.
        let _ = revoke(connection, lease).await;
        Ok(answer)
    }

    async fn every_journal_question(&self) -> Result<Vec<PutQuestion>> {
        let stored = self.questions_under(&self.keys().all_journal_questions()).await?;
        Ok(stored
            .into_iter()
            .filter_map(|(key, stored)| {
                let (machine, id) = key.split_once('/')?;
                Some(PutQuestion { machine: machine.to_string(), id: id.to_string(), question: stored.question })
            })
            .collect())
    }

    fn every_journal_question_changes(&self) -> ChangeSignal {
        self.question_changes(self.keys().all_journal_questions())
    }
}

impl EtcdRegistry {
    /// The questions under `prefix` by the rest of their key: from the watch-fed copy that
    /// wakes their answerer while its watch is up (a question already answered may show
    /// there a moment longer; its answer then finds it gone and writes nothing), else from
    /// etcd.
    async fn questions_under(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        {
            let mirrors = self.inner.question_caches.locked();
            if let Some(mirror) = mirrors.get(prefix) {
                let data = mirror.read();
                if data.synced && data.streaming {
                    return Ok(data
                        .range(&KeyRange::prefix(prefix.to_string()))
                        .filter_map(|(key, entry)| {
                            let stored = entry.decoded_listed::<Stored>(key)?;
                            Some((key[prefix.len()..].to_string(), stored.as_ref().clone()))
                        })
                        .collect());
                }
            }
        }
        self.list_keyed(prefix).await
    }

    /// Moves when a question may have been put under `prefix`: one watch per prefix followed.
    fn question_changes(&self, prefix: String) -> ChangeSignal {
        let mut mirrors = self.inner.question_caches.locked();
        let held = mirrors.entry(prefix.clone()).or_insert_with(|| {
            let range = KeyRange::prefix(prefix.clone());
            let start = || Mirror::start(self.connection().clone(), vec![range]);
            self.inner.caches.hold(Cache::Questions(prefix), Duration::ZERO, start)
        });
        held.changes()
    }
}
