//! What a tool's result becomes in the session: the content of its turn
//! (what the model, the history and the store get) and the text of its
//! event, scrubbed of every secret the run can reach.
//!
//! Text is scrubbed. Media are not (a marker written into an image breaks
//! it): a medium whose bytes hold a secret in any form the scrubber knows
//! is withheld whole, and the turn says so. A result keeps at most
//! [`MAX_RESULT_MEDIA`] bytes of media, whatever the tool's own limit; past
//! it a medium is refused and the turn says so. A medium's type is one a
//! model is sent ([`bindery_llm::content::SENT_TYPES`]) or becomes
//! `application/octet-stream` (the type is the tool's own text: so it
//! carries nothing else); such a medium (what a script prints that is
//! not UTF-8, too) is described, not sent.

use bindery_llm::{Content, ContentPart, Media};
use bindery_params::scrub::Scrubber;
use bindery_tools::{OutputPart, ToolError, ToolOutput};

/// The bytes of media one result may keep.
pub const MAX_RESULT_MEDIA: usize = bindery_llm::content::MAX_MEDIA_BYTES;

/// A result as its turn holds it and its event shows it.
#[derive(Debug, PartialEq)]
pub struct Recorded {
    pub ok: bool,
    /// The turn's content.
    pub content: Content,
    /// The event's text: the text, each medium kept as `[<mime>, <n> bytes]`.
    pub shown: String,
}

/// `result` as the turn answering call `id` holds it (see the module's
/// docs).
pub fn recorded(id: &str, result: Result<ToolOutput, ToolError>, scrubber: &Scrubber) -> Recorded {
    let output = match result {
        Err(e) => {
            let text = scrubber.scrub(&format!("error: {e}"));
            return Recorded {
                ok: false,
                content: Content::Text(text.clone()),
                shown: text,
            };
        }
        Ok(output) => output,
    };
    if let Some(text) = output.as_text() {
        let text = scrubber.scrub(&text);
        return Recorded {
            ok: true,
            content: Content::Text(text.clone()),
            shown: text,
        };
    }
    let mut parts = Vec::new();
    let mut shown = Vec::new();
    let mut kept = 0usize;
    for part in output.into_parts() {
        match part {
            OutputPart::Text(t) => {
                let t = scrubber.scrub(&t);
                shown.push(t.clone());
                parts.push(ContentPart::text(t));
            }
            OutputPart::Media(m) => {
                let (part, said) = medium(id, m, scrubber, &mut kept);
                shown.push(said);
                parts.extend(part);
            }
        }
    }
    let shown = shown.join("\n");
    let content = if parts.iter().any(ContentPart::is_media) {
        Content::Parts(parts)
    } else {
        Content::Text(shown.clone())
    };
    Recorded {
        ok: true,
        content,
        shown,
    }
}

