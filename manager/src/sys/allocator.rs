//! The manager's allocator: jemalloc, linked in place of glibc's malloc for the whole process
//! (docs/BENCHMARKS.md, "Manager memory"). A policy import allocates tens of MiB of short-lived
//! pieces (request body, parse trees, computed and encoded policies) between a few MiB of
//! long-lived state. glibc kept ~5 MiB of the freed pieces resident between live objects, which
//! no `malloc_trim` could return; jemalloc's size-segregated pages are returned as soon as they
//! are empty. Its options for the daemon are in `bin/weft-manager.rs` (`malloc_conf`).

// Linked unprefixed: jemalloc's `malloc` and friends are the process's, also for C code.
use tikv_jemalloc_sys as _;

/// Returns every arena's unused dirty pages to the kernel now, whatever decay an operator's
/// `MALLOC_CONF` configured (the daemon's own options purge at once, so this is then cheap).
pub fn purge() {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena.
    let name = c"arena.4096.purge";
    // SAFETY: a documented mallctl that takes and returns nothing.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        tracing::debug!(rc, "jemalloc refused to purge");
    }
}
