//! The remote route: requests for models not served here — every request on a device without a
//! model pool (the design's 2 GB tier), or with `--remote` any model this server does not have —
//! go to a remote OpenAI-compatible endpoint. The body is forwarded as the client sent it, with
//! the remote's key; the answer (streamed or not) is passed back as it arrives, with its status;
//! an unreachable remote is a 503.
//!
//! Cost: one upstream connection per request; bytes are copied through, never parsed.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::Value;

use crate::AppState;
use crate::error::ApiError;

/// Where the remote endpoint is.
#[derive(Clone, Debug)]
pub struct Remote {
    /// Base URL, e.g. `http://127.0.0.1:8081` (paths `/v1/...` are appended).
    pub url: String,
    pub api_key: Option<String>,
    pub client: reqwest::Client,
}

impl Remote {
    pub fn new(url: &str, api_key: Option<String>) -> Result<Remote, String> {
        let url = url.trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "--remote {url:?} is not an http:// or https:// URL"
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(Remote {
            url: url.strip_suffix("/v1").map_or(url.clone(), str::to_owned),
            api_key,
            client,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.url));
        match &self.api_key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// The remote's models (`data` of its `/v1/models`), or nothing when it does not answer.
    pub async fn models(&self) -> Vec<Value> {
        let r = self
            .request(reqwest::Method::GET, "/v1/models")
            .timeout(Duration::from_secs(3))
            .send()
            .await;
        let Ok(r) = r else { return Vec::new() };
        let Ok(bytes) = r.bytes().await else {
            return Vec::new();
        };
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            return Vec::new();
        };
        v["data"].as_array().cloned().unwrap_or_default()
    }
}

/// Forward `body` to the remote's `path` and pass its answer back.
pub async fn forward(
    state: &AppState,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let remote = state
        .remote
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("no remote endpoint is configured"))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let upstream = remote
        .request(reqwest::Method::POST, path)
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| ApiError::unavailable(format!("the remote endpoint {}: {e}", remote.url)))?;
    let status =
        StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = Response::builder().status(status);
    for name in [reqwest::header::CONTENT_TYPE, reqwest::header::RETRY_AFTER] {
        if let Some(v) = upstream.headers().get(&name)
            && let Ok(v) = HeaderValue::from_bytes(v.as_bytes())
        {
            out = out.header(name.as_str(), v);
        }
    }
    let stream = upstream
        .bytes_stream()
        .map(|r| r.map_err(std::io::Error::other));
    out.body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(e.to_string()))
}
