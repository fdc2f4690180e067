//! The endpoints that run models: chat completions, completions and embeddings (plain JSON or
//! server-sent events), and the tokenizer endpoints. Each request is handed to its model's
//! engine thread ([`airs_runtime::service::Service`]) and answered from the events that come
//! back; the HTTP side never runs the engine and never blocks it. A client that goes away
//! cancels its request (the receiver is dropped and the request cancelled, which frees its KV
//! blocks before the next step).
//!
//! Streams follow OpenAI: one id on every chunk, the role in each choice's first delta, the
//! text as it becomes final, a request with tools' calls as `tool_calls` deltas — a
//! `<tool_call>` block's as it is written (its name, then its arguments in pieces), other
//! calls each whole in one (text that may still open a call held back until it cannot:
//! [`ToolCallParser::streaming`]),
//! `finish_reason` (`stop`, `length` or `tool_calls`) in each choice's last chunk,
//! a usage chunk (empty `choices`) when `stream_options.include_usage` is set, then
//! `data: [DONE]`. Usage always carries `prompt_tokens_details.cached_tokens`.
//!
//! Cost: per request, one channel and the JSON of its chunks; per token, one event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use airs_runtime::tools::{self, ReplyPart, ToolCall, ToolCallParser};
use airs_runtime::{
    Event, LoadedModel, Request, RequestId, RuntimeError, RuntimeErrorKind, TokenEvent,
    TokenLogprobs, Usage,
};
use airs_tokenizer::TokenId;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::AppState;
use crate::error::ApiError;
use crate::models::{Route, Served};
use crate::openai::{self, Delivery};

/// A request in flight on a model: its events, and its cancellation when dropped unfinished.
pub struct Submission {
    served: Arc<Served>,
    id: RequestId,
    rx: mpsc::UnboundedReceiver<Event>,
    finished: bool,
}

impl Submission {
    /// Submit `request` to `served`'s engine. The submission tokenizes the prompt (milliseconds
    /// for a long one), so it runs on the blocking pool, not on an async worker.
    pub async fn start(served: Arc<Served>, request: Request) -> Submission {
        let (tx, rx) = mpsc::unbounded_channel();
        let service = Arc::clone(&served);
        let sink: airs_runtime::Sink = Box::new(move |e| tx.send(e).is_ok());
        let id = tokio::task::spawn_blocking(move || service.service.submit(request, sink))
            .await
            .expect("submitting a request does not panic");
        Submission {
            served,
            id,
            rx,
            finished: false,
        }
    }

    /// The next event; `None` once the stream ended. Events that end without `Done` or
    /// `Failed` (the engine thread stopped on a panic and dropped the request) end with a
    /// `Failed` naming the panic.
    pub async fn next(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let e = self.rx.recv().await.unwrap_or_else(|| {
            let why = self
                .served
                .service
                .failure()
                .unwrap_or("the engine thread ended without answering");
            Event::Failed(RuntimeError::new(RuntimeErrorKind::EngineFailed(
                why.to_string(),
            )))
        });
        if matches!(e, Event::Done(_) | Event::Failed(_)) {
            self.finished = true;
        }
        Some(e)
    }

    /// Wait for admission: the prompt's token count and how much of it was cached; a refusal
    /// (bad request, queue full, no memory) is its error.
    pub async fn admitted(&mut self) -> Result<(usize, usize), ApiError> {
        match self.next().await {
            Some(Event::Admitted {
                prompt_tokens,
                cached_tokens,
            }) => Ok((prompt_tokens, cached_tokens)),
            Some(Event::Failed(e)) => Err(e.into()),
            Some(_) => Err(ApiError::internal("events out of order")),
            None => Err(ApiError::internal("events after the end")),
        }
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if !self.finished {
            self.served.service.cancel(self.id);
        }
    }
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh response id with `prefix` (`chatcmpl`, `cmpl`).
fn response_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}-{:016x}{n:04x}", t ^ (n << 48))
}

