//! Connections: accepted up to a limit, each request head read within a timeout, streamed
//! without Nagle's delay, and closed gracefully at shutdown.
//!
//! Why not `axum::serve`: it accepts without limit and reads request heads without a
//! deadline, so clients that open connections and send nothing (a leaking client, a slow or
//! hostile one when the server listens beyond localhost) hold them forever; once the process
//! runs out of file descriptors (1024 by default on Raspberry Pi OS) nobody else is answered.
//! Here a connection needs one of [`ConnectionLimits::max_connections`] permits, taken before
//! `accept` (beyond it, new clients wait in the kernel's backlog instead of costing
//! descriptors), and hyper closes a connection whose next request head has not arrived within
//! [`ConnectionLimits::read_timeout`] — idle keep-alive connections included, as uvicorn's
//! and nginx's keep-alive timeouts do — which frees its permit; a request body that stalls as
//! long fails the request (400) and closes the connection. A request being answered is never
//! cut: the timeout runs only while the client is to send something. `TCP_NODELAY` is set on every
//! connection: streamed tokens are small writes that Nagle's algorithm would hold back until
//! the previous one is acknowledged.
//!
//! Shutdown: the listener closes, every connection finishes the request it is serving (the
//! models' grace period bounds that) and closes; idle ones close at once. A connection whose
//! client stopped reading cannot finish, so the wait is bounded too (`drain`): past it the
//! server returns and its runtime drops what is left.
//!
//! Cost: a semaphore permit and a spawned task per connection; a timer per awaited head.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::TimeoutBody;

/// Limits on the server's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; more wait to be accepted.
    pub max_connections: usize,
    /// Longest wait for a request head (after a connection opens, or between requests on a
    /// kept-alive one) before the connection is closed, and for each piece of a request's
    /// body before the request fails (400) and its connection is closed.
    pub read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 512,
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// Serve `app` on the connections `listener` accepts, within `limits`, until `stop`
/// resolves; then stop accepting and return once every connection has closed, or after
/// `drain` at the latest.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
    drain: Duration,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE) or memory: wait for connections to close.
                    // A connection reset before it was accepted is no error of ours.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = &mut stop => break,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        // Each request's body read with the same patience as its head.
        let read_timeout = limits.read_timeout;
        let service = tower::ServiceBuilder::new()
            .map_request(move |request: Request<Incoming>| {
                request.map(|body| Body::new(TimeoutBody::new(read_timeout, body)))
            })
            .service(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(read_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open {drain:?} after the shutdown began: closing them");
    }
}
