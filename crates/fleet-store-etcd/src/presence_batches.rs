//! Pull agents' presences taken over together. An agent that comes to this manager has its
//! presence (and the states it reported before, wherever it was) written under this
//! manager's agents' lease: one read of its states and one write, two etcd requests an agent
//! (the write only where they do not hang on that lease already: a manager restarted on the
//! lease it held writes nothing for the agents that come back to it).
//! When thousands arrive at once (a manager started, another lost, a cluster of agents
//! booting), those requests starved etcd (the 100,000-agent run's announce phase). Here the
//! take-overs waiting at the same time ([`crate::written_together`]) read every agent's states
//! in one transaction and write every presence in as few as etcd allows.

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::EtcdRegistry;
use super::connection::{MAX_TXN_OPS, NESTED_PER_TXN};
use fleet_core::MachineState;
use fleet_registry::codec::encode;
use fleet_registry::{RegistryError, Result};

/// The most agents taken over together: one read each in the first transaction.
const MOST_AGENTS_A_BATCH: usize = MAX_TXN_OPS;

impl EtcdRegistry {
    /// Holds a pull agent's presence for it: the machine's record and the unit states it
    /// reported moved under this manager's lease for its agents (whichever manager held them
    /// before), written with whatever other take-overs wait at the same time. This fleetd's
    /// own lease record is left alone.
    pub(super) async fn take_over_session(&self, machine: &MachineState) -> Result<()> {
        let batches = &self.inner.presence_batches;
        let write = |machines: Vec<MachineState>| {
            let registry = self.clone();
            async move { registry.take_over_sessions(machines).await }
        };
        batches.write(machine.clone(), 1, MOST_AGENTS_A_BATCH, write).await
    }

    /// Takes over `machines` together: their states read in one transaction, their
    /// presences and states written in as few as fit. An agent given twice is taken over once,
    /// as it was last given.
    async fn take_over_sessions(&self, machines: Vec<MachineState>) -> Result<Vec<()>> {
        let count = machines.len();
        let sent = tokio::time::Instant::now();
        let lease = self.agent_lease().await?;
        let keys = self.keys();
        let mut latest: BTreeMap<String, MachineState> = BTreeMap::new();
        for machine in machines {
            latest.insert(machine.id.clone(), machine);
        }
        let gets: Vec<TxnOp> =
            latest.keys().map(|id| TxnOp::get(keys.state(id, ""), Some(GetOptions::new().with_prefix()))).collect();
        let (_, replies) = self.connection().small_read(gets).await?;
        if replies.len() != latest.len() {
            return Err(RegistryError::Unavailable("etcd: a read of agents' states came back short".into()));
        }
        let with_lease = || Some(PutOptions::new().with_lease(lease));
        let mut txns: Vec<Filling> = vec![Filling::default()];
        let mut taken: Vec<(MachineState, BTreeMap<String, Vec<u8>>)> = Vec::with_capacity(latest.len());
        for (machine, reply) in latest.into_values().zip(replies) {
            let states: BTreeMap<String, Vec<u8>> = reply
                .kvs()
                .iter()
                .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec()))
                .collect();
            let (machine_key, record) = (keys.machine(&machine.id), encode(&machine));
            let mut writes = vec![TxnOp::put(machine_key.as_str(), record.clone(), with_lease())];
            writes.extend(states.iter().map(|(key, value)| TxnOp::put(key.as_str(), value.clone(), with_lease())));
            if writes.len() > NESTED_PER_TXN {
                // Too many to write on a condition: written whatever holds them now.
                txns.extend(writes.chunks(MAX_TXN_OPS).map(|chunk| Filling::plain(chunk.to_vec())));
            } else {
                // Held so already (under the lease a restarted manager took back): written
                // again, they would cost the store a write and wake its readers for nothing.
                let held = [
                    Compare::lease(machine_key.as_str(), CompareOp::Equal, lease),
                    Compare::value(machine_key.as_str(), CompareOp::Equal, record),
                ];
                let (count, inner) = (writes.len(), writes.len().max(held.len()));
                let nested = TxnOp::txn(Txn::new().when(held).or_else(writes));
                if !txns.last().is_some_and(|last| last.fits(count, inner)) {
                    txns.push(Filling::default());
                }
                if let Some(last) = txns.last_mut() {
                    last.add(nested, count, inner);
                }
            }
            taken.push((machine, states));
        }
        for filled in txns.into_iter().filter(|filled| !filled.ops.is_empty()) {
            let written = self.connection().txn(Txn::new().and_then(filled.ops)).await;
            self.noting_agent_lease(lease, written)?;
        }
        for (machine, states) in taken {
            self.start_session(&machine, lease, states, false, sent);
        }
        Ok(vec![(); count])
    }
}

