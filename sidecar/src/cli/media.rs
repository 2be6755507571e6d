//! `run -m/--media [MIME;]PATH`: files sent with the prompt, as agents-exe
//! sends them: the user message becomes `[{"type": "text", …}, image_url
//! | file …]`.

use std::io::Read;
use std::path::Path;

use bindery_llm::content::{is_media_type, MAX_MEDIA_BYTES};
use bindery_llm::{Content, ContentPart, Media};

/// Why the file a `-m` names is not sent: the argument as given, and what
/// is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("-m {arg:?}: {problem}")]
pub(super) struct MediaError {
    pub arg: String,
    pub problem: MediaProblem,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum MediaProblem {
    #[error("a media type but no file; write -m MIME;PATH or -m PATH")]
    NoFile,
    #[error("{given:?} is not a media type (type/subtype, e.g. image/png)")]
    NotAType { given: String },
    #[error("cannot tell the media type of {path} from its extension; give it as -m 'MIME;{path}' (e.g. image/png;{path})")]
    UnknownExtension { path: String },
    #[error("{path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the files of -m may hold {MAX_MEDIA_BYTES} bytes together, and {path} takes them past it; send a smaller file")]
    TooLarge { path: String },
    #[error(
        "{mime} is neither an image nor a PDF, which is all a model is sent; give text with -p"
    )]
    NotSent { mime: String },
}

/// `[MIME;]PATH` read: the type given before the first `;` (none when
/// nothing is), and the path.
pub(super) fn parse_reference(arg: &str) -> Result<(Option<&str>, &str), MediaError> {
    match arg.split_once(';') {
        None => Ok((None, arg)),
        Some((_, "")) => Err(MediaError {
            arg: arg.to_string(),
            problem: MediaProblem::NoFile,
        }),
        Some(("", path)) => Ok((None, path)),
        Some((mime, path)) => Ok((Some(mime), path)),
    }
}

/// The media type of a file, by its extension (case aside), as agents-exe
/// infers it.
pub(super) fn type_of_extension(path: &str) -> Option<&'static str> {
    let ext = Path::new(path).extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "mp3" => "audio/mp3",
        "mpeg" => "audio/mpeg",
        "wav" | "wave" => "audio/wav",
        "ogg" => "audio/ogg",
        "aac" => "audio/aac",
        "flac" => "audio/flac",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "avi" => "video/avi",
        "mov" => "video/quicktime",
        "pdf" => "application/pdf",
        "json" => "application/json",
        "xml" => "application/xml",
        "zip" => "application/zip",
        "txt" => "text/plain",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "csv" => "text/csv",
        "md" | "markdown" => "text/markdown",
        _ => return None,
    })
}

/// The part a model is sent the file `arg` names as: read (at most
/// `room` bytes), typed, and checked to be one a model takes.
fn part(arg: &str, room: usize) -> Result<(ContentPart, usize), MediaError> {
    let (given, path) = parse_reference(arg)?;
    let wrong = |problem| MediaError {
        arg: arg.to_string(),
        problem,
    };
    let mime = match given {
        Some(m) if is_media_type(m) => m.to_string(),
        Some(m) => {
            return Err(wrong(MediaProblem::NotAType {
                given: m.to_string(),
            }))
        }
        None => type_of_extension(path).map(str::to_string).ok_or_else(|| {
            wrong(MediaProblem::UnknownExtension {
                path: path.to_string(),
            })
        })?,
    };
    let file = std::fs::File::open(path).map_err(|source| {
        wrong(MediaProblem::Open {
            path: path.to_string(),
            source,
        })
    })?;
    let mut bytes = Vec::new();
    file.take(room as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| {
            wrong(MediaProblem::Read {
                path: path.to_string(),
                source,
            })
        })?;
    if bytes.len() > room {
        return Err(wrong(MediaProblem::TooLarge {
            path: path.to_string(),
        }));
    }
    let len = bytes.len();
    let filename = Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
    let media = Media { mime, bytes };
    let part = media.part(&filename).ok_or_else(|| {
        wrong(MediaProblem::NotSent {
            mime: media.mime.clone(),
        })
    })?;
    Ok((part, len))
}

/// The query's content: the prompt alone, or the prompt then the files
/// of `media` (`[MIME;]PATH` each), in order.
pub(super) fn query(prompt: String, media: &[String]) -> Result<Content, MediaError> {
    if media.is_empty() {
        return Ok(Content::Text(prompt));
    }
    let mut parts = vec![ContentPart::text(prompt)];
    let mut used = 0;
    for arg in media {
        let (part, len) = part(arg, MAX_MEDIA_BYTES - used)?;
        used += len;
        parts.push(part);
    }
    Ok(Content::Parts(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_an_optional_type_then_a_path() {
        assert_eq!(parse_reference("a.png").unwrap(), (None, "a.png"));
        assert_eq!(parse_reference(";a.png").unwrap(), (None, "a.png"));
        assert_eq!(
            parse_reference("image/png;dir/a;b").unwrap(),
            (Some("image/png"), "dir/a;b")
        );
        assert!(matches!(
            parse_reference("image/png;").unwrap_err().problem,
            MediaProblem::NoFile
        ));
        assert_eq!(type_of_extension("x/Chart.PNG"), Some("image/png"));
        assert_eq!(type_of_extension("doc.pdf"), Some("application/pdf"));
        assert_eq!(type_of_extension("a.jpeg"), Some("image/jpeg"));
        assert_eq!(type_of_extension("noext"), None);
        assert_eq!(type_of_extension("a.xyz"), None);
    }

    #[test]
    fn files_become_parts_after_the_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p.display().to_string()
        };
        let png = at("a.png", b"\x89PNG");
        let pdf = at("doc.pdf", b"%PDF");
        let odd = at("scan.bin", b"\x89PNG");
        let q = query(
            "look".into(),
            &[png.clone(), pdf, format!("image/png;{odd}")],
        )
        .unwrap();
        let wire = serde_json::to_value(&q).unwrap();
        assert_eq!(
            wire,
            serde_json::json!([
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
                {"type": "file", "file": {"filename": "doc.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
            ])
        );
        assert_eq!(
            query("plain".into(), &[]).unwrap(),
            Content::Text("plain".into())
        );
        let e = query("x".into(), std::slice::from_ref(&odd))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot tell the media type") && e.contains("-m 'MIME;"),
            "{e}"
        );
        let notes = at("notes.txt", b"hi");
        assert!(query("x".into(), &[notes])
            .unwrap_err()
            .to_string()
            .contains("neither an image nor a PDF"));
        let e = query("x".into(), &[format!("png;{png}")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a media type"), "{e}");
        let e = query(
            "x".into(),
            &[dir.path().join("gone.png").display().to_string()],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gone.png"), "{e}");
    }
}
