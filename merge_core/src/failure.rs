//! The merge's first failure by chunk position (`Failure`), shared by the
//! feeder (`merge_feeder.rs`) and the hasher (`merge.rs`).
//!
//! In a file of its own because both threads record into it and stop on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::errors::MergeError;

/// The first failure by chunk position, so the error reported does not
/// depend on thread timing: the lowest failing chunk wins.
pub(crate) struct Failure {
    abort: AtomicBool,
    first: Mutex<Option<(usize, MergeError)>>,
}

impl Failure {
    pub(crate) fn new() -> Self {
        Failure { abort: AtomicBool::new(false), first: Mutex::new(None) }
    }

    pub(crate) fn record(&self, position: usize, err: MergeError) {
        self.abort.store(true, Ordering::Release);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.as_ref().is_none_or(|(p, _)| position < *p) {
            *first = Some((position, err));
        }
    }

    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    pub(crate) fn take(&self) -> Option<MergeError> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take().map(|(_, e)| e)
    }
}
