//! Give freed heap memory back to the system once live sessions have gone.
//!
//! The binary allocates with jemalloc (`main.rs`), C code included
//! (SQLite, aws-lc): its `malloc` replaces glibc's. Everything here goes
//! through jemalloc's public interface (`mallctl` commands and the
//! `malloc_conf` options), so nothing depends on how it lays out its
//! memory. What kept the resident memory up after a burst of sessions and
//! event streams was evicted (measured with the memory bench), and what is
//! done about it:
//!
//! - each thread caches freed small objects (its tcache), and a cached
//!   object keeps its slab, and so its page, from being returned: without
//!   a flush, eviction ended 8 MiB (+32 %) over idle. Each runtime worker
//!   flushes its own cache when it next goes idle after a release
//!   (`thread.tcache.flush`, [`on_worker_park`]), then purges;
//! - freed pages stay in their arena ("dirty") until jemalloc purges them:
//!   its background threads do so within `dirty_decay_ms` ([`MALLOC_CONF`]),
//!   and after a sweep that evicted sessions [`release_freed_memory`]
//!   purges every arena at once (`arena.<all>.purge`);
//! - jemalloc describes each slab (the run of pages that holds objects of
//!   one size) with a record of its own, and keeps the records it made
//!   for good. An 8 KiB object gets a slab to itself by default, and an
//!   open event stream has two (hyper's read and write buffers), so 10,000
//!   streams left 2 MiB of records behind (+6 to +11 % over idle):
//!   `slab_sizes` in [`MALLOC_CONF`] puts sixteen in a slab.
//!
//! Elsewhere than Linux (where the binary keeps the system allocator) all
//! of it is a no-op.

/// jemalloc's options, read before `main` through the `malloc_conf` symbol
/// (`main.rs`); `MALLOC_CONF` in the environment can still override them.
///
/// - `background_thread:true`: purging happens on jemalloc's own threads
///   (at most one per core), not in the middle of a request;
/// - `percpu_arena:percpu`: one arena per core (jemalloc's default is
///   four), each used by the threads running on that core: fewer arenas
///   holding fragments of their own;
/// - `dirty_decay_ms:1000`, `muzzy_decay_ms:0`: freed pages go back to the
///   system within about a second, not jemalloc's ten, and for good
///   (`MADV_DONTNEED`), not lazily (`MADV_FREE` pages count as resident
///   until the kernel needs them);
/// - `slab_sizes:8192-8192:32`: objects of 8 KiB come in slabs of 32 pages
///   (16 objects), not of 2 (one): a slab record per 16 buffers instead
///   of one each. The option is in jemalloc's own tests and build help,
///   not in its manual; a jemalloc that did not know it would say so on
///   stderr at start and go on with its default (memory, not
///   correctness, would suffer; `arenas.bin.<i>.slab_size` shows it).
pub const MALLOC_CONF: &[u8] = b"background_thread:true,percpu_arena:percpu,\
dirty_decay_ms:1000,muzzy_decay_ms:0,slab_sizes:8192-8192:32\0";

/// Purge every arena now, and have every runtime worker flush its object
/// cache when it next goes idle.
pub fn release_freed_memory() {
    #[cfg(target_os = "linux")]
    {
        RELEASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        jemalloc::purge_all_arenas();
    }
}

/// The runtime's `on_thread_park` hook: after a release, flush this
/// worker's object cache and purge again. Otherwise one atomic load.
pub fn on_worker_park() {
    #[cfg(target_os = "linux")]
    {
        let releases = RELEASES.load(std::sync::atomic::Ordering::Relaxed);
        if SEEN.replace(releases) != releases {
            jemalloc::flush_thread_cache();
            jemalloc::purge_all_arenas();
        }
    }
}

/// How many releases were asked for, and the last one this thread acted on.
#[cfg(target_os = "linux")]
static RELEASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
#[cfg(target_os = "linux")]
thread_local! {
    static SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(target_os = "linux")]
mod jemalloc {
    /// `arena.<i>.purge` with `<i>` = `MALLCTL_ARENAS_ALL` (4096, from
    /// jemalloc.h): every arena's unused dirty pages go back to the system.
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    /// The calling thread's cached objects go back to their arenas.
    const FLUSH_TCACHE: &[u8] = b"thread.tcache.flush\0";

    pub fn purge_all_arenas() {
        command(PURGE_ALL);
    }

    pub fn flush_thread_cache() {
        command(FLUSH_TCACHE);
    }

    /// Run a `void` mallctl (no value read or written). A failure is not
    /// worth more than a debug line: the memory stays with the process.
    fn command(name: &'static [u8]) {
        debug_assert_eq!(name.last(), Some(&0));
        // SAFETY: mallctl is jemalloc's public control interface. `name` is
        // a NUL-terminated static string; a `void` command reads and
        // writes nothing, so every other pointer is null and the length 0,
        // as its manual requires.
        #[allow(unsafe_code)]
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 {
            tracing::debug!(
                mallctl = %String::from_utf8_lossy(&name[..name.len() - 1]),
                rc,
                "jemalloc refused a memory release"
            );
        }
    }
}
