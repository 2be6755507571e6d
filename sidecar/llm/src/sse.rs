//! The one incremental parser for `text/event-stream` bodies: a model's
//! streamed answer, and the session API's events as the CLI and the tests
//! read them.
//!
//! Bytes go in as they come off the wire, cut anywhere (inside a line, inside
//! a UTF-8 character, between a `\r` and its `\n`); each complete event
//! comes out with its `event` name, its `id` and its `data`. An event is one
//! with a `data` field (as the standard dispatches); `retry` and comment
//! lines are skipped.

/// The longest line, or event, the parser buffers before it gives up on the stream.
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// One server-sent event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `id` field, if it had one.
    pub id: Option<String>,
    /// Its `event` field (empty: the default, `message`).
    pub event: String,
    /// Its `data` lines, joined by `\n`.
    pub data: String,
}

/// A stream that cannot be read as events.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    #[error("an event in the stream is longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
}

#[derive(Debug, Default)]
pub struct SseParser {
    /// The current, unfinished line.
    line: Vec<u8>,
    /// The current, unfinished event.
    current: SseEvent,
    /// Whether the current event has a `data` field (possibly empty).
    has_data: bool,
    /// The last byte seen was a `\r`: a `\n` right after it ends no line.
    after_cr: bool,
}

impl SseParser {
    /// Takes the next bytes of the stream and returns every event they
    /// complete, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
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
            if self.line.len() > MAX_LINE_BYTES || self.current.data.len() > MAX_LINE_BYTES {
                return Err(SseError::TooLong);
            }
        }
        Ok(events)
    }

    /// The stream ended: returns the last event if it was not terminated by
    /// a blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events);
        }
        self.end_line(&mut events);
        events.pop()
    }

    fn end_line(&mut self, events: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            let event = std::mem::take(&mut self.current);
            if std::mem::take(&mut self.has_data) {
                events.push(event);
            }
            return;
        }
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
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.current.event = value.to_owned(),
            "id" => self.current.id = Some(value.to_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` cut into pieces of the given sizes (cycled).
    fn parse_in_pieces(input: &[u8], sizes: &[usize]) -> Vec<String> {
        events_in_pieces(input, sizes)
            .into_iter()
            .map(|e| e.data)
            .collect()
    }

    fn events_in_pieces(input: &[u8], sizes: &[usize]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
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
        retry: 100\rdata: cr only\r\rdata: [DONE]\n\n";

    fn expected() -> Vec<String> {
        vec![
            "{\"a\":\"héllo ✓\"}".to_owned(),
            "line one\nline two".to_owned(),
            "cr only".to_owned(),
            "[DONE]".to_owned(),
        ]
    }

    #[test]
    fn parses_a_whole_stream() {
        assert_eq!(
            parse_in_pieces(STREAM.as_bytes(), &[usize::MAX]),
            expected()
        );
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
            let mut parser = SseParser::default();
            let mut events = parser.feed(&bytes[..cut]).unwrap();
            events.extend(parser.feed(&bytes[cut..]).unwrap());
            events.extend(parser.finish());
            let data: Vec<String> = events.into_iter().map(|e| e.data).collect();
            assert_eq!(data, expected(), "cut at {cut}");
        }
    }

    #[test]
    fn an_event_keeps_its_name_and_id_and_only_an_event_with_data_is_one() {
        let stream = "id: 1\nevent: run_started\ndata: {\"a\":1}\n\n\
            : keep-alive\n\nevent: nothing\n\nevent: delta\ndata: hi\n\n";
        let want = [
            SseEvent {
                id: Some("1".into()),
                event: "run_started".into(),
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                id: None,
                event: "delta".into(),
                data: "hi".into(),
            },
        ];
        for sizes in [&[usize::MAX][..], &[1], &[5, 3]] {
            assert_eq!(
                events_in_pieces(stream.as_bytes(), sizes),
                want,
                "{sizes:?}"
            );
        }
    }

    #[test]
    fn a_character_cut_between_chunks_comes_out_whole() {
        // "é" is two bytes, "✓" three: every cut inside them.
        let stream = "event: message\ndata: é✓\n\n".as_bytes();
        for cut in 0..stream.len() {
            let mut parser = SseParser::default();
            let mut events = parser.feed(&stream[..cut]).unwrap();
            events.extend(parser.feed(&stream[cut..]).unwrap());
            assert_eq!(events.len(), 1, "cut at {cut}");
            assert_eq!(events[0].data, "é✓", "cut at {cut}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_kept() {
        assert_eq!(
            parse_in_pieces(b"data: a\n\ndata: b", &[3]),
            vec!["a".to_owned(), "b".to_owned()]
        );
        assert_eq!(parse_in_pieces(b"data: a\n", &[3]), vec!["a".to_owned()]);
        assert!(parse_in_pieces(b"not an event stream", &[5]).is_empty());
    }

    #[test]
    fn an_endless_line_is_an_error() {
        let mut parser = SseParser::default();
        let chunk = vec![b'x'; 1024 * 1024];
        let mut failed = false;
        for _ in 0..20 {
            if parser.feed(&chunk).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }
}
