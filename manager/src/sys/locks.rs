//! Mutex access that survives a poisoned lock.
//!
//! A mutex is poisoned when a thread panicked while holding it. The manager's locks guard plain
//! data (maps, flags, caches) whose every update is a single assignment or insert, so the data is
//! still consistent after such a panic; a panic in one thread (a watcher, a background task) must
//! not turn every later API call into a second panic and take the whole API down. So we take the
//! guard back instead of unwrapping.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Locks `m`, recovering the guard if another thread panicked while holding it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`Condvar::wait_timeout_while`] that recovers a poisoned guard the same way as [`lock`].
pub fn wait_timeout_while<'a, T, F>(
    cvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
    condition: F,
) -> MutexGuard<'a, T>
where
    F: FnMut(&mut T) -> bool,
{
    match cvar.wait_timeout_while(guard, timeout, condition) {
        Ok((g, _)) => g,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_panic_under_the_lock_does_not_poison_later_callers() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let joined = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("boom under the lock");
        })
        .join();
        assert!(joined.is_err());
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }

    #[test]
    fn wait_recovers_a_poisoned_guard() {
        let m = Arc::new(Mutex::new(false));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = true;
            panic!("boom");
        })
        .join();
        let cvar = Condvar::new();
        let g = wait_timeout_while(&cvar, lock(&m), Duration::from_millis(1), |v| !*v);
        assert!(*g);
    }
}
