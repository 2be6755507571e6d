//! The repository names no directory of one particular machine: every path
//! in a tracked file is relative to the repository, a temporary directory,
//! or a standard system location.

use std::path::Path;
use std::process::Command;

/// Top directories (`/NAME/`) of home and work directories that exist on
/// one machine only (spelled without slashes so this file passes too).
const MACHINE_DIRS: [&str; 3] = ["work", "root", "home"];

/// Home directories inside the images the tests build (distroless'
/// nonroot user's, the curl image's user's): paths of an image, not of a
/// machine.
const IMAGE_HOMES: [&str; 2] = ["nonroot", "curl_user"];

#[test]
fn tracked_files_name_no_machine_directory() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo)
        .output()
        .expect("git lists the tracked files");
    assert!(out.status.success(), "git ls-files failed");
    let mut found = Vec::new();
    for file in out.stdout.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let file = String::from_utf8_lossy(file).into_owned();
        let Ok(text) = std::fs::read_to_string(repo.join(&file)) else {
            continue; // binary, or deleted in the work tree
        };
        for (n, line) in text.lines().enumerate() {
            // A machine directory starts a path: after a space, a quote, `=`
            // or the line's start, not inside a URL.
            for dir in MACHINE_DIRS.map(|d| format!("/{d}/")) {
                let hit = line.match_indices(&dir).any(|(i, _)| {
                    let rest = &line[i + dir.len()..];
                    let in_image = IMAGE_HOMES.iter().any(|h| {
                        rest.strip_prefix(h)
                            .is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric()))
                    });
                    !in_image
                        && (i == 0
                            || matches!(
                                line.as_bytes()[i - 1],
                                b' ' | b'"' | b'\'' | b'=' | b'`' | b'('
                            ))
                });
                if hit {
                    found.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "machine-specific paths (use a path relative to the repository):\n{}",
        found.join("\n")
    );
}
