//! The sweep of silent pull agents, on a manager: an agent silent for `agent_ttl` gives up
//! its presence, and the cluster treats it as a lost machine (its units move), as it does an
//! etcd machine whose lease ran out. An agent that comes back announces itself again.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use crate::agent_presence::AgentPresence;
use fleet_runtime::{Next, Reconciler, Triggers};

/// How often the manager looks for agents gone silent.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

pub struct SilentAgentSweep {
    presence: Arc<AgentPresence>,
    registry: Arc<dyn fleet_registry::Registry>,
    triggers: Triggers,
}

impl SilentAgentSweep {
    pub fn new(presence: Arc<AgentPresence>, registry: Arc<dyn fleet_registry::Registry>) -> Self {
        Self { presence, registry, triggers: Triggers::none() }
    }
}

impl Reconciler for SilentAgentSweep {
    type Error = Infallible;
    const NAME: &'static str = "silent agent sweep";

    async fn pass(&mut self) -> Result<Next, Infallible> {
        for machine in self.presence.take_lost() {
            tracing::warn!(machine, "pull agent silent for agent_ttl: treating it as a lost machine");
            if let Err(error) = self.registry.unregister_machine(&machine).await {
                tracing::warn!(machine, %error, "cannot give up the pull agent's presence; trying again");
                // Its slot was freed just above, so it fits again.
                let _ = self.presence.heard(&machine);
            }
        }
        Ok(Next::After(SWEEP_EVERY))
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}
