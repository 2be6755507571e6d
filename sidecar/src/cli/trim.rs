//! Give freed heap memory back to the system once live sessions have gone.
//!
//! glibc's malloc keeps what a burst of sessions and event streams freed
//! in its arenas, so the process's resident memory stayed at its peak
//! after they were evicted. Measured with the memory bench, four things
//! kept it there, one fix each:
//!
//! - freed pages sit in the arenas until `malloc_trim` returns them
//!   ([`release_freed_memory`], after a sweep that evicted sessions);
//! - freeing a large block (a grown map's table) raises glibc's trim
//!   threshold to twice its size, and a thread's arena keeps up to that
//!   much at its top, which `malloc_trim` leaves alone: [`configure`]
//!   fixes the thresholds at glibc's starting values;
//! - glibc makes up to eight arenas per core, each holding on to its own
//!   fragments: [`configure`] allows one per core;
//! - each thread keeps a cache of up to seven freed chunks of each small
//!   size (glibc's tcache), outside the arena: after a burst they lie
//!   scattered over the heap, and each keeps the free pages around it from
//!   coalescing, so `malloc_trim` cannot return them (about 3 MiB with two
//!   runtime workers). Turning the cache off returns them, but costs a
//!   round trip 1.5 ms. Instead, each worker renews its own cache when it
//!   next goes idle after a release ([`on_worker_park`]): it takes the
//!   scattered chunks out, fills the cache with fresh ones, then frees the
//!   scattered ones into the arena, where they coalesce and are trimmed.
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

/// Return the heap's free pages to the system (glibc only), and have every
/// runtime worker renew its chunk cache when it next goes idle.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        RELEASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        glibc::trim();
    }
}

/// The runtime's `on_thread_park` hook: after a release, renew this
/// worker's chunk cache and trim again. Otherwise one atomic load.
pub fn on_worker_park() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let releases = RELEASES.load(std::sync::atomic::Ordering::Relaxed);
        if SEEN.replace(releases) != releases {
            glibc::renew_thread_cache();
            glibc::trim();
        }
    }
}

/// How many releases were asked for, and the last one this thread acted on.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static RELEASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
#[cfg(all(target_os = "linux", target_env = "gnu"))]
thread_local! {
    static SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod glibc {
    /// The thread cache's bins: chunk sizes 32 to 1040 bytes, 16 apart
    /// (64-bit glibc), each holding up to 7 chunks.
    const BINS: usize = 64;
    const PER_BIN: usize = 7;

    /// A request served from bin `i`: its largest usable size.
    fn request_size(i: usize) -> usize {
        24 + 16 * i
    }

    pub fn trim() {
        // SAFETY: malloc_trim only walks and trims the allocator's own free
        // lists, under its own locks; it takes no pointer of ours.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Swap the chunks this thread's cache holds for fresh ones.
    pub fn renew_thread_cache() {
        let mut cached = Vec::with_capacity(BINS * PER_BIN);
        let mut fresh = Vec::with_capacity(BINS * PER_BIN);
        // SAFETY: plain malloc/free pairs: every pointer malloc returns is
        // freed exactly once, below, and never read or written.
        unsafe {
            // The cache serves each bin's requests first: these empty it.
            for i in 0..BINS {
                for _ in 0..PER_BIN {
                    cached.push(libc::malloc(request_size(i)));
                }
            }
            // With the cache empty, these come from the arena: from its
            // free lists or its top, where the live chunks are.
            for i in 0..BINS {
                for _ in 0..PER_BIN {
                    fresh.push(libc::malloc(request_size(i)));
                }
            }
            // Freed first, the fresh chunks fill the cache; the cache full,
            // the scattered ones go back to the arena and coalesce.
            for p in fresh.into_iter().chain(cached) {
                libc::free(p);
            }
        }
    }
}
