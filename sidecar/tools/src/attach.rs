//! `attach-file`: a file the toolbox's sandbox allows, as media (agents-exe's
//! system toolbox capability). The path is taken from the working
//! directory, then canonicalized: the sandbox judges where the file really
//! is, so neither `..` nor a symlink leads out of it. Whatever the sandbox
//! says, `/proc` and `/sys` and the server's private files (those it read
//! credentials from, its SQLite store) are never read. The result is bounded by the media limit and, like every
//! medium, withheld whole when it holds a live secret.

use std::io::Read;
use std::path::Path;

use bindery_llm::content::MAX_MEDIA_BYTES;
use bindery_llm::Media;
use bindery_spec::sandbox::{lexical, FileSandbox};

/// agents-exe's `detectMediaType`: the media type of a file by its
/// extension (any case); `None` for one it does not attach.
pub fn media_type(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "mp3" => "audio/mp3",
        "wav" => "audio/wav",
        "ogg" => "audio/ogg",
        "aac" => "audio/aac",
        "flac" => "audio/flac",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mov" => "video/quicktime",
        "avi" => "video/avi",
        "pdf" => "application/pdf",
        "json" => "application/json",
        "xml" => "application/xml",
        "zip" => "application/zip",
        // agents-exe sends text files as opaque bytes.
        "txt" | "md" | "csv" => "application/octet-stream",
        _ => return None,
    })
}

/// Places never read, whatever a sandbox allows: the kernel's views of
/// processes (other tenants' environments and memory) and devices.
const NEVER: [&str; 2] = ["/proc", "/sys"];

/// Why a file is not attached; the `Display` text is what the model is
/// told. `file` is the path as the model gave it.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("`{file}` is not allowed: this toolbox has no file sandbox, so it attaches no file")]
    NoSandbox { file: String },
    /// It does not exist, or cannot be looked at.
    #[error("cannot attach `{file}`: {error}")]
    Unreachable { file: String, error: std::io::Error },
    /// The sandbox does not allow it, or it is a place never read.
    #[error("`{file}` is not allowed by this toolbox's file sandbox")]
    NotAllowed { file: String },
    #[error("`{file}` is not a regular file")]
    NotAFile { file: String },
    #[error("`{file}` has {bytes} bytes, more than the {max} this toolbox attaches")]
    TooBig { file: String, bytes: u64, max: u64 },
    /// `extension`: `.xyz`, or empty when it has none.
    #[error("`{file}`: unsupported file type `{extension}` (attach images, audio, video, PDF, JSON, XML, zip, txt, md or csv)")]
    Unsupported { file: String, extension: String },
    #[error("cannot read `{file}`: {error}")]
    Read { file: String, error: std::io::Error },
}

/// The file at `filepath` (from `cwd`) as media, or why not.
pub fn attach(
    sandbox: Option<&FileSandbox>,
    filepath: &str,
    cwd: &Path,
) -> Result<Media, AttachError> {
    let file = || filepath.to_string();
    let Some(sandbox) = sandbox else {
        return Err(AttachError::NoSandbox { file: file() });
    };
    let unreachable = |error| AttachError::Unreachable {
        file: file(),
        error,
    };
    let given = cwd.join(filepath);
    let canonical = std::fs::canonicalize(&given).map_err(unreachable)?;
    let denied = || AttachError::NotAllowed { file: file() };
    if NEVER.iter().any(|n| canonical.starts_with(n))
        || bindery_params::live::is_private_file(&canonical)
    {
        return Err(denied());
    }
    let meta = std::fs::metadata(&canonical).map_err(unreachable)?;
    if !meta.is_file() {
        return Err(AttachError::NotAFile { file: file() });
    }
    // Another name of a private file (a hard link) is the same file.
    if bindery_params::live::is_private_id(&meta) {
        return Err(denied());
    }
    // The predicate's own paths, from the same directory and canonical
    // where they exist, so a sandbox naming a symlinked directory works.
    let at = |p: &str| -> String {
        let abs = cwd.join(p);
        std::fs::canonicalize(&abs)
            .unwrap_or_else(|_| lexical(&abs))
            .display()
            .to_string()
    };
    if !sandbox
        .predicate
        .with_paths(&at)
        .allows(&canonical, meta.len(), cwd)
    {
        return Err(denied());
    }
    let max = sandbox
        .max_file_size
        .unwrap_or(u64::MAX)
        .min(MAX_MEDIA_BYTES as u64);
    let too_big = |bytes: u64| AttachError::TooBig {
        file: file(),
        bytes,
        max,
    };
    if meta.len() > max {
        return Err(too_big(meta.len()));
    }
    let mime = media_type(&canonical).ok_or_else(|| AttachError::Unsupported {
        file: file(),
        extension: canonical
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default(),
    })?;
    let opened = std::fs::File::open(&canonical).map_err(|error| AttachError::Read {
        file: file(),
        error,
    })?;
    // The name may have been given to a private file since it was judged.
    if opened
        .metadata()
        .is_ok_and(|m| bindery_params::live::is_private_id(&m))
    {
        return Err(denied());
    }
    let bytes = read_at_most(opened, max).map_err(|error| AttachError::Read {
        file: file(),
        error,
    })?;
    // The file may have grown since it was measured.
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(Media {
        mime: mime.to_string(),
        bytes,
    })
}