/// The text of token `id` (its bytes, special tokens rendered) and those bytes.
fn token_text(model: &LoadedModel, id: u32) -> (String, Vec<u8>) {
    let mut bytes = Vec::new();
    model
        .tokenizer
        .append_token_bytes(TokenId(id), true, &mut bytes);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat `logprobs.content` entry of one token.
fn chat_logprob(model: &LoadedModel, t: &TokenEvent, lp: &TokenLogprobs) -> Value {
    let (text, bytes) = token_text(model, t.id);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(id, logprob)| {
            let (text, bytes) = token_text(model, id);
            json!({"token": text, "logprob": logprob, "bytes": bytes})
        })
        .collect();
    json!({"token": text, "logprob": lp.logprob, "bytes": bytes, "top_logprobs": top})
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Which endpoint's shape an answer takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Shape {
    Chat,
    Completion,
}

/// One choice's answer being collected.
#[derive(Default, Clone)]
struct ChoiceState {
    text: String,
    finish: Option<&'static str>,
    /// Chat: `logprobs.content` entries.
    chat_logprobs: Vec<Value>,
    /// Completions (legacy): tokens, their log-probabilities, top alternatives, offsets.
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    streamed_len: usize,
}

impl ChoiceState {
    fn add_token(&mut self, shape: Shape, model: &LoadedModel, t: &TokenEvent) {
        let Some(lp) = &t.logprobs else { return };
        match shape {
            Shape::Chat => self.chat_logprobs.push(chat_logprob(model, t, lp)),
            Shape::Completion => {
                let (text, _) = token_text(model, t.id);
                self.text_offset
                    .push(self.streamed_len + self.tokens.iter().map(String::len).sum::<usize>());
                self.tokens.push(text);
                self.token_logprobs.push(lp.logprob);
                let top: serde_json::Map<String, Value> = lp
                    .top
                    .iter()
                    .map(|&(id, l)| (token_text(model, id).0, json!(l)))
                    .collect();
                self.top_logprobs.push(Value::Object(top));
            }
        }
    }

    fn logprobs_json(&self, shape: Shape, asked: bool) -> Value {
        if !asked {
            return Value::Null;
        }
        match shape {
            Shape::Chat => json!({"content": self.chat_logprobs}),
            Shape::Completion => json!({
                "tokens": self.tokens,
                "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset,
            }),
        }
    }
}

/// Serve `request` on `served` and answer in `shape` with `delivery`.
async fn answer(
    served: Arc<Served>,
    request: Request,
    delivery: Delivery,
    shape: Shape,
) -> Result<Response, ApiError> {
    let model_id = served.spec.id.clone();
    let model = Arc::clone(&served.model);
    let mut sub = Submission::start(served, request).await;
    let (prompt_tokens, cached_tokens) = sub.admitted().await?;
    let id = response_id(match shape {
        Shape::Chat => "chatcmpl",
        Shape::Completion => "cmpl",
    });
    let created = unix_seconds();
    if delivery.stream {
        let stream = event_stream(sub, model, model_id, id, created, delivery, shape);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut choices = vec![ChoiceState::default(); delivery.n];
    let mut usage = Usage {
        prompt_tokens,
        cached_tokens,
        ..Usage::default()
    };
    while let Some(event) = sub.next().await {
        match event {
            Event::Token(t) => {
                if let Some(c) = choices.get_mut(t.choice) {
                    c.add_token(shape, &model, &t);
                }
            }
            Event::ChoiceEnd(end) => {
                if let Some(c) = choices.get_mut(end.choice) {
                    c.text = end.text;
                    c.finish = Some(end.reason.openai());
                }
            }
            Event::Done(d) => usage = d.usage,
            Event::Failed(e) => return Err(e.into()),
            Event::Admitted { .. } | Event::Embedding(_) => {}
        }
    }
    let asked = delivery.logprobs.is_some();
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match shape {
            Shape::Chat => {
                let (message, finish) = reply_message(&c.text, c.finish, &delivery);
                json!({
                    "index": i,
                    "message": message,
                    "logprobs": c.logprobs_json(shape, asked),
                    "finish_reason": finish,
                })
            }
            Shape::Completion => json!({
                "index": i,
                "text": c.text,
                "logprobs": c.logprobs_json(shape, asked),
                "finish_reason": c.finish,
            }),
        })
        .collect();
    let object = match shape {
        Shape::Chat => "chat.completion",
        Shape::Completion => "text_completion",
    };
    Ok(axum::Json(json!({
        "id": id,
        "object": object,
        "created": created,
        "model": model_id,
        "choices": choices,
        "usage": usage_json(&usage),
    }))
    .into_response())
}

