//! Locks taken whatever became of an earlier holder. A lock is poisoned when a thread panicked
//! while holding it; fleet keeps what its locks guard consistent at every point a holder could
//! stop, so a poisoned lock's data is as good as any, and the one way to take a lock in fleet
//! is to go on with it (one place, instead of the same recovery written at every lock).

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`], going on past a poisoning.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], going on past a poisoning.
pub trait ReadWriteLocked<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWriteLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken_with_its_data() {
        let shared = std::sync::Arc::new((Mutex::new(1), RwLock::new(2)));
        let poisoner = shared.clone();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _mutex = poisoner.0.lock();
            let _write = poisoner.1.write();
            panic!("poisoning both");
        }));
        assert!(shared.0.is_poisoned() && shared.1.is_poisoned());
        *shared.0.locked() += 1;
        *shared.1.write_locked() += 1;
        assert_eq!((*shared.0.locked(), *shared.1.read_locked()), (2, 3));
    }
}
