//! Pull agents' presences taken over together. An agent that comes to this manager has its
//! presence (and the states it reported before, wherever it was) written under this
//! manager's agents' lease: one read of its states and one write, two etcd requests an agent.
//! When thousands arrive at once (a manager started, another lost, a cluster of agents
//! booting), those requests starved etcd (the 100,000-agent run's announce phase). Here the
//! take-overs waiting at the same time ([`crate::written_together`]) read every agent's states
//! in one transaction and write every presence in as few as etcd allows.

use std::collections::BTreeMap;

use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};

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
        let mut ops = Vec::new();
        let mut taken: Vec<(MachineState, BTreeMap<String, Vec<u8>>)> = Vec::with_capacity(latest.len());
        for (machine, reply) in latest.into_values().zip(replies) {
            let states: BTreeMap<String, Vec<u8>> = reply
                .kvs()
                .iter()
                .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec()))
                .collect();
            ops.push(TxnOp::put(keys.machine(&machine.id), encode(&machine), with_lease()));
            ops.extend(states.iter().map(|(key, value)| TxnOp::put(key.as_str(), value.clone(), with_lease())));
            taken.push((machine, states));
        }
        for chunk in ops.chunks(MAX_TXN_OPS) {
            let written = self.connection().txn(Txn::new().and_then(chunk.to_vec())).await;
            self.noting_agent_lease(lease, written)?;
        }
        for (machine, states) in taken {
            self.start_session(&machine, lease, states, false, sent);
        }
        Ok(vec![(); count])
    }
}