/// One medium of a result: its part when it is kept (with its text part
/// before it), else a text part that says why not; and what the event
/// says of it. `kept`: the media bytes the result keeps so far.
fn medium(id: &str, m: Media, scrubber: &Scrubber, kept: &mut usize) -> (Vec<ContentPart>, String) {
    let m = m.typed();
    let what = m.describe();
    let refused = |why: String| {
        let text = format!("[{what}: {why}]");
        (vec![ContentPart::text(text.clone())], text)
    };
    if scrubber.finds_in(&m.bytes) {
        tracing::warn!(call = id, media = %m.mime, "a tool's media held a secret value and were withheld");
        return refused("withheld, it holds a secret value".into());
    }
    if kept.saturating_add(m.bytes.len()) > MAX_RESULT_MEDIA {
        tracing::warn!(call = id, media = %m.mime, bytes = m.bytes.len(), "a tool's media were over the limit of a result and not kept");
        return refused(format!(
            "more than the {MAX_RESULT_MEDIA} bytes of media a result may keep; not kept"
        ));
    }
    let extension = m.mime.rsplit('/').next().unwrap_or("bin");
    let Some(part) = m.part(&format!("{id}.{extension}")) else {
        return refused(
            "not text, and not a type a model is sent (an image or a PDF); not sent".into(),
        );
    };
    *kept += m.bytes.len();
    (vec![part], format!("[{what}]"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_params::SecretString;

    fn media(mime: &str, bytes: &[u8]) -> Media {
        Media {
            mime: mime.into(),
            bytes: bytes.to_vec(),
        }
    }

    fn png() -> Media {
        media("image/png", b"\x89PNG\r\n\x1a\n")
    }

    #[test]
    fn text_and_json_are_scrubbed_text() {
        let mut s = Scrubber::default();
        s.add("token", &SecretString::new("canary-7f3a9c"));
        let r = recorded("c", Ok(ToolOutput::text("key canary-7f3a9c")), &s);
        assert_eq!(r.content, Content::Text("key <secret:token>".into()));
        assert!(r.ok);
        let r = recorded(
            "c",
            Ok(ToolOutput::Json(serde_json::json!({"k": "canary-7f3a9c"}))),
            &s,
        );
        assert_eq!(r.shown, r#"{"k":"<secret:token>"}"#);
        let r = recorded("c", Err(ToolError::Failed("no canary-7f3a9c".into())), &s);
        assert_eq!(
            (r.ok, r.shown.as_str()),
            (false, "error: no <secret:token>")
        );
    }

    #[test]
    fn an_image_is_kept_as_its_part() {
        let r = recorded("call_1", Ok(ToolOutput::Media(png())), &Scrubber::default());
        assert_eq!(r.content, Content::Parts(vec![png().part("x").unwrap()]));
        assert_eq!(r.shown, "[image/png, 8 bytes]");
        let pdf = recorded(
            "call_1",
            Ok(ToolOutput::Media(media("application/pdf", b"%PDF-1.4"))),
            &Scrubber::default(),
        );
        let Content::Parts(parts) = &pdf.content else {
            panic!("{pdf:?}")
        };
        assert!(matches!(&parts[0], ContentPart::File { file } if file.filename == "call_1.pdf"));
    }

    #[test]
    fn media_holding_a_secret_are_withheld_and_text_is_scrubbed() {
        let mut s = Scrubber::default();
        s.add("token", &SecretString::new("canary-7f3a9c"));
        let mut leaky = png().bytes;
        leaky.extend_from_slice(b"tEXtComment\0canary-7f3a9c");
        let r = recorded(
            "c",
            Ok(ToolOutput::Mixed(vec![
                OutputPart::Text("see canary-7f3a9c".into()),
                OutputPart::Media(media("image/png", &leaky)),
            ])),
            &s,
        );
        assert_eq!(
            r.content,
            Content::Text(format!(
                "see <secret:token>\n[image/png, {} bytes: withheld, it holds a secret value]",
                leaky.len()
            ))
        );
        // Base64 of it in the bytes is found too.
        let b64 = media("image/png", b"\x89PNG Y2FuYXJ5LTdmM2E5Yw==");
        assert!(!recorded("c", Ok(ToolOutput::Media(b64)), &s)
            .content
            .has_media());
        assert!(recorded("c", Ok(ToolOutput::Media(png())), &s)
            .content
            .has_media());
    }

    #[test]
    fn media_past_the_limit_of_a_result_are_refused() {
        let big = media("image/png", &vec![0u8; MAX_RESULT_MEDIA - 4]);
        let r = recorded(
            "c",
            Ok(ToolOutput::Mixed(vec![
                OutputPart::Media(big.clone()),
                OutputPart::Media(png()),
            ])),
            &Scrubber::default(),
        );
        let Content::Parts(parts) = &r.content else {
            panic!("{r:?}")
        };
        assert_eq!(parts.len(), 2);
        assert!(parts[0].is_media());
        assert_eq!(
            parts[1],
            ContentPart::text(format!(
                "[image/png, 8 bytes: more than the {MAX_RESULT_MEDIA} bytes of media a result may keep; not kept]"
            ))
        );
    }

    #[test]
    fn bytes_no_model_takes_are_described() {
        let r = recorded(
            "c",
            Ok(ToolOutput::from_stdout(vec![0xff, 0xfe, 0x00], None)),
            &Scrubber::default(),
        );
        assert_eq!(
            r.content,
            Content::Text("[application/octet-stream, 3 bytes: not text, and not a type a model is sent (an image or a PDF); not sent]".into())
        );
    }

    /// A medium whose claimed type holds a secret keeps none of it: its
    /// type is octet-stream, and it is described, not sent.
    #[test]
    fn a_media_type_is_never_a_tools_own_text() {
        let mut s = Scrubber::default();
        s.add("token", &SecretString::new("canary-7f3a9c"));
        for m in [
            media("image/canary-7f3a9c", &[1, 2, 3]),
            media("image/canary7f3a9c", &[1]),
        ] {
            let r = recorded("c1", Ok(ToolOutput::Mixed(vec![OutputPart::Media(m)])), &s);
            let all = format!("{:?} {}", r.content, r.shown);
            assert!(!all.contains("7f3a9c"), "{all}");
            assert!(!r.content.has_media(), "{all}");
            assert!(r.shown.contains("application/octet-stream"), "{}", r.shown);
        }
        let r = recorded("c1", Ok(ToolOutput::Media(png())), &s);
        assert!(r.content.has_media(), "a PNG is still sent: {}", r.shown);
    }
}
