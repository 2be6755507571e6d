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

use std::future::Future;

use axum::serve::Listener;
use axum::Router;
use futures::future::BoxFuture;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// Serve `router` on `listener` until `signal`, then until every open
/// connection is done.
pub async fn serve<L: Listener>(mut listener: L, router: Router, signal: impl Future<Output = ()>) {
    let connections = GracefulShutdown::new();
    let mut signal = std::pin::pin!(signal);
    loop {
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = &mut signal => break,
        };
        let tower = TowerToHyperService::new(router.clone());
        let service = service_fn(move |req| -> BoxFuture<'static, _> { Box::pin(tower.call(req)) });
        let conn = http1::Builder::new().serve_connection(TokioIo::new(io), service);
        let conn = connections.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}

/// How long a peer has to finish its TLS handshake.
const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serve `router` over TLS on `listener` (the peer port: `tls` asks each
/// client for a certificate of the tenant CA) until `signal`, then until
/// every open connection is done. Each connection's handshake runs in its
/// own task, so one that stalls holds up no other.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: std::sync::Arc<rustls::ServerConfig>,
    router: Router,
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
            let service =
                service_fn(move |req| -> BoxFuture<'static, _> { Box::pin(tower.call(req)) });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(io), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::trace!(error = %e, "peer connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}
