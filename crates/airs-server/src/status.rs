//! What the server says about itself: `/health`, `/v1/models` (each model with its memory),
//! `/metrics` (Prometheus text), `/v1/pool` (the model pool's account and every KV block's
//! holder) and `/`, the live pool page. Everything here reads the snapshots the engine threads
//! publish after their steps ([`airs_runtime::service::Status`]), so no reader ever waits for
//! an engine.
//!
//! Cost: a snapshot clone per model per request; the pool map is O(blocks).

use std::fmt::Write as _;

use airs_runtime::metrics::Histogram;
use airs_runtime::service::{ModelPoolUsage, Status};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{Value, json};

use crate::AppState;
use crate::models::Served;

/// The pool page: one self-contained HTML file (no build step, no external assets).
pub const POOL_PAGE: &str = include_str!("pool.html");

pub async fn health(State(state): State<AppState>) -> Response {
    if state.models.starting() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading model"})),
        )
            .into_response();
    }
    if state.is_shutting_down() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "shutting down"})),
        )
            .into_response();
    }
    axum::Json(json!({"status": "ok"})).into_response()
}

/// A model's memory and loader state.
fn memory_json(served: &Served, status: &Status) -> Value {
    let region = served.model.region().map(|r| r.stats());
    json!({
        "region_bytes": region.as_ref().map_or(served.model.model.image().bytes().len() as u64, |s| s.bytes),
        "resident_bytes": region.as_ref().map(|s| s.resident_bytes),
        "locked_bytes": region.as_ref().map_or(0, |s| s.locked_bytes),
        "huge_page_bytes": region.as_ref().map_or(0, |s| s.huge_page_bytes),
        "read_only": region.as_ref().is_none_or(|s| s.read_only),
        "pinned": region.as_ref().is_some_and(|s| s.pinned),
        "loader": served.model.loader_name(),
        "loading": status.loading,
        "loaded_bytes": status.loaded_bytes,
        "kv_blocks_total": status.pool.blocks_total,
        "kv_blocks_used": status.pool.blocks_used,
    })
}

