//! AWS's event-stream framing (`application/vnd.amazon.eventstream`), the
//! body of a `converse-stream` reply: bytes in, whole messages out.
//!
//! A message is its prelude (total length, headers length, both u32 big
//! endian, then the CRC-32 of those eight bytes), its headers, its payload
//! and the CRC-32 of all that came before. Both CRCs are checked, and the
//! lengths are checked before anything is kept: a frame past
//! [`MAX_FRAME_BYTES`], or whose header block does not fit in it or does
//! not end where it says, is refused. An `exception` or `error` message
//! (throttling, the service unavailable, a validation) is an error, with
//! the status its HTTP answer would have had, so the retries and the
//! fallbacks treat it as they would that answer.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::{excerpt, LlmError};

/// The largest message taken: 16 MiB, far past any event of a reply.
pub(crate) const MAX_FRAME_BYTES: usize = 16 << 20;
/// The largest header block taken (botocore's bound).
const MAX_HEADER_BYTES: usize = 128 << 10;
/// Total length, headers length, prelude CRC.
const PRELUDE: usize = 12;
/// A message with no headers and no payload: the prelude and its CRC.
const MIN_FRAME: usize = PRELUDE + 4;

/// The decoder of one stream: feed it the body's chunks as they come.
#[derive(Default)]
pub(crate) struct Frames {
    /// What came of the message not yet whole.
    buf: BytesMut,
    /// The request's credentials, taken out of an exception's message
    /// before it is cut to an excerpt.
    sent: crate::sent::Sent,
}

/// One `event` message: its `:event-type` (`messageStart`,
/// `contentBlockDelta`, …) and its payload (the event's JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub event_type: String,
    pub payload: Bytes,
}

impl Frames {
    /// A decoder whose exceptions are quoted without `sent`'s credentials.
    pub(crate) fn scrubbing(sent: crate::sent::Sent) -> Frames {
        Frames {
            sent,
            ..Frames::default()
        }
    }

