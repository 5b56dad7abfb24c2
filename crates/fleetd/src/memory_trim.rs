//! Hands the memory freed after a burst back to the system. fleetd allocates through jemalloc
//! (`main.rs`): with glibc's allocator a manager whose 10,000 pull agents joined at once, then
//! held only their change streams, kept a third more RSS an agent for the same live heap, and
//! its agents and engine spent a fifth more CPU (docs/benchmark-history.md, issue 36). jemalloc returns
//! the pages of freed allocations on its own as the process allocates; an idle process
//! allocates little, so every [`TRIM_EVERY`] its arenas' unused pages are purged.

use std::convert::Infallible;
use std::time::Duration;

use fleet_runtime::{Next, Reconciler, Triggers};

/// How often free memory is handed back.
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
        if let Err(code) = purge() {
            tracing::debug!(code, "jemalloc refused to purge its arenas");
        }
        Ok(Next::After(TRIM_EVERY))
    }

    fn triggers(&mut self) -> &mut Triggers {
        &mut self.triggers
    }
}

/// Purges the unused pages of every jemalloc arena; the error code jemalloc answered if not.
fn purge() -> Result<(), i32> {
    // `MALLCTL_ARENAS_ALL` (4096) names every arena at once.
    const PURGE_ALL: &std::ffi::CStr = c"arena.4096.purge";
    // SAFETY: the name is a C string; a purge reads and writes no value, so every pointer
    // is null and the length 0, as jemalloc's mallctl asks of such a name.
    let code = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if code == 0 { Ok(()) } else { Err(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jemalloc's statistic `name` (a `size_t`), as of now.
    fn statistic(name: &std::ffi::CStr) -> usize {
        let mut epoch: u64 = 1;
        let mut value: usize = 0;
        let mut length = std::mem::size_of::<usize>();
        // SAFETY: C strings for names; `epoch` is written from a u64 (its type), and the
        // statistic read into a usize with its size given, as jemalloc documents both.
        unsafe {
            let epoch_ptr: *mut u64 = &mut epoch;
            assert_eq!(
                tikv_jemalloc_sys::mallctl(
                    c"epoch".as_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    epoch_ptr.cast(),
                    std::mem::size_of::<u64>(),
                ),
                0
            );
            let value_ptr: *mut usize = &mut value;
            assert_eq!(
                tikv_jemalloc_sys::mallctl(
                    name.as_ptr().cast(),
                    value_ptr.cast(),
                    &mut length,
                    std::ptr::null_mut(),
                    0
                ),
                0
            );
        }
        value
    }

    /// The pages of freed allocations stay with jemalloc until they decay (those of a huge one
    /// go back at once, so these are of a size it keeps); a pass hands them back at once, and
    /// asks to come back a minute later.
    #[tokio::test]
    async fn a_pass_hands_freed_pages_back_and_comes_back_a_minute_later() {
        const BLOCK: usize = 64 << 20;
        let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; BLOCK / 64]).collect();
        assert_eq!(blocks.iter().flatten().map(|byte| usize::from(*byte)).sum::<usize>(), BLOCK);
        drop(blocks);
        let held = statistic(c"stats.resident");
        let next = MemoryTrim::new().pass().await;
        assert!(matches!(next, Ok(Next::After(every)) if every == TRIM_EVERY));
        let after = statistic(c"stats.resident");
        assert!(held >= after + BLOCK / 2, "resident {held} bytes before the pass, {after} after");
    }
}
