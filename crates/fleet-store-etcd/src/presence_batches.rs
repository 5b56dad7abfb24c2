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
use super::connection::MAX_TXN_OPS;
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
        // Transactions of at most MAX_TXN_OPS writes in all, however they nest.
        let mut txns: Vec<(usize, Vec<TxnOp>)> = Vec::new();
        let mut add = |weight: usize, ops: Vec<TxnOp>| match txns.last_mut() {
            Some((held, last)) if *held + weight <= MAX_TXN_OPS => {
                *held += weight;
                last.extend(ops);
            }
            _ => txns.push((weight, ops)),
        };
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
            if writes.len() > MAX_TXN_OPS {
                // More than one transaction holds: written whatever holds them now.
                for chunk in writes.chunks(MAX_TXN_OPS) {
                    add(chunk.len(), chunk.to_vec());
                }
            } else {
                // Held so already (under the lease a restarted manager took back): written
                // again, they would cost the store a write and wake its readers for nothing.
                let held = [
                    Compare::lease(machine_key.as_str(), CompareOp::Equal, lease),
                    Compare::value(machine_key.as_str(), CompareOp::Equal, record),
                ];
                add(writes.len(), vec![TxnOp::txn(Txn::new().when(held).or_else(writes))]);
            }
            taken.push((machine, states));
        }
        for (_, ops) in txns {
            let written = self.connection().txn(Txn::new().and_then(ops)).await;
            self.noting_agent_lease(lease, written)?;
        }
        for (machine, states) in taken {
            self.start_session(&machine, lease, states, false, sent);
        }
        Ok(vec![(); count])
    }
}
