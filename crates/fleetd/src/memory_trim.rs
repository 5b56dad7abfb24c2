//! Hands the memory freed after a burst back to the system. glibc keeps the pages of freed
//! allocations in its arenas: a manager whose 10,000 pull agents joined at once, then held only
//! their change streams (19 KiB of live heap an agent), kept 710 MiB of RSS for it; a
//! `malloc_trim` brought it to 409 MiB. Every [`TRIM_EVERY`], the free pages go back.

use std::convert::Infallible;
use std::time::Duration;

use fleet_runtime::{Next, Reconciler, Triggers};

/// How often free memory is handed back (a walk of the allocator's free lists: milliseconds).
const TRIM_EVERY: Duration = Duration::from_secs(60);

pub struct MemoryTrim {
    triggers: Triggers,
}

impl MemoryTrim {
    pub fn new() -> Self {
        Self { triggers: Triggers::none() }
    }
}

impl Reconciler for MemoryTrim {
    type Error = Infallible;
    const NAME: &'static str = "memory trim";

    async fn pass(&mut self) -> Result<Next, Infallible> {
        trim();
        Ok(Next::After(TRIM_EVERY))
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim takes no pointer; it only walks glibc's own free lists.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the trim hands back is measured by `bench-pull` (BENCHMARKS.md); here, that a pass
    /// runs and asks to come back a minute later.
    #[tokio::test]
    async fn a_pass_trims_and_comes_back_a_minute_later() {
        let next = MemoryTrim::new().pass().await;
        assert!(matches!(next, Ok(Next::After(every)) if every == TRIM_EVERY));
    }
}
