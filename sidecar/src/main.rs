fn main() -> std::process::ExitCode {
    bindery_sidecar::cli::main()
}

/// The server's allocator: jemalloc, whose memory release is public API
/// (`cli/memory.rs` says why and how it is used).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options ([`bindery_sidecar::cli::MALLOC_CONF`]), which it
/// reads through this symbol before `main`.
// SAFETY: `malloc_conf` is jemalloc's documented way for a program to set
// its options: an exported `const char *` naming a NUL-terminated string,
// which it only reads. This one points to a static copy of MALLOC_CONF
// (whose last byte is its NUL), never written.
#[cfg(target_os = "linux")]
#[allow(unsafe_code, non_upper_case_globals)]
#[no_mangle]
pub static malloc_conf: Option<&'static std::ffi::c_char> = Some(&CONF[0]);

#[cfg(target_os = "linux")]
static CONF: [std::ffi::c_char; bindery_sidecar::cli::MALLOC_CONF.len()] =
    c_chars(bindery_sidecar::cli::MALLOC_CONF);

/// A byte string as C's `char`s (signed on some platforms, unsigned on others).
#[cfg(target_os = "linux")]
const fn c_chars<const N: usize>(bytes: &[u8]) -> [std::ffi::c_char; N] {
    let mut out = [0; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i] as std::ffi::c_char;
        i += 1;
    }
    out
}
