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
    /// Connections one IP address may hold open at once; one more is
    /// closed as it is accepted.
    pub per_ip: usize,
}

/// The open connections of each address.
#[derive(Clone, Default)]
struct PerIp(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One open connection of an address; dropped when it closes.
struct Held(PerIp, IpAddr);

impl PerIp {
    fn take(&self, ip: IpAddr, limit: usize) -> Option<Held> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
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
        let Some(held) = per_ip.take(addr.ip(), limits.per_ip) else {
            tracing::warn!(peer = %addr.ip(), limit = limits.per_ip, "a connection refused: its address holds as many as it may");
            continue;
        };
        // Small SSE frames and JSON answers go out at once, not after the
        // peer's delayed ACK (Nagle would hold them up to 40 ms).
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let tower = TowerToHyperService::new(router.clone());
        let service = service_fn(move |req| -> BoxFuture<'static, _> { Box::pin(tower.call(req)) });
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
            let tower = TowerToHyperService::new(router);
            let service = service_fn(move |mut req: hyper::Request<_>| -> BoxFuture<'static, _> {
                req.extensions_mut().insert(crate::api::origin::PeerPort);
                Box::pin(tower.call(req))
            });
            let conn = builder(limits).serve_connection(TokioIo::new(io), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::trace!(error = %e, "peer connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}