/// A fresh id for a tool call.
fn call_id() -> String {
    response_id("call").replace('-', "_")
}

/// A call as OpenAI's `tool_calls[k]` (with `index` when streamed).
fn call_json(call: &ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(k) = index {
        v["index"] = json!(k);
    }
    v
}

/// A chat reply as OpenAI's `message` and its `finish_reason`: with the request's tools, the
/// calls read out of the text (`tool_calls`, the text around them as `content`, null when
/// there is none) and `tool_calls` for a reply that ended by itself.
fn reply_message(
    text: &str,
    finish: Option<&'static str>,
    delivery: &Delivery,
) -> (Value, Option<&'static str>) {
    let Some(tools) = &delivery.tools else {
        return (json!({"role": "assistant", "content": text}), finish);
    };
    let (content, mut calls) = tools::parse_reply(tools, text);
    if calls.is_empty() {
        return (json!({"role": "assistant", "content": content}), finish);
    }
    if !delivery.parallel_tool_calls {
        calls.truncate(1);
    }
    let content = content.trim();
    let message = json!({
        "role": "assistant",
        "content": if content.is_empty() { Value::Null } else { json!(content) },
        "tool_calls": calls.iter().map(|c| call_json(c, None)).collect::<Vec<_>>(),
    });
    (
        message,
        finish.map(|f| if f == "stop" { "tool_calls" } else { f }),
    )
}

/// One choice of a stream: its collected state and, with tools, its call reader and the
/// calls sent so far.
struct StreamChoice {
    state: ChoiceState,
    parser: Option<ToolCallParser>,
    calls: usize,
    /// A call is being streamed (its header sent, its arguments following).
    open_call: bool,
}

/// What a reply part becomes in a chat stream's delta.
#[derive(Debug, PartialEq)]
enum PartDelta {
    /// Text: a `content` delta.
    Content(String),
    /// A `tool_calls` delta (`[{"index", ...}]`).
    ToolCalls(Value),
}

impl StreamChoice {
    /// The deltas of `parts`: text as content, calls as `tool_calls` — a whole call in one
    /// delta (id, type, name and arguments), a streamed one as a delta of its id, type, name
    /// and empty arguments, then one per piece of its arguments. Without `parallel` calls
    /// after the first are dropped.
    fn deltas(&mut self, parts: Vec<ReplyPart>, parallel: bool) -> Vec<PartDelta> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                ReplyPart::Text(text) => out.push(PartDelta::Content(text)),
                ReplyPart::Call(call) if parallel || self.calls == 0 => {
                    out.push(PartDelta::ToolCalls(json!([call_json(
                        &call,
                        Some(self.calls)
                    )])));
                    self.calls += 1;
                }
                ReplyPart::CallBegin { name } if parallel || self.calls == 0 => {
                    let call = ToolCall {
                        name,
                        arguments: String::new(),
                    };
                    out.push(PartDelta::ToolCalls(json!([call_json(
                        &call,
                        Some(self.calls)
                    )])));
                    self.open_call = true;
                }
                ReplyPart::CallArguments(piece) if self.open_call => {
                    out.push(PartDelta::ToolCalls(
                        json!([{"index": self.calls, "function": {"arguments": piece}}]),
                    ));
                }
                ReplyPart::CallEnd(_) if self.open_call => {
                    self.open_call = false;
                    self.calls += 1;
                }
                ReplyPart::Call(_)
                | ReplyPart::CallBegin { .. }
                | ReplyPart::CallArguments(_)
                | ReplyPart::CallEnd(_) => {}
            }
        }
        out
    }
}

