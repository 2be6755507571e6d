//! Give freed heap memory back to the system once live sessions have gone.
//!
//! glibc's malloc keeps what a burst of sessions and event streams freed
//! in its arenas (one per thread that allocated), so the process's
//! resident memory stayed at its peak after they were evicted.
//! `malloc_trim` returns the free pages; elsewhere it is a no-op.

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
