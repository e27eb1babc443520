//! Giving freed memory back to the kernel after large regenerations and store writes, on a
//! background thread of its own.

/// Hands memory freed by a large regeneration back to the kernel. Computing and encoding the
/// policies of hundreds of endpoints allocates hundreds of MiB in small pieces that glibc kept
/// cached afterwards (~130 MiB RSS at 250 endpoints and 1000 rules without a trim, ~65 MiB with
/// it; docs/BENCHMARKS.md). jemalloc with the daemon's options returns empty pages at once; this
/// purge covers an operator's `MALLOC_CONF` that delays it.
///
/// The trim right away is not enough after a large store write: sled frees the tree nodes a
/// batch superseded through epoch-based reclamation, seconds later, on its own threads. After
/// deleting 50 000 rules the live heap is ~5 MiB but ~150 MiB of those late frees stayed
/// resident (docs/BENCHMARKS.md "Memory after a large delete"), so a background thread trims
/// again on [`LATE_TRIMS`]' schedule, restarted by every new request.
///
/// Every trim runs on that thread, never on the request's: a trim of a large heap takes
/// milliseconds, which a one-rule import (≤ 10 ms, issue #10) cannot afford to wait for.
pub(crate) fn release_freed_memory() {
    if !TRIMMER.request() {
        trim_now(); // no thread: trim here rather than never
    }
}

/// Pauses before each follow-up trim: trims at 0, 0.5, 1.5, 3.5 and 7.5 s after the last
/// request.
const LATE_TRIMS: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(4),
];

fn trim_now() {
    let t0 = std::time::Instant::now();
    crate::sys::allocator::purge();
    tracing::debug!(us = t0.elapsed().as_micros(), "freed memory released");
}

/// The trim thread's mailbox: a request counter it waits on.
struct Trimmer {
    requests: std::sync::Mutex<u64>,
    wake: std::sync::Condvar,
    started: std::sync::OnceLock<bool>,
}

static TRIMMER: Trimmer = Trimmer {
    requests: std::sync::Mutex::new(0),
    wake: std::sync::Condvar::new(),
    started: std::sync::OnceLock::new(),
};

impl Trimmer {
    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the thread for a trim now and the late ones after; false when it cannot run.
    fn request(&'static self) -> bool {
        *self.lock() += 1;
        self.wake.notify_one();
        *self.started.get_or_init(|| {
            std::thread::Builder::new()
                .name("trim".into())
                .spawn(move || self.run())
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "cannot start the trim thread; trimming inline");
                })
                .is_ok()
        })
    }

    fn run(&self) {
        let mut seen = 0;
        loop {
            let mut n = self.lock();
            while *n == seen {
                n = self
                    .wake
                    .wait(n)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            seen = *n;
            drop(n);
            trim_now();
            for delay in LATE_TRIMS {
                let n = self.lock();
                let (n, _) = self
                    .wake
                    .wait_timeout_while(n, delay, |n| *n == seen)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if *n != seen {
                    break; // a new request: trim at once and start the schedule over
                }
                drop(n);
                trim_now();
            }
        }
    }
}
