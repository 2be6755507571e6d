//! An incremental parser for `text/event-stream` bodies, the one every
//! reader of an event stream uses: the LLM client (model answers), the
//! `session` command and the tests' harness (the session API's events).
//!
//! Bytes go in as they come off the wire, cut anywhere (inside a line,
//! inside a UTF-8 character, between a `\r` and its `\n`); each complete
//! event comes out. A line is decoded only once it is whole, so a character
//! cut between two reads is never replaced by U+FFFD. `retry` and comment
//! lines are skipped, as are events without a `data` field (the WHATWG
//! rule: such an event is not dispatched).
#![forbid(unsafe_code)]

/// The longest line, or event, the parser buffers before it gives up on
/// the stream.
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// Its `id` field, if it had one.
    pub id: Option<String>,
    /// Its `event` field, if it had one; [`Event::kind`] gives the default.
    pub event: Option<String>,
    /// Its `data` lines, joined by `\n`.
    pub data: String,
}

impl Event {
    /// The event's type: its `event` field, `message` without one.
    pub fn kind(&self) -> &str {
        self.event.as_deref().unwrap_or("message")
    }
}

/// A line or an event grew past [`MAX_EVENT_BYTES`]: the stream is not an
/// event stream, or not one to keep reading.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("an event in the stream is longer than {MAX_EVENT_BYTES} bytes")]
pub struct TooLong;

/// The parser: one per stream, fed each read as it comes.
#[derive(Debug, Default)]
pub struct Parser {
    /// The current, unfinished line.
    line: Vec<u8>,
    /// The current, unfinished event.
    event: Event,
    /// Whether the current event has a `data` field (possibly empty).
    has_data: bool,
    /// The last byte seen was a `\r`: a `\n` right after it ends no line.
    after_cr: bool,
}

impl Parser {
    /// Takes the next bytes of the stream and returns every event they
    /// complete, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLong> {
        let mut events = Vec::new();
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.line.extend_from_slice(&rest[..end]);
                    self.after_cr = rest[end] == b'\r';
                    rest = &rest[end + 1..];
                    self.end_line(&mut events);
                }
                None => {
                    self.line.extend_from_slice(rest);
                    rest = &[];
                }
            }
            if self.line.len() > MAX_EVENT_BYTES || self.event.data.len() > MAX_EVENT_BYTES {
                return Err(TooLong);
            }
        }
        Ok(events)
    }

    /// The stream ended: the last event if no blank line ended it.
    pub fn finish(&mut self) -> Option<Event> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events);
        }
        self.end_line(&mut events);
        events.pop()
    }

    fn end_line(&mut self, events: &mut Vec<Event>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            if std::mem::take(&mut self.has_data) {
                events.push(event);
            }
            return;
        }
        // Whole lines only: a character cut between reads is whole here.
        let line = String::from_utf8_lossy(&line);
        let line = line.strip_prefix('\u{feff}').unwrap_or(&line);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.event.data.push('\n');
                }
                self.event.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event.event = Some(value.to_owned()),
            // An id with NUL in it is ignored (WHATWG).
            "id" if !value.contains('\0') => self.event.id = Some(value.to_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` cut into pieces of the given sizes (cycled).
    fn parse_in_pieces(input: &[u8], sizes: &[usize]) -> Vec<Event> {
        let mut parser = Parser::default();
        let mut events = Vec::new();
        let mut rest = input;
        let mut i = 0;
        while !rest.is_empty() {
            let n = sizes[i % sizes.len()].min(rest.len());
            events.extend(parser.feed(&rest[..n]).unwrap());
            rest = &rest[n..];
            i += 1;
        }
        events.extend(parser.finish());
        events
    }

    const STREAM: &str = ": keep-alive\n\n\
        data: {\"a\":\"héllo ✓\"}\n\n\
        event: message\r\nid: 7\r\ndata: line one\r\ndata:line two\r\n\r\n\
        event: ü\nid: 8\nretry: 100\rdata: cr only\r\rid: 9\n\n\
        data: [DONE]\n\n";

    fn event(id: Option<&str>, kind: Option<&str>, data: &str) -> Event {
        Event {
            id: id.map(str::to_owned),
            event: kind.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    fn expected() -> Vec<Event> {
        vec![
            event(None, None, "{\"a\":\"héllo ✓\"}"),
            event(Some("7"), Some("message"), "line one\nline two"),
            event(Some("8"), Some("ü"), "cr only"),
            // `id: 9` alone made no event.
            event(None, None, "[DONE]"),
        ]
    }

    #[test]
    fn parses_a_whole_stream() {
        assert_eq!(
            parse_in_pieces(STREAM.as_bytes(), &[usize::MAX]),
            expected()
        );
        assert_eq!(expected()[0].kind(), "message");
        assert_eq!(expected()[2].kind(), "ü");
    }

    #[test]
    fn parses_a_stream_cut_anywhere() {
        for sizes in [&[1][..], &[2], &[3, 1], &[7, 2, 5], &[13], &[4, 9, 1, 1]] {
            assert_eq!(
                parse_in_pieces(STREAM.as_bytes(), sizes),
                expected(),
                "pieces of {sizes:?}"
            );
        }
        // Every single cut point, including inside multi-byte characters
        // and between \r and \n.
        let bytes = STREAM.as_bytes();
        for cut in 0..bytes.len() {
            let mut parser = Parser::default();
            let mut events = parser.feed(&bytes[..cut]).unwrap();
            events.extend(parser.feed(&bytes[cut..]).unwrap());
            events.extend(parser.finish());
            assert_eq!(events, expected(), "cut at {cut}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_kept() {
        let data = |events: Vec<Event>| events.into_iter().map(|e| e.data).collect::<Vec<_>>();
        assert_eq!(
            data(parse_in_pieces(b"data: a\n\ndata: b", &[3])),
            ["a", "b"]
        );
        assert_eq!(data(parse_in_pieces(b"data: a\n", &[3])), ["a"]);
        assert!(parse_in_pieces(b"not an event stream", &[5]).is_empty());
    }

    #[test]
    fn an_endless_line_is_an_error() {
        let mut parser = Parser::default();
        let chunk = vec![b'x'; 1024 * 1024];
        let failed = (0..20).any(|_| parser.feed(&chunk).is_err());
        assert!(failed);
        assert_eq!(
            TooLong.to_string(),
            "an event in the stream is longer than 16777216 bytes"
        );
    }
}