    /// The messages `chunk` completes, in order; an error for a message
    /// that does not read, or that is the service's `exception`.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Frame>, LlmError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while self.buf.len() >= PRELUDE {
            let total = be32(&self.buf[0..4]) as usize;
            let headers = be32(&self.buf[4..8]) as usize;
            let prelude_crc = be32(&self.buf[8..12]);
            if crc32(&self.buf[0..8]) != prelude_crc {
                return Err(malformed("a message's prelude fails its CRC"));
            }
            if !(MIN_FRAME..=MAX_FRAME_BYTES).contains(&total) {
                return Err(malformed(&format!(
                    "a message of {total} bytes (from {MIN_FRAME} to {MAX_FRAME_BYTES} are taken)"
                )));
            }
            if headers > MAX_HEADER_BYTES || headers > total - MIN_FRAME {
                return Err(malformed(&format!(
                    "a message of {total} bytes says its headers take {headers}"
                )));
            }
            if self.buf.len() < total {
                break;
            }
            let message = self.buf.split_to(total).freeze();
            let crc = be32(&message[total - 4..]);
            if crc32(&message[..total - 4]) != crc {
                return Err(malformed("a message fails its CRC"));
            }
            let h = Headers::read(&message[PRELUDE..PRELUDE + headers])?;
            let payload = message.slice(PRELUDE + headers..total - 4);
            match h.message_type.as_deref() {
                Some("event") => out.push(Frame {
                    event_type: h
                        .event_type
                        .ok_or_else(|| malformed("an event without an `:event-type`"))?,
                    payload,
                }),
                Some("exception") => {
                    let kind = h.exception_type.unwrap_or_default();
                    return Err(exception(
                        &self.sent.scrub(&kind),
                        &self.sent.scrub(&message_of(&payload)),
                    ));
                }
                Some("error") => {
                    let code = h.error_code.unwrap_or_default();
                    let message = h.error_message.unwrap_or_default();
                    return Err(exception(
                        &self.sent.scrub(&code),
                        &self.sent.scrub(&message),
                    ));
                }
                other => {
                    return Err(malformed(&format!(
                        "a message of type {other:?} (an event, an exception or an error are taken)"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Whether no part of a message is waiting for more bytes (at the
    /// body's end, anything else is a message cut short).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The headers a message is read by; the others are passed over.
#[derive(Default)]
struct Headers {
    message_type: Option<String>,
    event_type: Option<String>,
    exception_type: Option<String>,
    error_code: Option<String>,
    error_message: Option<String>,
}

impl Headers {
    fn read(mut block: &[u8]) -> Result<Headers, LlmError> {
        let lies = || malformed("a message's header block does not end where it says");
        let mut h = Headers::default();
        while block.has_remaining() {
            let name_len = usize::from(*block.first().ok_or_else(lies)?);
            block.advance(1);
            let name = take(&mut block, name_len).ok_or_else(lies)?;
            let kind = *block.first().ok_or_else(lies)?;
            block.advance(1);
            // The value's length by its type (AWS's event-stream encoding).
            let value = match kind {
                0 | 1 => &[][..],
                2 => take(&mut block, 1).ok_or_else(lies)?,
                3 => take(&mut block, 2).ok_or_else(lies)?,
                4 => take(&mut block, 4).ok_or_else(lies)?,
                5 | 8 => take(&mut block, 8).ok_or_else(lies)?,
                9 => take(&mut block, 16).ok_or_else(lies)?,
                6 | 7 => {
                    let len = take(&mut block, 2).ok_or_else(lies)?;
                    let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
                    take(&mut block, len).ok_or_else(lies)?
                }
                other => {
                    return Err(malformed(&format!(
                        "a message header of type {other}, which the encoding does not have"
                    )))
                }
            };
            let slot = match name {
                b":message-type" => &mut h.message_type,
                b":event-type" => &mut h.event_type,
                b":exception-type" => &mut h.exception_type,
                b":error-code" => &mut h.error_code,
                b":error-message" => &mut h.error_message,
                _ => continue,
            };
            if kind != 7 {
                return Err(malformed(&format!(
                    "the message header {} is not a string",
                    String::from_utf8_lossy(name)
                )));
            }
            if slot.is_some() {
                return Err(malformed(&format!(
                    "the message header {} is given twice",
                    String::from_utf8_lossy(name)
                )));
            }
            let text = std::str::from_utf8(value)
                .map_err(|_| malformed("a message header is not UTF-8"))?;
            *slot = Some(text.to_owned());
        }
        Ok(h)
    }
}

/// The first `n` bytes of `block`, which moves past them; `None` when it
/// has fewer.
fn take<'a>(block: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if block.len() < n {
        return None;
    }
    let (head, tail) = block.split_at(n);
    *block = tail;
    Some(head)
}

/// An exception's `message`, or its payload as it came.
fn message_of(payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(payload);
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("message")
                .or_else(|| v.get("Message"))
                .and_then(|m| m.as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| text.into_owned())
}

/// A stream's exception as the error its HTTP answer would be: throttling
/// 429, the service or the model failing 5xx (busy: retried, fallen back
/// from), the request refused 4xx.
pub(crate) fn exception(kind: &str, message: &str) -> LlmError {
    // `throttlingException` in a stream, `ThrottlingException` in an
    // answer's `x-amzn-ErrorType`.
    let status = match kind.to_ascii_lowercase().as_str() {
        "throttlingexception" | "modelnotreadyexception" => 429,
        "serviceunavailableexception" | "modeltimeoutexception" => 503,
        "validationexception" => 400,
        "accessdeniedexception" => 403,
        "resourcenotfoundexception" => 404,
        // internalServerException, modelStreamErrorException, and any
        // the service adds: the server failed.
        _ => 500,
    };
    let kind = if kind.is_empty() {
        "an exception"
    } else {
        kind
    };
    LlmError::Http {
        status,
        body: excerpt(&format!("{kind}: {message}")),
    }
}

fn be32(b: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&b[..4]);
    u32::from_be_bytes(word)
}

fn malformed(what: &str) -> LlmError {
    LlmError::Malformed(format!("the event stream: {what}"))
}

/// CRC-32 (IEEE 802.3, the event stream's), by a table made at compile time.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}
