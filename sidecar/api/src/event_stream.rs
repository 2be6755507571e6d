//! A session's event stream as a server-sent-events response body.
//!
//! Written by hand rather than with axum's `Sse`, because an open stream's
//! own state is what thousands of them cost: axum's body chains a replay
//! stream to a flattened `unfold` whose future holds the subscriber's
//! wait, and it arms a timer of its own for keep-alives (about 600 bytes
//! per stream, boxed twice). This body is the feed and what is left to
//! replay; the feed's queue wakes it, and keep-alives come from the one
//! timer of `Service::ping_streams`. Its two headers live in a map sized
//! for two: hyper keeps a response's map for the connection's next request.
//!
//! The wire format is axum's: `id: <seq>` (left out for `delta`),
//! `event: <kind>`, `data: <JSON>`, a blank line; `:` alone is a
//! keep-alive.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use http_body::Frame;

use bindery_session::service::{Feed, FeedItem, LiveEvent, Service};
use bindery_store::model::EventRecord;
use bindery_store::wire::Delta;

/// The response: `stored` first, then what `feed` gives.
pub fn response(service: Arc<Service>, stored: Vec<EventRecord>, feed: Feed) -> Response {
    let mut headers = HeaderMap::with_capacity(2);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let mut response = Response::new(Body::new(EventBody {
        service,
        replay: stored,
        feed,
    }));
    *response.headers_mut() = headers;
    response
}

struct EventBody {
    service: Arc<Service>,
    /// Stored events not sent yet (all sent in the first frame).
    replay: Vec<EventRecord>,
    feed: Feed,
}

impl http_body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if !this.replay.is_empty() {
            let stored = std::mem::take(&mut this.replay);
            let mut out = Vec::new();
            for e in &stored {
                write_stored(&mut out, e);
            }
            return Poll::Ready(Some(Ok(Frame::data(out.into()))));
        }
        let frame = match ready!(this.feed.poll_next(this.service.recorder(), cx)) {
            None => return Poll::Ready(None),
            Some(FeedItem::KeepAlive) => Bytes::from_static(b":\n\n"),
            Some(FeedItem::Events(events)) => {
                let mut out = Vec::new();
                for e in &events {
                    match e {
                        LiveEvent::Stored(e) => write_stored(&mut out, e),
                        LiveEvent::Delta(text) => {
                            let delta = Delta {
                                content: text.to_string(),
                            };
                            let data = serde_json::to_string(&delta).expect("text is plain JSON");
                            write_event(&mut out, None, "delta", &data);
                        }
                    }
                }
                out.into()
            }
        };
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }
}

fn write_stored(out: &mut Vec<u8>, e: &EventRecord) {
    write_event(out, Some(e.seq), &e.kind, &e.data.to_string());
}

/// One event. `data` may span lines (each becomes a `data:` line, as the
/// format joins them); the kind is one of the service's own names.
fn write_event(out: &mut Vec<u8>, id: Option<i64>, kind: &str, data: &str) {
    use std::io::Write;
    if let Some(id) = id {
        let _ = writeln!(out, "id: {id}");
    }
    debug_assert!(!kind.contains(['\n', '\r']));
    let _ = writeln!(out, "event: {kind}");
    for line in data.split('\n') {
        let _ = writeln!(out, "data: {}", line.strip_suffix('\r').unwrap_or(line));
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(id: Option<i64>, kind: &str, data: &str) -> String {
        let mut out = Vec::new();
        write_event(&mut out, id, kind, data);
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn an_event_is_written_as_axum_wrote_it() {
        assert_eq!(
            written(Some(7), "message", r#"{"a":1}"#),
            "id: 7\nevent: message\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(
            written(None, "delta", r#"{"content":"hi"}"#),
            "event: delta\ndata: {\"content\":\"hi\"}\n\n"
        );
    }

    #[test]
    fn data_over_several_lines_is_one_data_field_each() {
        assert_eq!(
            written(None, "x", "a\nb\r\nc"),
            "event: x\ndata: a\ndata: b\ndata: c\n\n"
        );
    }
}