/// The SSE events of a streamed answer (see the module documentation).
fn event_stream(
    sub: Submission,
    model: Arc<LoadedModel>,
    model_id: String,
    id: String,
    created: u64,
    delivery: Delivery,
    shape: Shape,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let object = match shape {
        Shape::Chat => "chat.completion.chunk",
        Shape::Completion => "text_completion",
    };
    let chunk = move |choices: Value, usage: Option<Value>| {
        let mut v = json!({
            "id": id,
            "object": object,
            "created": created,
            "model": model_id,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        SseEvent::default().data(v.to_string())
    };
    let mut queue: VecDeque<SseEvent> = VecDeque::new();
    if shape == Shape::Chat {
        for i in 0..delivery.n {
            queue.push_back(chunk(
                json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                None,
            ));
        }
    }
    let asked = delivery.logprobs.is_some();
    let content = move |i: usize, text: &str, logprobs: Value| match shape {
        Shape::Chat => {
            json!([{"index": i, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}])
        }
        Shape::Completion => {
            json!([{"index": i, "text": text, "logprobs": logprobs, "finish_reason": null}])
        }
    };
    let parallel = delivery.parallel_tool_calls;
    // The chunks of a choice's reply parts: text as content, calls as tool_calls deltas.
    let parts_chunks = move |c: &mut StreamChoice, i: usize, parts: Vec<ReplyPart>, lp: Value| {
        let mut chunks = Vec::new();
        let mut lp = Some(lp);
        for delta in c.deltas(parts, parallel) {
            chunks.push(match delta {
                PartDelta::Content(text) => content(i, &text, lp.take().unwrap_or(Value::Null)),
                PartDelta::ToolCalls(calls) => json!([{"index": i, "delta": {"tool_calls": calls}, "logprobs": null, "finish_reason": null}]),
            });
        }
        if let Some(lp) = lp.filter(|lp| !lp.is_null()) {
            chunks.push(content(i, "", lp));
        }
        chunks
    };
    let finish = move |i: usize, reason: &str| match shape {
        Shape::Chat => {
            json!([{"index": i, "delta": {}, "logprobs": null, "finish_reason": reason}])
        }
        Shape::Completion => {
            json!([{"index": i, "text": "", "logprobs": null, "finish_reason": reason}])
        }
    };
    let choices: Vec<StreamChoice> = (0..delivery.n)
        .map(|_| StreamChoice {
            state: ChoiceState::default(),
            parser: delivery
                .tools
                .as_ref()
                .map(|t| ToolCallParser::streaming(Arc::clone(t))),
            calls: 0,
            open_call: false,
        })
        .collect();
    let state = (sub, queue, false, choices);
    stream::unfold(
        state,
        move |(mut sub, mut queue, mut ended, mut choices)| {
            let model = Arc::clone(&model);
            let chunk = chunk.clone();
            async move {
                loop {
                    if let Some(e) = queue.pop_front() {
                        return Some((Ok(e), (sub, queue, ended, choices)));
                    }
                    if ended {
                        return None;
                    }
                    match sub.next().await {
                        Some(Event::Token(t)) => {
                            let Some(c) = choices.get_mut(t.choice) else {
                                continue;
                            };
                            let lp = if asked && t.logprobs.is_some() {
                                let mut one = ChoiceState {
                                    streamed_len: c.state.streamed_len,
                                    ..ChoiceState::default()
                                };
                                one.add_token(shape, &model, &t);
                                one.logprobs_json(shape, true)
                            } else {
                                Value::Null
                            };
                            c.state.streamed_len += t.text.len();
                            if let Some(parser) = &mut c.parser {
                                let parts = parser.push(&t.text);
                                for v in parts_chunks(c, t.choice, parts, lp) {
                                    queue.push_back(chunk(v, None));
                                }
                            } else if !t.text.is_empty() || !lp.is_null() {
                                queue.push_back(chunk(content(t.choice, &t.text, lp), None));
                            }
                        }
                        Some(Event::ChoiceEnd(end)) => {
                            let mut reason = end.reason.openai();
                            if let Some(c) = choices.get_mut(end.choice)
                                && let Some(mut parser) = c.parser.take()
                            {
                                let mut parts = parser.push(&end.tail);
                                parts.extend(parser.finish());
                                for v in parts_chunks(c, end.choice, parts, Value::Null) {
                                    queue.push_back(chunk(v, None));
                                }
                                if c.calls > 0 && reason == "stop" {
                                    reason = "tool_calls";
                                }
                            } else if !end.tail.is_empty() {
                                queue.push_back(chunk(
                                    content(end.choice, &end.tail, Value::Null),
                                    None,
                                ));
                            }
                            queue.push_back(chunk(finish(end.choice, reason), None));
                        }
                        Some(Event::Done(d)) => {
                            if delivery.include_usage {
                                queue.push_back(chunk(json!([]), Some(usage_json(&d.usage))));
                            }
                            queue.push_back(SseEvent::default().data("[DONE]"));
                            ended = true;
                        }
                        Some(Event::Failed(e)) => {
                            let e = ApiError::from(e);
                            queue.push_back(SseEvent::default().data(e.body().to_string()));
                            queue.push_back(SseEvent::default().data("[DONE]"));
                            ended = true;
                        }
                        Some(Event::Admitted { .. } | Event::Embedding(_)) => {}
                        // After `Done` or `Failed` (`Submission::next` ends every stream
                        // with one), nothing more comes.
                        None => ended = true,
                    }
                }
            }
        },
    )
}

/// Route a request naming `model`: local (loaded on demand) or remote.
async fn route(state: &AppState, model: Option<&str>) -> Result<Route, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the server is shutting down").with_code("shutting_down"));
    }
    state.models.route(model, state.remote.is_some()).await
}

