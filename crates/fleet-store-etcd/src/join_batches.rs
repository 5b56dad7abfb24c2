//! Joins with a registration token, written together. A join counts one use of its token and
//! binds its machine ID to its key in one transaction, and a token is one key: sent one by
//! one, joins through the same token each compared that key's revision and most lost to
//! another join (10,000 agents through one token joined at about 350 a second, every loser
//! reading and trying again). Here joins are [`crate::written_together`]: the join whose
//! turn it is takes every join waiting (up to [`MOST_JOINS_A_TRANSACTION`]), admits each
//! against what the ones before it in the batch made of the token and the machine IDs, and
//! writes them all in one transaction on the same compares. A batch that loses (another fleetd wrote meanwhile) is
//! tried again whole against what the losing transaction read back. A token without a use
//! limit is only compared, its uses counted apart per writer ([`crate::registration_uses`]),
//! so several fleetds' batches through it do not race at all.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::EtcdRegistry;
use super::connection::replies_of;
use super::keys::Keys;
use super::records::one;
use super::registration_uses::{CountedUses, ListedToken, UseCounters, counted_apart, listed_tokens};
use fleet_registry::codec::{encode, find_registration};
use fleet_registry::machine_identity::admit_join;
use fleet_registry::{
    JoinRefused, MachineIdentity, RegistrationRecord, RegistrationRefused, RegistryError, Result, RevokedMachine,
};

/// What a join comes to: the token's record after it and the machine's identity, or why not.
pub type JoinOutcome = std::result::Result<(RegistrationRecord, MachineIdentity), JoinRefused>;

/// The most joins one transaction writes: each reads three keys, compares up to three and
/// writes one, and etcd takes at most 128 operations and 128 compares a transaction.
const MOST_JOINS_A_TRANSACTION: usize = 32;

/// How often a batch that lost a race with another fleetd's write is tried again.
const ATTEMPTS: usize = 100;

/// One join asked for.
#[derive(Clone, Debug)]
pub struct JoinRequest {
    pub token_sha256: String,
    pub now: u64,
    pub machine_id: String,
    pub key_sha256: String,
}

impl EtcdRegistry {
    /// Joins `request`, written with whatever other joins wait at the same time.
    pub(super) async fn join(&self, request: JoinRequest) -> Result<JoinOutcome> {
        let batches = &self.inner.join_batches;
        let write = |requests: Vec<JoinRequest>| {
            let registry = self.clone();
            async move { registry.write_joins(&requests).await }
        };
        batches.write(request, 1, MOST_JOINS_A_TRANSACTION, write).await
    }

