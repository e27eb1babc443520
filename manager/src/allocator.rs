//! glibc malloc settings for the manager's allocation pattern (docs/BENCHMARKS.md, "Manager
//! memory"). A policy import allocates tens of MiB of short-lived pieces (request body, parse
//! trees, computed and encoded policies) between a few MiB of long-lived state, on whichever
//! thread runs the request; what stays resident afterwards is freed memory glibc cannot give
//! back, not live data.

/// Applies the settings, before any thread starts. An operator's own `MALLOC_ARENA_MAX` or
/// `MALLOC_MMAP_THRESHOLD_` (glibc's environment tunables) wins over the value chosen here.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    {
        // One arena: by default glibc gives each thread that contends for the heap its own
        // arena (up to 8 per core), and each arena keeps its own freed, fragmented pages. The
        // manager's allocating threads (2 tokio workers, sled's I/O threads, the trim thread)
        // rarely allocate at once on 2 cores, and small allocations are served from glibc's
        // per-thread cache without the arena lock. Measured at 250 endpoints / 1000 rules: the
        // same live heap (~10 MiB) in 14 arenas held ~1–2 MiB more resident than in one.
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            set(libc::M_ARENA_MAX, 1);
        }
        // A fixed mmap threshold: blocks of 128 KiB and more (request bodies, parse buffers,
        // batch key arrays) get their own mapping, returned to the kernel when freed. glibc's
        // default raises the threshold to the size of each such block freed, after which the
        // next ones are carved from the heap and leave holes between long-lived objects.
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            set(libc::M_MMAP_THRESHOLD, 128 * 1024);
        }
    }
}

#[cfg(target_env = "gnu")]
fn set(param: libc::c_int, value: libc::c_int) {
    // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
    if unsafe { libc::mallopt(param, value) } != 1 {
        tracing::warn!(
            param,
            value,
            "mallopt refused a setting; glibc defaults stay"
        );
    }
}

/// What the allocator holds (glibc's `mallinfo2`), for the trim thread's debug log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Bytes in live allocations from the arenas.
    pub in_use: usize,
    /// Free bytes kept in the arenas (resident or not).
    pub free: usize,
    /// Bytes in live allocations with their own mapping.
    pub mmapped: usize,
}

/// The allocator's current [`Usage`] (zero where glibc is not the allocator).
#[must_use]
pub fn usage() -> Usage {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        Usage {
            in_use: m.uordblks,
            free: m.fordblks,
            mmapped: m.hblkhd,
        }
    }
    #[cfg(not(target_env = "gnu"))]
    Usage::default()
}
