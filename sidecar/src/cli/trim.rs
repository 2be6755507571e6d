//! Give freed heap memory back to the system once live sessions have gone.
//!
//! glibc's malloc keeps what a burst of sessions and event streams freed
//! in its arenas, so the process's resident memory stayed at its peak
//! after they were evicted. Measured with the memory bench, three things
//! kept it there, one fix each:
//!
//! - freed pages sit in the arenas until `malloc_trim` returns them
//!   ([`release_freed_memory`], after a sweep that evicted sessions);
//! - freeing a large block (a grown map's table) raises glibc's trim
//!   threshold to twice its size, and a thread's arena keeps up to that
//!   much at its top, which `malloc_trim` leaves alone: [`configure`]
//!   fixes the thresholds at glibc's starting values;
//! - glibc makes up to eight arenas per core, each holding on to its own
//!   fragments: [`configure`] allows one per core.
//!
//! Elsewhere (musl, macOS) both are no-ops.

/// Set malloc's arena count and thresholds; call before starting threads.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let cores = i32::try_from(cores).unwrap_or(i32::MAX);
        // glibc's own starting values; setting them stops the adjustment.
        const THRESHOLD: i32 = 128 * 1024;
        // SAFETY: mallopt only sets the allocator's parameters, under its
        // own lock; it takes no pointer.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cores);
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
        }
    }
}

/// Return the heap's free pages to the system (glibc only).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim only walks and trims the allocator's own free
    // lists, under its own locks; it takes no pointer of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}
