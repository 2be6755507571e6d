//! A message's content: text, or parts (text, an image, a PDF), in the
//! OpenAI wire shape, and the media a part is made from.
//!
//! A user message (`run -m`) and a tool's result (a bash tool that prints
//! an image) may carry media. The turn keeps them in agents-exe's form:
//! the parts as the message's `content`, each medium a `data:` URL. What a
//! request sends of a tool's parts is [`super::Conversation`]'s to decide
//! (Chat Completions takes only text in a tool message).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// A message's content: a string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Text and media parts, in order.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, as a `data:<mime>;base64,…` URL.
    ImageUrl {
        /// The image.
        image_url: ImageUrl,
    },
    /// A file (a PDF), as a `data:<mime>;base64,…` URL.
    File {
        /// The file.
        file: FileData,
    },
}

/// `{"url": "data:<mime>;base64,…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageUrl {
    /// `data:<mime>;base64,<bytes>`.
    pub url: String,
}

/// `{"filename", "file_data": "data:<mime>;base64,…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileData {
    /// The file's name, as the model is told it.
    pub filename: String,
    /// `data:<mime>;base64,<bytes>`.
    pub file_data: String,
}

/// Bytes with their media type: what a tool printed, or a file given
/// with `run -m`.
#[derive(Clone, PartialEq, Eq)]
pub struct Media {
    /// `image/png`, `application/pdf`, …
    pub mime: String,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Media {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The size, never the bytes.
        write!(f, "Media({}, {} bytes)", self.mime, self.bytes.len())
    }
}

/// The media types a model is sent: images as `image_url` (the four
/// every provider takes), a PDF as `file`.
pub const SENT_TYPES: [&str; 5] = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
];

/// Bytes of no type a model is sent.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// The bytes of media one message may carry (a tool's result, the files
/// of `run -m`): its turn holds them base64, and every later request of
/// the session sends them again. 4 MiB.
pub const MAX_MEDIA_BYTES: usize = 4 * 1024 * 1024;

/// How many characters a media part counts for when a request's tokens
/// are estimated: about what a provider charges for one image (its
/// base64 text would count a hundred times that).
pub const MEDIA_PART_CHARS: usize = 3_000;

impl Media {
    /// The part a model is sent it as: an image as `image_url`, a PDF as
    /// `file` (named `filename`), as agents-exe sends them; `None` for
    /// any other type, which no chat model takes.
    pub fn part(&self, filename: &str) -> Option<ContentPart> {
        if !SENT_TYPES.contains(&self.mime.as_str()) {
            return None;
        }
        if self.mime.starts_with("image/") {
            Some(ContentPart::ImageUrl {
                image_url: ImageUrl {
                    url: self.data_url(),
                },
            })
        } else if self.mime == "application/pdf" {
            Some(ContentPart::File {
                file: FileData {
                    filename: filename.to_string(),
                    file_data: self.data_url(),
                },
            })
        } else {
            None
        }
    }

    /// `data:<mime>;base64,<bytes>`.
    pub fn data_url(&self) -> String {
        format!(
            "data:{};base64,{}",
            self.mime,
            base64::engine::general_purpose::STANDARD.encode(&self.bytes)
        )
    }

    /// The same bytes, typed as one of [`SENT_TYPES`] or else
    /// `application/octet-stream`. What a tool says its bytes are is its
    /// own text: as it goes to the model, the history and the store only
    /// as a type of the list, it carries nothing else (a secret's value
    /// spelled as `image/<value>`).
    pub fn typed(self) -> Media {
        let named = self.mime.split(';').next().unwrap_or("").trim();
        let mime = SENT_TYPES
            .iter()
            .find(|t| t.eq_ignore_ascii_case(named))
            .copied()
            .unwrap_or(OCTET_STREAM);
        Media {
            mime: mime.to_string(),
            bytes: self.bytes,
        }
    }

    /// What a text that stands for it says: its type and size.
    pub fn describe(&self) -> String {
        format!("{}, {} bytes", self.mime, self.bytes.len())
    }
}

/// Whether `s` is a media type, `type/subtype` (`image/png`,
/// `application/vnd.ms-excel`): token characters on either side of one
/// slash, no parameters. It goes into a `data:` URL as it is.
pub fn is_media_type(s: &str) -> bool {
    let token = |t: &str| {
        !t.is_empty()
            && t.len() <= 127
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    matches!(s.split_once('/'), Some((t, sub)) if token(t) && token(sub))
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart::Text { text: text.into() }
    }

    /// Whether it is a medium (not text).
    pub fn is_media(&self) -> bool {
        !matches!(self, ContentPart::Text { .. })
    }

    /// About how many characters it puts in a request (see
    /// [`MEDIA_PART_CHARS`]).
    pub fn chars(&self) -> usize {
        match self {
            ContentPart::Text { text } => text.len(),
            _ => MEDIA_PART_CHARS,
        }
    }

    /// The media type of a medium, read from its `data:` URL.
    pub fn mime(&self) -> Option<&str> {
        let url = match self {
            ContentPart::Text { .. } => return None,
            ContentPart::ImageUrl { image_url } => &image_url.url,
            ContentPart::File { file } => &file.file_data,
        };
        url.strip_prefix("data:")?.split([';', ',']).next()
    }
}