/// Up to `max + 1` bytes of the file (one more tells it grew past `max`).
fn read_at_most(file: std::fs::File, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sandbox(v: serde_json::Value) -> FileSandbox {
        serde_json::from_value(v).unwrap()
    }

    /// A directory `pics` holding a PNG, beside `secret` holding a file,
    /// with a symlink in `pics` leading to it.
    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("pics/sub")).unwrap();
        std::fs::create_dir(d.path().join("secret")).unwrap();
        std::fs::write(d.path().join("pics/a.png"), b"\x89PNG-a").unwrap();
        std::fs::write(d.path().join("pics/notes.xyz"), b"x").unwrap();
        std::fs::write(d.path().join("secret/b.png"), b"\x89PNG-b").unwrap();
        std::os::unix::fs::symlink(
            d.path().join("secret/b.png"),
            d.path().join("pics/link.png"),
        )
        .unwrap();
        d
    }

    #[test]
    fn the_sandbox_judges_the_canonical_path() {
        let d = tree();
        let s = sandbox(json!({"predicate": {"directoryRecursive": "pics"}}));
        let m = attach(Some(&s), "pics/a.png", d.path()).unwrap();
        assert_eq!(
            (m.mime.as_str(), m.bytes.as_slice()),
            ("image/png", &b"\x89PNG-a"[..])
        );
        // `..` back into the directory is fine; out of it is not.
        assert!(attach(Some(&s), "pics/sub/../a.png", d.path()).is_ok());
        let out = attach(Some(&s), "pics/../secret/b.png", d.path()).unwrap_err();
        assert!(matches!(out, AttachError::NotAllowed { .. }), "{out}");
        assert!(out.to_string().contains("not allowed"), "{out}");
        // A symlink inside leading outside is judged where it leads.
        let link = attach(Some(&s), "pics/link.png", d.path()).unwrap_err();
        assert!(matches!(link, AttachError::NotAllowed { .. }), "{link}");
        // An absolute path is judged alike.
        let abs = d.path().join("secret/b.png").display().to_string();
        assert!(attach(Some(&s), &abs, d.path()).is_err());
    }

    #[test]
    fn only_regular_files_of_known_types_within_the_size_are_attached() {
        let d = tree();
        let all = sandbox(json!({"predicate": "alwaysAllow", "maxFileSize": 5}));
        let dir = attach(Some(&all), "pics/sub", d.path()).unwrap_err();
        assert!(dir.to_string().contains("not a regular file"), "{dir}");
        let big = attach(Some(&all), "pics/a.png", d.path()).unwrap_err();
        assert!(
            matches!(
                big,
                AttachError::TooBig {
                    bytes: 6,
                    max: 5,
                    ..
                }
            ),
            "{big}"
        );
        assert!(big.to_string().contains("more than the 5"), "{big}");
        let odd = attach(Some(&all), "pics/notes.xyz", d.path()).unwrap_err();
        assert!(
            odd.to_string().contains("unsupported file type `.xyz`"),
            "{odd}"
        );
        let gone = attach(Some(&all), "pics/none.png", d.path()).unwrap_err();
        assert!(matches!(gone, AttachError::Unreachable { .. }), "{gone}");
        assert!(gone.to_string().contains("cannot attach"), "{gone}");
        // No sandbox: nothing (agents-exe's default).
        let none = attach(None, "pics/a.png", d.path()).unwrap_err();
        assert!(none.to_string().contains("no file sandbox"), "{none}");
    }

    #[test]
    fn proc_and_private_files_are_never_read() {
        let all = sandbox(json!({"predicate": "alwaysAllow"}));
        let e = attach(Some(&all), "/proc/self/environ", Path::new("/")).unwrap_err();
        assert!(matches!(e, AttachError::NotAllowed { .. }), "{e}");
        let d = tree();
        let key = d.path().join("pics/key.txt");
        std::fs::write(&key, "sk-CANARY").unwrap();
        assert!(attach(Some(&all), "pics/key.txt", d.path()).is_ok());
        bindery_params::live::private_file(&key);
        let e = attach(Some(&all), "pics/../pics/key.txt", d.path()).unwrap_err();
        assert!(matches!(e, AttachError::NotAllowed { .. }), "{e}");
        // Another name of it (a hard link) is the same file.
        std::fs::hard_link(&key, d.path().join("pics/other.txt")).unwrap();
        let e = attach(Some(&all), "pics/other.txt", d.path()).unwrap_err();
        assert!(matches!(e, AttachError::NotAllowed { .. }), "{e}");
    }

    #[test]
    fn media_types_follow_agents_exe() {
        assert_eq!(media_type(Path::new("a.PNG")), Some("image/png"));
        assert_eq!(media_type(Path::new("a.jpeg")), Some("image/jpeg"));
        assert_eq!(
            media_type(Path::new("a.md")),
            Some("application/octet-stream")
        );
        assert_eq!(media_type(Path::new("a.json")), Some("application/json"));
        assert_eq!(media_type(Path::new("a")), None);
        assert_eq!(media_type(Path::new("a.exe")), None);
    }
}
