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
//! Graceful shutdown is unchanged: on the signal no new connection is
//! taken, each open one finishes the response in flight, and the future
//! returns once all have closed.

use std::future::Future;

use axum::serve::Listener;
use axum::Router;
use hyper::server::conn::http1;
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
        let service = TowerToHyperService::new(router.clone());
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