/// A transaction being filled with agents' take-overs: at most [`MAX_TXN_OPS`] writes in all
/// (as many as one flat transaction holds), and within etcd's rule for nesting, which allows a
/// nested transaction only the operations its parent leaves unused of `--max-txn-ops`.
#[derive(Default)]
struct Filling {
    ops: Vec<TxnOp>,
    writes: usize,
    /// The most operations one of its nested transactions holds (compares or writes).
    nested_most: usize,
}

impl Filling {
    fn plain(ops: Vec<TxnOp>) -> Self {
        Self { writes: ops.len(), ops, nested_most: 0 }
    }

    /// Whether a nested transaction of `writes` writes, holding `inner` operations, fits.
    fn fits(&self, writes: usize, inner: usize) -> bool {
        self.writes + writes <= MAX_TXN_OPS && self.ops.len() + 1 + self.nested_most.max(inner) <= MAX_TXN_OPS
    }

    fn add(&mut self, nested: TxnOp, writes: usize, inner: usize) {
        self.ops.push(nested);
        self.writes += writes;
        self.nested_most = self.nested_most.max(inner);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use etcd_client::GetOptions;
    use fleet_registry::{AgentRegistry, StateReport};
    use fleet_testkit::EtcdServer;

    use super::MOST_AGENTS_A_BATCH;
    use crate::EtcdRegistry;
    use crate::agent_lease::tests::running;
    use crate::tests::{machine, registry};

    async fn leases_under(registry: &EtcdRegistry, prefix: &str) -> Vec<i64> {
        let options = GetOptions::new().with_prefix().with_keys_only();
        let reply = registry.connection().get(prefix, Some(options)).await.unwrap();
        reply.kvs().iter().map(|kv| kv.lease()).collect()
    }

    /// The most agents a batch holds, first with nothing reported (one write each), then with
    /// ten states each, are taken over in transactions etcd accepts: a nested transaction may
    /// hold only the operations its parent leaves unused (a batch of 128 conditional writes
    /// was refused whole, and each of its agents told to try again).
    #[tokio::test]
    async fn a_full_batch_of_agents_is_taken_over_within_etcds_limits() {
        let etcd = EtcdServer::start();
        let first = registry(&etcd, Duration::from_secs(30)).await;
        let machines: Vec<_> = (0..MOST_AGENTS_A_BATCH).map(|index| machine(&format!("agent{index:03}"))).collect();
        first.take_over_sessions(machines.clone()).await.unwrap();
        assert_eq!(leases_under(&first, "/fleet-test/machines/").await.len(), MOST_AGENTS_A_BATCH);
        for agent in &machines {
            let reports: Vec<StateReport> =
                (0..10).map(|unit| running(&agent.id, &format!("u{unit}.service"))).collect();
            first.report_states(&agent.id, &reports).await.unwrap();
        }
        let second = registry(&etcd, Duration::from_secs(30)).await;
        second.take_over_sessions(machines).await.unwrap();
        let lease = second.agent_lease().await.unwrap();
        let held =
            [leases_under(&second, "/fleet-test/machines/").await, leases_under(&second, "/fleet-test/states/").await];
        assert_eq!((held[0].len(), held[1].len()), (MOST_AGENTS_A_BATCH, MOST_AGENTS_A_BATCH * 10));
        assert!(held.iter().flatten().all(|held| *held == lease), "every presence and state under the new lease");
    }
}