pub async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        let req: openai::ChatRequest = openai::parse(&body, "chat completion")?;
        match route(&state, req.model.as_deref()).await? {
            Route::Remote => {
                crate::remote::forward(&state, "/v1/chat/completions", &headers, body).await
            }
            Route::Local(served) => {
                let (request, delivery) = openai::chat_request(&req, &served.model)?;
                answer(served, request, delivery, Shape::Chat).await
            }
        }
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let req: openai::CompletionRequest = openai::parse(&body, "completion")?;
        match route(&state, req.model.as_deref()).await? {
            Route::Remote => {
                crate::remote::forward(&state, "/v1/completions", &headers, body).await
            }
            Route::Local(served) => {
                let (request, delivery) = openai::completion_request(&req, &served.model)?;
                answer(served, request, delivery, Shape::Completion).await
            }
        }
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

pub async fn embeddings(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let req: openai::EmbeddingRequest = openai::parse(&body, "embedding")?;
        let served = match route(&state, req.model.as_deref()).await? {
            Route::Remote => {
                return crate::remote::forward(&state, "/v1/embeddings", &headers, body).await;
            }
            Route::Local(s) => s,
        };
        let (requests, base64) = openai::embedding_requests(&req)?;
        // Every input at once: the scheduler batches them.
        let mut subs: Vec<Submission> = Vec::with_capacity(requests.len());
        for r in requests {
            subs.push(Submission::start(Arc::clone(&served), r).await);
        }
        let mut data = Vec::with_capacity(subs.len());
        let mut prompt_tokens = 0;
        for (i, sub) in subs.iter_mut().enumerate() {
            sub.admitted().await?;
            let mut vector = None;
            while let Some(e) = sub.next().await {
                match e {
                    Event::Embedding(v) => {
                        prompt_tokens += v.prompt_tokens;
                        vector = Some(v.values);
                    }
                    Event::Failed(e) => return Err(e.into()),
                    _ => {}
                }
            }
            let v = vector.ok_or_else(|| ApiError::internal("no embedding"))?;
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(openai::base64(&bytes))
            } else {
                json!(v)
            };
            data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
        }
        Ok(axum::Json(json!({
            "object": "list",
            "data": data,
            "model": served.spec.id,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }))
        .into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

pub async fn tokenize(State(state): State<AppState>, body: Bytes) -> Response {
    let result = async {
        let req: openai::TokenizeRequest = openai::parse(&body, "tokenize")?;
        let Route::Local(served) = route(&state, req.model.as_deref()).await? else {
            return Err(ApiError::bad_request("tokenize needs a model served here"));
        };
        let tok = &served.model.tokenizer;
        let options = airs_tokenizer::EncodeOptions {
            add_bos: req.add_special.unwrap_or(false) && tok.add_bos(),
            parse_special: true,
        };
        let ids: Vec<u32> = tok
            .encode(&req.content, options)
            .into_iter()
            .map(u32::from)
            .collect();
        let tokens = if req.with_pieces.unwrap_or(false) {
            json!(
                ids.iter()
                    .map(|&id| json!({"id": id, "piece": token_text(&served.model, id).0}))
                    .collect::<Vec<_>>()
            )
        } else {
            json!(ids)
        };
        Ok(axum::Json(json!({"tokens": tokens})).into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

pub async fn detokenize(State(state): State<AppState>, body: Bytes) -> Response {
    let result = async {
        let req: openai::DetokenizeRequest = openai::parse(&body, "detokenize")?;
        let Route::Local(served) = route(&state, req.model.as_deref()).await? else {
            return Err(ApiError::bad_request(
                "detokenize needs a model served here",
            ));
        };
        let vocab = served.model.model.config.vocab_len;
        if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad_request(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        Ok(axum::Json(json!({"content": served.model.decode(&req.tokens)})).into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use airs_runtime::json_schema::SchemaValue;
    use airs_runtime::tools::Tools;

    fn choice(tools: &Arc<Tools>) -> StreamChoice {
        StreamChoice {
            state: ChoiceState::default(),
            parser: Some(ToolCallParser::streaming(Arc::clone(tools))),
            calls: 0,
            open_call: false,
        }
    }

    #[test]
    fn a_tagged_call_streams_as_a_header_then_argument_pieces() {
        let list: Vec<SchemaValue> =
            serde_json::from_str(include_str!("../../../testdata/tools/weather-and-add.json"))
                .unwrap();
        let tools = Arc::new(Tools::from_openai(&list).unwrap());
        let reply = [
            "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci",
            "ty\": \"Paris\"",
            "}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}",
            "\n</tool_call>",
        ];
        for parallel in [true, false] {
            let mut c = choice(&tools);
            let mut deltas = Vec::new();
            for piece in reply {
                let parts = c.parser.as_mut().unwrap().push(piece);
                deltas.extend(c.deltas(parts, parallel));
            }
            let parts = c.parser.take().unwrap().finish();
            deltas.extend(c.deltas(parts, parallel));
            assert_eq!(deltas[0], PartDelta::Content("Checking.\n".into()));
            // As OpenAI's client accumulates them: by index, names and arguments joined.
            let mut calls: Vec<(String, String)> = Vec::new();
            for d in &deltas[1..] {
                let PartDelta::ToolCalls(v) = d else {
                    panic!("{d:?}")
                };
                let k = v[0]["index"].as_u64().unwrap() as usize;
                if k == calls.len() {
                    assert_eq!(v[0]["type"], "function", "{v}");
                    assert!(v[0]["id"].as_str().unwrap().starts_with("call_"), "{v}");
                    calls.push(Default::default());
                }
                let f = &v[0]["function"];
                calls[k].0 += f["name"].as_str().unwrap_or("");
                calls[k].1 += f["arguments"].as_str().unwrap_or("");
            }
            let got: Vec<(&str, &str)> = calls
                .iter()
                .map(|(n, a)| (n.as_str(), a.as_str()))
                .collect();
            let want = [
                ("get_weather", r#"{"city":"Paris"}"#),
                ("add", r#"{"a":1,"b":2}"#),
            ];
            assert_eq!(
                got,
                want[..if parallel { 2 } else { 1 }],
                "parallel {parallel}"
            );
            assert_eq!(c.calls, got.len());
            // The first call came in pieces: its header and more than one piece of arguments.
            assert!(deltas.len() >= 4, "{deltas:?}");
        }
    }
}