    /// Admits and writes `requests` in one transaction, in order: each is admitted against
    /// the token's record and the machine's identity as the ones before it left them.
    async fn write_joins(&self, requests: &[JoinRequest]) -> Result<Vec<JoinOutcome>> {
        let keys = self.keys();
        let mut machines: Vec<&str> = requests.iter().map(|request| request.machine_id.as_str()).collect();
        machines.sort_unstable();
        machines.dedup();
        let uses_prefix = keys.all_registration_uses();
        let mut gets = vec![
            TxnOp::get(keys.registrations(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(uses_prefix.as_str(), Some(GetOptions::new().with_prefix())),
        ];
        for machine in &machines {
            gets.push(TxnOp::get(keys.identity(machine), None));
            gets.push(TxnOp::get(keys.revoked(machine), None));
            gets.push(TxnOp::get(keys.machine(machine), Some(GetOptions::new().with_keys_only())));
        }
        let (_, mut replies) = self.connection().small_read(gets.clone()).await?;
        for attempt in 0..ATTEMPTS {
            let [registrations, counters, per_machine @ ..] = replies.as_slice() else {
                return Err(RegistryError::Unavailable("etcd: a join's read came back short".into()));
            };
            if per_machine.len() != machines.len() * 3 {
                return Err(RegistryError::Unavailable("etcd: a join's read came back short".into()));
            }
            let counters = UseCounters::read(&uses_prefix, counters.kvs());
            let tokens = listed_tokens(registrations.kvs(), &counters);
            // Each machine's identity and revocation as read, with their mod revisions, and
            // its presence's (0: absent).
            let mut identities: HashMap<&str, (Option<MachineIdentity>, i64)> = HashMap::new();
            let mut revocations: HashMap<&str, (Option<RevokedMachine>, i64)> = HashMap::new();
            let mut presences: HashMap<&str, i64> = HashMap::new();
            for (machine, read) in machines.iter().zip(per_machine.chunks(3)) {
                identities.insert(machine, one(&keys.identity(machine), &read[0]));
                revocations.insert(machine, one(&keys.revoked(machine), &read[1]));
                presences.insert(machine, read[2].kvs().first().map_or(0, |kv| kv.mod_revision()));
            }

            // The tokens as the batch leaves them, by key: the record with every use counted
            // (on it or apart), the token as read, and this writer's counter when counted apart.
            let mut used: HashMap<String, UsedToken> = HashMap::new();
            let mut bound: HashMap<&str, MachineIdentity> = HashMap::new();
            let mut outcomes = Vec::with_capacity(requests.len());
            for request in requests {
                let Some((read, record)) = find_registration(tokens.clone(), &request.token_sha256) else {
                    outcomes.push(Err(JoinRefused::Token(RegistrationRefused::Unknown)));
                    continue;
                };
                let token = used
                    .entry(read.key.clone())
                    .or_insert_with(|| UsedToken::new(read, record, &counters, &self.inner.join_writer));
                let machine = request.machine_id.as_str();
                let identity = bound.get(machine).or(identities.get(machine).and_then(|(read, _)| read.as_ref()));
                let revoked = revocations.get(machine).and_then(|(read, _)| read.as_ref());
                let present = presences.get(machine).is_some_and(|revision| *revision != 0);
                match admit_join(&token.record, request.now, machine, &request.key_sha256, identity, revoked, present) {
                    Ok(identity) => {
                        token.count_one();
                        bound.insert(machine, identity.clone());
                        outcomes.push(Ok((token.record.clone(), identity)));
                    }
                    Err(refused) => outcomes.push(Err(refused)),
                }
            }
            if bound.is_empty() {
                return Ok(outcomes);
            }
            // Written only if nobody used a token, took an ID or revoked it meanwhile, and no
            // machine of an ID came alive (or went) meanwhile; a token's lease (its expiry)
            // stays.
            let mut compares = Vec::new();
            let mut writes = Vec::new();
            for token in used.values() {
                token.write(keys, &self.inner.join_writer, &mut compares, &mut writes);
            }
            for (machine, identity) in &bound {
                let (identity_key, revoked_key) = (keys.identity(machine), keys.revoked(machine));
                let identity_revision = identities.get(machine).map_or(0, |(_, revision)| *revision);
                let revoked_revision = revocations.get(machine).map_or(0, |(_, revision)| *revision);
                compares.push(Compare::mod_revision(identity_key.as_str(), CompareOp::Equal, identity_revision));
                compares.push(Compare::mod_revision(revoked_key.as_str(), CompareOp::Equal, revoked_revision));
                let presence_revision = presences.get(machine).copied().unwrap_or(0);
                compares.push(Compare::mod_revision(keys.machine(machine), CompareOp::Equal, presence_revision));
                writes.push(TxnOp::put(identity_key.as_str(), encode(identity), None));
            }
            // Refused, the transaction reads everything again, and the next attempt admits
            // against that: a lost race costs one request, not two.
            let answer =
                self.connection().txn(Txn::new().when(compares).and_then(writes).or_else(gets.clone())).await?;
            if answer.succeeded() {
                return Ok(outcomes);
            }
            replies = replies_of(answer).1;
            fleet_metrics::metrics().pull.join_races_lost.inc();
            // Another fleetd's joins through the same token: spread the next attempts out.
            let spread = u64::from(std::process::id()).wrapping_add(attempt as u64) % 7;
            tokio::time::sleep(Duration::from_millis(1 + spread)).await;
        }
        Err(RegistryError::Unavailable("etcd: the registration token kept changing; try again".into()))
    }
}

/// A token a batch uses.
struct UsedToken {
    read: ListedToken,
    /// The record with every use so far, counted on it or apart.
    record: RegistrationRecord,
    /// This writer's counter when the token's uses are counted apart, and its mod revision.
    own: Option<(CountedUses, i64)>,
}

impl UsedToken {
    /// `record` as listed, its uses counted on it and apart ([`listed_tokens`]).
    fn new(read: ListedToken, record: RegistrationRecord, counters: &UseCounters, writer: &str) -> Self {
        let own = counted_apart(&record).then(|| counters.own(&record.name, read.created, writer));
        Self { read, record, own }
    }

    fn count_one(&mut self) {
        self.record.uses = self.record.uses.saturating_add(1);
        if let Some((own, _)) = &mut self.own {
            own.uses = own.uses.saturating_add(1);
        }
    }

    /// What the batch compares and writes for this token: its record (counted on it), or
    /// this writer's counter, the record only compared (counted apart).
    fn write(&self, keys: &Keys, writer: &str, compares: &mut Vec<Compare>, writes: &mut Vec<TxnOp>) {
        let key = self.read.key.as_str();
        compares.push(Compare::mod_revision(key, CompareOp::Equal, self.read.revision));
        match &self.own {
            None => writes.push(TxnOp::put(key, encode(&self.record), Some(PutOptions::new().with_ignore_lease()))),
            Some((own, revision)) => {
                let counter = keys.registration_use_counter(&self.record.name, writer);
                compares.push(Compare::mod_revision(counter.as_str(), CompareOp::Equal, *revision));
                let lease = (self.read.lease != 0).then(|| PutOptions::new().with_lease(self.read.lease));
                writes.push(TxnOp::put(counter, encode(own), lease));
            }
        }
    }
}

#[cfg(test)]
mod tests;
