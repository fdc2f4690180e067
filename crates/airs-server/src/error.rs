//! Errors as the OpenAI API shapes them: `{"error": {"message", "type", "code"}}` with the HTTP
//! status that goes with them, and `Retry-After` on the statuses a client should retry
//! (429 queue full, 503 no memory or loading). Runtime errors map by their class
//! ([`airs_runtime::ErrorClass`]), never by their message.
//!
//! Cost: one allocation per error.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use airs_runtime::{ErrorClass, RuntimeError, RuntimeErrorKind};

/// Seconds a client is told to wait before retrying a 429 or 503.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// An error answer (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `rate_limit_error`, `server_error`.
    pub kind: &'static str,
    /// OpenAI's `code` (e.g. `context_length_exceeded`, `model_not_found`), if any.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// 400: the request is malformed or impossible.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or incorrect API key: send `Authorization: Bearer <key>`",
        )
        .with_code("invalid_api_key")
    }

    /// 404: no such model.
    pub fn unknown_model(model: &str, known: &[String]) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "the model {model:?} does not exist (this server serves {})",
                known.join(", ")
            ),
        )
        .with_code("model_not_found")
    }

    /// 413: the body is larger than the limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {limit} bytes"),
        )
        .with_code("request_too_large")
    }

    /// 503: not now (no memory, loading, shutting down, an engine that stopped on a panic,
    /// remote unreachable).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.code,
            }
        })
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> ApiError {
        let message = e.to_string();
        match e.class() {
            ErrorClass::BadRequest => {
                let err = ApiError::bad_request(message);
                match e.kind() {
                    // A prompt past the model's context, or past the whole KV pool.
                    RuntimeErrorKind::ContextFull { .. } | RuntimeErrorKind::PoolExhausted(_) => {
                        err.with_code("context_length_exceeded")
                    }
                    _ => err,
                }
            }
            ErrorClass::Overloaded => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
                    .with_code("queue_full")
            }
            ErrorClass::Unavailable => {
                let code = match e.kind() {
                    RuntimeErrorKind::ShuttingDown => "shutting_down",
                    RuntimeErrorKind::EngineFailed(_) => "engine_failed",
                    _ => "insufficient_memory",
                };
                ApiError::unavailable(message).with_code(code)
            }
            // A cancelled request has no client left to answer; if one is there, it is a 500.
            ErrorClass::Cancelled | ErrorClass::Internal => ApiError::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if retry {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        r
    }
}