impl Content {
    /// Its text: the string, or the text parts, one per line.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Content::Text(t) => t.as_str().into(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
                .into(),
        }
    }

    /// About how many characters it puts in a request.
    pub fn chars(&self) -> usize {
        match self {
            Content::Text(t) => t.len(),
            Content::Parts(parts) => parts.iter().map(ContentPart::chars).sum(),
        }
    }

    /// Whether it holds a medium.
    pub fn has_media(&self) -> bool {
        matches!(self, Content::Parts(parts) if parts.iter().any(ContentPart::is_media))
    }
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Content::Text(text)
    }
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Content::Text(text.to_string())
    }
}

impl PartialEq<str> for Content {
    fn eq(&self, other: &str) -> bool {
        matches!(self, Content::Text(t) if t == other)
    }
}

impl PartialEq<&str> for Content {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn png() -> Media {
        Media {
            mime: "image/png".into(),
            bytes: vec![0x89, b'P', b'N', b'G'],
        }
    }

    #[test]
    fn media_become_the_parts_agents_exe_sends() {
        assert_eq!(
            serde_json::to_value(png().part("chart.png").unwrap()).unwrap(),
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}})
        );
        let pdf = Media {
            mime: "application/pdf".into(),
            bytes: b"%PDF".to_vec(),
        };
        assert_eq!(
            serde_json::to_value(pdf.part("a.pdf").unwrap()).unwrap(),
            json!({"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}})
        );
        let bin = Media {
            mime: "application/octet-stream".into(),
            bytes: vec![0xff],
        };
        assert_eq!(bin.part("x"), None);
        assert_eq!(
            format!("{bin:?}"),
            "Media(application/octet-stream, 1 bytes)"
        );
    }

    #[test]
    fn content_is_a_string_or_parts_both_ways() {
        let text: Content = serde_json::from_value(json!("hi")).unwrap();
        assert_eq!(text, Content::Text("hi".into()));
        let parts = Content::Parts(vec![ContentPart::text("see"), png().part("p").unwrap()]);
        let wire = serde_json::to_value(&parts).unwrap();
        assert_eq!(wire[0], json!({"type": "text", "text": "see"}));
        assert_eq!(serde_json::from_value::<Content>(wire).unwrap(), parts);
        assert_eq!(parts.text(), "see");
        assert!(parts.has_media());
        assert_eq!(parts.chars(), 3 + MEDIA_PART_CHARS);
        assert_eq!(parts_mime(&parts), ["image/png"]);
        for bad in [
            json!(3),
            json!([{"type": "audio"}]),
            json!([{"text": "x"}]),
            json!(null),
        ] {
            assert!(
                serde_json::from_value::<Content>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn media_types_are_type_slash_subtype() {
        for ok in [
            "image/png",
            "application/pdf",
            "application/vnd.ms-excel",
            "image/svg+xml",
        ] {
            assert!(is_media_type(ok), "{ok}");
        }
        for bad in [
            "",
            "png",
            "image/",
            "/png",
            "image/png; charset=x",
            "a/b/c",
            "image/p\"ng",
            "image/png\n",
        ] {
            assert!(!is_media_type(bad), "{bad:?}");
        }
    }

    fn parts_mime(c: &Content) -> Vec<&str> {
        match c {
            Content::Parts(p) => p.iter().filter_map(ContentPart::mime).collect(),
            Content::Text(_) => Vec::new(),
        }
    }

    /// A type is one of the list or octet-stream: a tool's claimed type
    /// carries none of its own text.
    #[test]
    fn a_media_type_is_one_a_model_is_sent_or_octet_stream() {
        let typed = |mime: &str| {
            Media {
                mime: mime.into(),
                bytes: vec![1],
            }
            .typed()
            .mime
        };
        assert_eq!(typed("image/png"), "image/png");
        assert_eq!(typed("IMAGE/JPEG; q=1"), "image/jpeg");
        assert_eq!(typed("application/pdf"), "application/pdf");
        for other in [
            "image/CANARY-xyz123",
            "image/svg+xml",
            "text/plain",
            "",
            "image/png/x",
        ] {
            assert_eq!(typed(other), OCTET_STREAM, "{other}");
        }
        let odd = Media {
            mime: "image/bmp".into(),
            bytes: vec![1],
        };
        assert!(odd.part("f.bmp").is_none(), "an untyped image is not sent");
    }
}
