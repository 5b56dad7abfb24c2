//! An entry of a copy, decoded once: a value read on every pass of a loop (a running
//! rollout's record of a megabyte, the states of the units it follows) is parsed once per
//! revision of its key, not once per read. A new revision is a new entry, with nothing
//! decoded yet.

use std::any::Any;
use std::sync::{Arc, OnceLock};

type Shared = Arc<dyn Any + Send + Sync>;

/// What an entry's value decoded to, kept beside it until the entry is replaced. A value
/// that did not decode keeps nothing (and is tried again: it is an error either way).
#[derive(Default)]
pub struct Decoded(OnceLock<Shared>);

impl Decoded {
    /// The value as `T`: `decode` runs until it succeeds once. A reader asking for another
    /// type than the first one did decodes afresh, uncached.
    pub fn get_or_decode<T: Any + Send + Sync, E>(&self, decode: impl Fn() -> Result<T, E>) -> Result<Arc<T>, E> {
        if let Some(kept) = self.0.get() {
            return match kept.clone().downcast::<T>() {
                Ok(value) => Ok(value),
                Err(_) => decode().map(Arc::new),
            };
        }
        let value = Arc::new(decode()?);
        // Two readers may decode at once: either result is the same value.
        let _ = self.0.set(value.clone());
        Ok(value)
    }
}

/// A copy of an entry starts with nothing decoded.
impl Clone for Decoded {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// What was decoded follows from the value: it never makes two entries differ.
impl PartialEq for Decoded {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Decoded {}

impl std::fmt::Debug for Decoded {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(if self.0.get().is_some() { "Decoded(kept)" } else { "Decoded(not yet)" })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_value_is_decoded_once_and_a_copy_starts_afresh() {
        let decodes = AtomicUsize::new(0);
        let decode = || {
            decodes.fetch_add(1, Ordering::Relaxed);
            Ok::<_, ()>(7_u32)
        };
        let kept = Decoded::default();
        assert_eq!(kept.get_or_decode(decode).as_deref(), Ok(&7));
        assert_eq!(kept.get_or_decode(decode).as_deref(), Ok(&7));
        assert_eq!(decodes.load(Ordering::Relaxed), 1);
        assert_eq!(kept.clone().get_or_decode(decode).as_deref(), Ok(&7));
        assert_eq!(decodes.load(Ordering::Relaxed), 2, "a clone decodes again");
    }

    #[test]
    fn another_type_is_decoded_uncached_and_a_failure_is_not_kept() {
        let kept = Decoded::default();
        assert_eq!(kept.get_or_decode(|| Ok::<_, ()>(7_u32)).as_deref(), Ok(&7));
        assert_eq!(kept.get_or_decode(|| Ok::<_, ()>("seven")).as_deref(), Ok(&"seven"));
        assert_eq!(kept.get_or_decode(|| Ok::<_, ()>(8_u32)).as_deref(), Ok(&7), "the first type stays");
        let failed = Decoded::default();
        assert_eq!(failed.get_or_decode(|| Err::<u32, _>("unreadable")), Err("unreadable"));
        assert_eq!(failed.get_or_decode(|| Err::<u32, _>("unreadable again")), Err("unreadable again"));
    }
}
