//! airs-server: an OpenAI-compatible HTTP server over the airs runtime — `airs serve`.
//!
//! HTTP only: OpenAI types and their parsing ([`openai`]), server-sent events and answers
//! ([`routes`]), errors as statuses ([`error`]), the models served and loaded on demand
//! ([`models`]), authentication, CORS and limits (here), metrics, `/v1/pool` and the pool page
//! ([`status`]), the remote route ([`remote`]), and the connections themselves, limited in
//! number and in how long a silent client is waited for ([`connections`]). The engine runs on
//! its own threads (one per
//! loaded model, [`airs_runtime::service::Service`]); handlers submit requests and read events,
//! and never run or wait for the engine.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
//! `GET /v1/models`, `POST /tokenize`, `POST /detokenize`, `GET /health`, `GET /metrics`,
//! `GET /v1/pool`, `GET /` (the pool page).
//!
//! Safety: binds where it is told (the CLI defaults to 127.0.0.1); with an API key every
//! endpoint but `/health` and the (data-free) page needs `Authorization: Bearer <key>`; CORS
//! admits only localhost origins unless others are configured; bodies are limited (4 MiB by
//! default: 413 beyond); each model's queue is bounded (429 beyond); a client that disconnects
//! cancels its request; connections are limited in number and closed when their client is
//! silent too long; an engine that panics fails its requests (503) and its model is loaded
//! again; on shutdown the server stops accepting, lets running requests finish within a grace
//! period, cancels the rest, and returns (every completed session turn was committed when it
//! completed).
//!
//! Cost: per request, a parse and a channel; the engine's cost is the runtime's.

pub mod connections;
pub mod error;
pub mod models;
pub mod openai;
pub mod remote;
pub mod routes;
pub mod status;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::cors::{AllowOrigin, CorsLayer};

pub use crate::connections::ConnectionLimits;
use crate::error::ApiError;
use crate::models::Models;
use crate::remote::Remote;

/// Default body limit (4 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// How the server is set up (everything explicit: nothing is read from the environment).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub api_key: Option<String>,
    /// Origins CORS admits besides localhost ones (`*`: any).
    pub cors_origins: Vec<String>,
    pub max_body_bytes: usize,
    /// How long running requests may finish after a shutdown starts.
    pub grace: Duration,
    /// Connections open at once, and how long a silent client is waited for.
    pub connections: ConnectionLimits,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            api_key: None,
            cors_origins: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            grace: Duration::from_secs(10),
            connections: ConnectionLimits::default(),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub models: Arc<Models>,
    pub remote: Option<Remote>,
    pub config: Arc<ServerConfig>,
    shutting_down: Arc<AtomicBool>,
}

impl AppState {
    pub fn new(models: Models, remote: Option<Remote>, config: ServerConfig) -> AppState {
        AppState {
            models: Arc::new(models),
            remote,
            config: Arc::new(config),
            shutting_down: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// A body that may have exceeded the limit: 413 in OpenAI's shape.
fn body_or_413(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(format!("reading the request body: {e}"))
        }
    })
}

macro_rules! body_route {
    ($handler:path, headers) => {
        |state: State<AppState>,
         headers: axum::http::HeaderMap,
         body: Result<Bytes, BytesRejection>| async move {
            let limit = state.config.max_body_bytes;
            match body_or_413(body, limit) {
                Ok(b) => $handler(state, headers, b).await,
                Err(e) => e.into_response(),
            }
        }
    };
    ($handler:path) => {
        |state: State<AppState>, body: Result<Bytes, BytesRejection>| async move {
            let limit = state.config.max_body_bytes;
            match body_or_413(body, limit) {
                Ok(b) => $handler(state, b).await,
                Err(e) => e.into_response(),
            }
        }
    };
}

/// Whether `origin` is a page served from this machine.
fn localhost_origin(origin: &HeaderValue) -> bool {
    let Ok(o) = origin.to_str() else {
        return false;
    };
    let rest = o
        .strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"));
    let Some(rest) = rest else { return false };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        rest.split(':').next().unwrap_or("")
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

/// Requests need the API key (when one is set), but for `/health` and the page.
async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let path = request.uri().path();
        let open = path == "/health" || path == "/" || request.method() == Method::OPTIONS;
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !open && given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// One log line per request (stderr, through `tracing`).
async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    // Streams are logged when their headers go out; their end is the client's business.
    tracing::info!(
        %method,
        path,
        status,
        ms = format_args!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
        "request"
    );
    response
}

/// The application: every endpoint with its middleware.
pub fn router(state: AppState) -> Router {
    let origins = state.config.cors_origins.clone();
    let any = origins.iter().any(|o| o == "*");
    let allow = AllowOrigin::predicate(move |origin, _| {
        any || localhost_origin(origin) || origins.iter().any(|o| o.as_bytes() == origin.as_bytes())
    });
    let cors = CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]);
    let limit = state.config.max_body_bytes;
    Router::new()
        .route(
            "/v1/chat/completions",
            post(body_route!(routes::chat, headers)),
        )
        .route(
            "/v1/completions",
            post(body_route!(routes::completions, headers)),
        )
        .route(
            "/v1/embeddings",
            post(body_route!(routes::embeddings, headers)),
        )
        .route("/tokenize", post(body_route!(routes::tokenize)))
        .route("/detokenize", post(body_route!(routes::detokenize)))
        .route("/v1/models", get(status::models))
        .route("/health", get(status::health))
        .route("/metrics", get(status::metrics))
        .route("/v1/pool", get(status::pool))
        .route("/", get(status::page))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such endpoint")
                .into_response()
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(cors)
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Serve `state` on `listener` until `shutdown` resolves; then stop accepting, give running
/// requests the grace period, cancel the rest, and return. If the first model cannot be
/// loaded, the server shuts down the same way and returns that error: it was started to
/// serve that model.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    // The first model loads in the background; `/health` answers 503 until it is ready.
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let starting = {
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = state.models.start().await {
                tracing::error!("{}", e.message);
                let _ = failed_tx.send(e.message);
            }
        })
    };
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    // Returns why the server stopped when the first model's load stopped it.
    let draining = {
        let state = state.clone();
        tokio::spawn(async move {
            let failure = tokio::select! {
                _ = shutdown => None,
                Ok(message) = failed_rx => Some(message),
            };
            state.shutting_down.store(true, Ordering::Release);
            tracing::info!(
                grace_s = state.config.grace.as_secs_f64(),
                "shutting down: finishing running requests"
            );
            let _ = stopped_tx.send(());
            let models = Arc::clone(&state.models);
            let grace = state.config.grace;
            let (finished, cancelled) = tokio::task::spawn_blocking(move || models.shutdown(grace))
                .await
                .unwrap_or((0, 0));
            tracing::info!(finished, cancelled, "engines stopped");
            failure
        })
    };
    // Requests get the grace period, then are cancelled and end their responses; a client
    // that stopped reading gets a few seconds more before its connection is dropped.
    let drain = state.config.grace + Duration::from_secs(5);
    connections::serve(
        listener,
        app,
        state.config.connections,
        async {
            let _ = stopped_rx.await;
        },
        drain,
    )
    .await;
    let failure = draining.await.unwrap_or(None);
    starting.abort();
    match failure {
        Some(message) => Err(std::io::Error::other(message)),
        None => Ok(()),
    }
}