pub async fn models(State(state): State<AppState>) -> Response {
    let loaded = state.models.loaded();
    let mut data = Vec::new();
    // Without a model pool nothing is served here: only the remote's models.
    let local = if state.models.local() {
        state.models.specs()
    } else {
        &[]
    };
    for spec in local {
        let served = loaded.iter().find(|s| s.spec.id == spec.id);
        let mut m = json!({
            "id": spec.id,
            "object": "model",
            "created": served.map_or(0, |s| s.created),
            "owned_by": "airs",
            "remote": false,
            "loaded": served.is_some(),
            "path": spec.path.as_ref().map(|p| p.display().to_string()),
        });
        if let Some(s) = served {
            let status = s.service.status();
            m["memory"] = memory_json(s, &status);
            // What one request can use: the model's context, or the whole KV pool if that
            // holds fewer positions (a longer prompt gets 400 `context_length_exceeded`).
            let pool_tokens =
                status.pool.blocks_total as usize * status.pool.tokens_per_block as usize;
            m["context_length"] = json!(s.model.context_len().min(pool_tokens));
            m["model_context_length"] = json!(s.model.context_len());
        }
        data.push(m);
    }
    if let Some(remote) = &state.remote {
        for mut m in remote.models().await {
            m["remote"] = json!(true);
            data.push(m);
        }
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

fn model_pool(state: &AppState) -> ModelPoolUsage {
    state
        .models
        .registry()
        .map(|r| r.pool().usage().into())
        .unwrap_or_default()
}

pub async fn pool(State(state): State<AppState>) -> Response {
    let models: Vec<Value> = state
        .models
        .loaded()
        .iter()
        .map(|s| {
            let status = s.service.status();
            json!({
                "id": s.spec.id,
                "region": memory_json(s, &status),
                "kv": status.pool,
                "sessions": status.sessions,
                "running": status.running,
                "waiting": status.waiting,
            })
        })
        .collect();
    axum::Json(json!({
        "model_pool": model_pool(&state),
        "models": models,
    }))
    .into_response()
}

pub async fn page() -> Html<&'static str> {
    Html(POOL_PAGE)
}

/// Writes a Prometheus histogram.
fn histogram(out: &mut String, name: &str, help: &str, series: &[(String, Histogram)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (labels, h) in series {
        for (le, count) in h.cumulative() {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                format!("{le}")
            };
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_seconds);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
    }
}

/// Writes one metric family of `kind` with one sample per `(labels, value)`.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let loaded = state.models.loaded();
    let snapshots: Vec<(String, Status, Option<u64>)> = loaded
        .iter()
        .map(|s| {
            let resident = s.model.region().map(|r| r.stats().resident_bytes);
            (
                format!("model=\"{}\"", s.spec.id),
                s.service.status(),
                resident,
            )
        })
        .collect();
    let per = |f: &dyn Fn(&Status) -> f64| -> Vec<(String, f64)> {
        snapshots
            .iter()
            .map(|(l, s, _)| (l.clone(), f(s)))
            .collect()
    };
    let mut out = String::new();
    family(
        &mut out,
        "airs_engine_failures_total",
        "counter",
        "Engine threads found stopped by a panic (each model then loaded again).",
        &[(String::new(), state.models.engine_failures() as f64)],
    );
    family(
        &mut out,
        "airs_requests_running",
        "gauge",
        "Sequences running (decoding or prefilling).",
        &per(&|s| s.running as f64),
    );
    family(
        &mut out,
        "airs_requests_waiting",
        "gauge",
        "Requests waiting for admission.",
        &per(&|s| s.waiting as f64),
    );
    family(
        &mut out,
        "airs_requests_total",
        "counter",
        "Requests accepted.",
        &per(&|s| s.stats.requests as f64),
    );
    family(
        &mut out,
        "airs_requests_failed_total",
        "counter",
        "Requests that failed after they were accepted.",
        &per(&|s| s.stats.failed as f64),
    );
    family(
        &mut out,
        "airs_requests_cancelled_total",
        "counter",
        "Requests cancelled (clients gone).",
        &per(&|s| s.stats.cancelled as f64),
    );
    family(
        &mut out,
        "airs_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        &per(&|s| s.stats.prompt_tokens as f64),
    );
    family(
        &mut out,
        "airs_generation_tokens_total",
        "counter",
        "Tokens generated.",
        &per(&|s| s.stats.generated_tokens as f64),
    );
    family(
        &mut out,
        "airs_constrained_redraws_total",
        "counter",
        "Draws of requests with a response_format that broke it and were drawn again from the \
         tokens it allows.",
        &per(&|s| s.stats.constrained_redraws as f64),
    );
    family(
        &mut out,
        "airs_draft_tokens_total",
        "counter",
        "Draft tokens computed by speculative decoding (prompt lookup).",
        &per(&|s| s.stats.draft_tokens as f64),
    );
    family(
        &mut out,
        "airs_draft_accepted_tokens_total",
        "counter",
        "Draft tokens kept: tokens generated without a step of their own.",
        &per(&|s| s.stats.drafts_accepted as f64),
    );
    // The step-time fit the scheduler weighs drafts by (absent until it has one).
    let fitted = |f: &dyn Fn(&airs_runtime::StepCost) -> f64| -> Vec<(String, f64)> {
        snapshots
            .iter()
            .filter_map(|(l, s, _)| s.step_cost.as_ref().map(|c| (l.clone(), f(c))))
            .collect()
    };
    family(
        &mut out,
        "airs_step_fixed_seconds",
        "gauge",
        "A step's time that does not grow with its rows, as the scheduler measures it (fitted \
         over recent steps; it weighs draft tokens by it).",
        &fitted(&|c| c.fixed_seconds),
    );
    family(
        &mut out,
        "airs_step_row_seconds",
        "gauge",
        "What a row (a token computed) adds to a step's time, as the scheduler measures it.",
        &fitted(&|c| c.row_seconds),
    );
    let ttft: Vec<(String, Histogram)> = snapshots
        .iter()
        .map(|(l, s, _)| (l.clone(), s.stats.time_to_first_token.clone()))
        .collect();
    histogram(
        &mut out,
        "airs_time_to_first_token_seconds",
        "Time from submission to the first token.",
        &ttft,
    );
    let itl: Vec<(String, Histogram)> = snapshots
        .iter()
        .map(|(l, s, _)| (l.clone(), s.stats.inter_token_latency.clone()))
        .collect();
    histogram(
        &mut out,
        "airs_inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
        &itl,
    );
    family(
        &mut out,
        "airs_kv_blocks_used",
        "gauge",
        "KV blocks referenced by sequences or session caches.",
        &per(&|s| s.pool.blocks_used as f64),
    );
    family(
        &mut out,
        "airs_kv_blocks_cached",
        "gauge",
        "KV blocks kept by the prefix index, reclaimable.",
        &per(&|s| s.pool.blocks_cached as f64),
    );
    family(
        &mut out,
        "airs_kv_blocks_total",
        "gauge",
        "KV blocks in the pool.",
        &per(&|s| s.pool.blocks_total as f64),
    );
    family(
        &mut out,
        "airs_prefix_cache_queried_tokens_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        &per(&|s| s.stats.prefix_queried_tokens as f64),
    );
    family(
        &mut out,
        "airs_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        &per(&|s| s.stats.prefix_hit_tokens as f64),
    );
    let by_priority = |f: &dyn Fn(&Status) -> &airs_runtime::PerPriority| -> Vec<(String, f64)> {
        let mut v = Vec::new();
        for (l, s, _) in &snapshots {
            for p in airs_runtime::Priority::ALL {
                v.push((format!("{l},priority=\"{}\"", p.name()), f(s).get(p) as f64));
            }
        }
        v
    };
    family(
        &mut out,
        "airs_preemptions_total",
        "counter",
        "Running sequences preempted (KV freed, recomputed later), by their priority.",
        &by_priority(&|s| &s.stats.preemptions),
    );
    family(
        &mut out,
        "airs_evictions_total",
        "counter",
        "Session caches evicted between turns, by the session's priority.",
        &by_priority(&|s| &s.stats.evictions),
    );
    family(
        &mut out,
        "airs_rebuilt_tokens_total",
        "counter",
        "Positions recomputed after eviction or preemption.",
        &per(&|s| s.stats.rebuilt_tokens as f64),
    );
    let mp = model_pool(&state);
    family(
        &mut out,
        "airs_model_pool_bytes",
        "gauge",
        "The model pool's account, by use.",
        &[
            ("use=\"weights\"".into(), mp.weights_bytes as f64),
            ("use=\"kv\"".into(), mp.kv_cache_bytes as f64),
            ("use=\"scratch\"".into(), mp.scratch_bytes as f64),
            ("use=\"free\"".into(), mp.free_bytes as f64),
            ("use=\"capacity\"".into(), mp.capacity_bytes as f64),
        ],
    );
    let resident: Vec<(String, f64)> = snapshots
        .iter()
        .map(|(l, s, r)| (l.clone(), r.unwrap_or(s.region_bytes) as f64))
        .collect();
    family(
        &mut out,
        "airs_weights_resident_bytes",
        "gauge",
        "Weight bytes resident in memory.",
        &resident,
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
