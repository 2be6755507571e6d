//! Serve the session API's router over HTTP/1, one task per connection.
//!
//! What `axum::serve` does, minus two per-connection costs that made an
//! open event stream cost about 33 KiB (measured with the memory bench):
//!
//! - it rebuilt the router for every connection (`Router::with_state`
//!   clones the route table and re-boxes every handler: about 9 KiB and
//!   130 small allocations); here every connection shares the one router;
//! - its protocol-detecting connection hands hyper the first bytes it read
//!   apart from the rest, so hyper's read buffer, which keeps 8 KiB free
//!   after what it holds, grew to 16 KiB on every connection. This server
//!   speaks HTTP/1 only (as before: HTTP/2 is not built in), so hyper reads
//!   the socket itself.
//!
//! - the future of the request in flight: hyper boxes it once per
//!   connection and keeps the box (about 300 bytes with the request it
//!   holds) for the connection's life, an open event stream included.
//!   Here that box is a pointer, and the future a box of its own that goes
//!   when the response is ready.
//!
//! Graceful shutdown is unchanged: on the signal no new connection is
//! taken, each open one finishes the response in flight, and the future
//! returns once all have closed.
//!
//! No client holds the server with connections that say nothing
//! ([`ConnLimits`]): a request's head must arrive within the header
//! timeout of the server starting to wait for it (on a new connection, or
//! one kept alive after a response: the idle timeout too), and one address
//! holds at most so many connections at once.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use futures::future::BoxFuture;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// What one client may hold of the server.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// How long a request's head may take to arrive, from when the server
    /// starts waiting for it; then the connection is closed.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive, from its head; then
    /// reading it fails (the route answers 400) and the connection closes.
    pub body_timeout: Duration,
    /// How long a write to a client may wait for it to read; then the
    /// connection is closed (a client that never reads its answers).
    pub write_timeout: Duration,
    /// Connections one IP address may hold open at once; one more is
    /// closed as it is accepted.
    pub per_ip: usize,
}

/// The open connections of each address.
#[derive(Clone, Default)]
struct PerIp(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// The most connections open at once: three quarters of the descriptors
/// the process may open, so that the store, tools and peers always have
/// some (a client over it is closed as it is accepted).
fn connection_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    usize::try_from(soft.saturating_mul(3) / 4)
        .unwrap_or(usize::MAX)
        .max(64)
}

/// A connection's IO whose writes fail once one has waited
/// [`ConnLimits::write_timeout`] for the client to read: hyper then
/// closes the connection, and what it held goes.
struct WriteDeadline<T> {
    inner: T,
    timeout: Duration,
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteDeadline<T> {
    fn new(inner: T, timeout: Duration) -> Self {
        WriteDeadline {
            inner,
            timeout,
            waiting: None,
        }
    }

    /// `polled`, and once it has been pending past the timeout, an error.
    fn bounded<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>> {
        use std::task::Poll;
        if polled.is_ready() {
            self.waiting = None;
            return polled;
        }
        let timeout = self.timeout;
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bounded(cx, polled)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bounded(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.bounded(cx, polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One open connection of an address; dropped when it closes.
struct Held(PerIp, IpAddr);

impl PerIp {
    /// One more connection of `ip`, if it holds fewer than `limit` and all
    /// together fewer than `cap`.
    fn take(&self, ip: IpAddr, limit: usize, cap: usize) -> Option<Held> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Addresses are few next to connections: the sum is cheap enough.
        if open.values().sum::<usize>() >= cap {
            return None;
        }
        let n = open.entry(ip).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Held(self.clone(), ip))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = (self.0).0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

/// A request's body that fails once its deadline has passed: a client
/// that sends a body a little at a time holds a connection and a handler
/// no longer than the body timeout.
struct Timed<B> {
    inner: B,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<B> http_body::Body for Timed<B>
where
    B: http_body::Body<Data = axum::body::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(
                "the request's body did not arrive within the body timeout".into(),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The hyper service of `router`: each request's body timed from its head.
fn service(
    router: Router,
    limits: ConnLimits,
    mark: impl Fn(&mut axum::http::Extensions) + Clone + Send + 'static,
) -> impl Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = BoxFuture<'static, Result<axum::response::Response, std::convert::Infallible>>,
> + Clone {
    let tower = TowerToHyperService::new(router);
    service_fn(
        move |req: hyper::Request<hyper::body::Incoming>| -> BoxFuture<'static, _> {
            let (mut parts, body) = req.into_parts();
            mark(&mut parts.extensions);
            // No timer for a request without a body (a view, a stream).
            let body = match http_body::Body::is_end_stream(&body) {
                true => axum::body::Body::new(body),
                false => axum::body::Body::new(Timed {
                    inner: body,
                    deadline: Box::pin(tokio::time::sleep(limits.body_timeout)),
                }),
            };
            Box::pin(tower.call(hyper::Request::from_parts(parts, body)))
        },
    )
}

fn builder(limits: ConnLimits) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    b
}

/// Serve `router` on `listener` until `signal`, then until every open
/// connection is done.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnLimits,
    signal: impl Future<Output = ()>,
) {
    let connections = GracefulShutdown::new();
    let per_ip = PerIp::default();
    let cap = connection_cap();
    let mut signal = std::pin::pin!(signal);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, most likely: the connections
                    // open now close in time (the header timeout), so wait.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        () = &mut signal => break,
                    }
                }
            },
            () = &mut signal => break,
        };
        let Some(held) = per_ip.take(addr.ip(), limits.per_ip, cap) else {
            tracing::warn!(peer = %addr.ip(), per_ip = limits.per_ip, cap, "a connection refused: its address, or the server, holds as many as it may");
            continue;
        };
        // Small SSE frames and JSON answers go out at once, not after the
        // peer's delayed ACK (Nagle would hold them up to 40 ms).
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let service = service(router.clone(), limits, |_| {});
        let io = WriteDeadline::new(io, limits.write_timeout);
        let conn = builder(limits).serve_connection(TokioIo::new(io), service);
        let conn = connections.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
            drop(held);
        });
    }
    drop(listener);
    connections.shutdown().await;
}

/// How long a peer has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Serve `router` over TLS on `listener` (the peer port: `tls` asks each
/// client for a certificate of the tenant CA) until `signal`, then until
/// every open connection is done. Each connection's handshake runs in its
/// own task, so one that stalls holds up no other.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    limits: ConnLimits,
    signal: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = GracefulShutdown::new();
    let mut signal = std::pin::pin!(signal);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot accept a peer connection");
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let watcher = connections.watcher();
        tokio::spawn(async move {
            let io = match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                Ok(Ok(io)) => io,
                Ok(Err(e)) => {
                    tracing::info!(error = %e, "a peer connection refused: its TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::info!("a peer connection refused: no TLS handshake in time");
                    return;
                }
            };
            let service = service(router, limits, |e| {
                e.insert(bindery_api::peers::PeerPort);
            });
            let io = WriteDeadline::new(io, limits.write_timeout);
            let conn = builder(limits).serve_connection(TokioIo::new(io), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::trace!(error = %e, "peer connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}
