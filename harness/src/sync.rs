//! Locking that survives a poisoned mutex: corral never holds a lock across
//! a call that can panic, so the data behind a poisoned lock is consistent.

use std::sync::{Mutex, MutexGuard};

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
