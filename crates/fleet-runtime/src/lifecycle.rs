//! What fleetd wants its components to do.

/// What fleetd wants its components to do; every reconciler runs while it is `Running`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Running,
    /// Stop this instance but leave the units running: a new one takes over.
    Reloading,
    /// Stop the units and leave the cluster.
    ShuttingDown,
}
