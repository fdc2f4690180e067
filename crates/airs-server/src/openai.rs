//! The OpenAI request bodies airs accepts, parsed from untrusted bytes into the runtime's
//! [`Request`] with typed errors: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `POST /v1/embeddings`, and llama.cpp's `POST /tokenize` / `POST /detokenize`.
//!
//! Honoured fields: `model`, `messages` (system/developer/user/assistant; content a string or
//! an array of text parts), `prompt` (a string or token ids), `max_tokens` and
//! `max_completion_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop` (a string or
//! an array), `presence_penalty`, `frequency_penalty`, `repeat_penalty` (llama.cpp's),
//! `logprobs`/`top_logprobs`, `n`, `stream`, `stream_options.include_usage`, `logit_bias`
//! (token id → bias in [-100, 100], -100 a ban; up to [`MAX_LOGIT_BIAS`] tokens),
//! `response_format` (`text`; `json_object`: the reply is one JSON object,
//! [`airs_runtime::constraint`]; `json_schema`: one object the schema accepts, for the subset
//! [`airs_runtime::json_schema`] enforces, any other schema refused with 400), function calling
//! (`tools` of type `function`, `tool_choice` `none`/`auto`/`required`/a named function,
//! `parallel_tool_calls`, assistant messages' `tool_calls` and `tool` messages;
//! [`airs_runtime::tools`]), `user` (accepted, unused); airs extensions `priority`
//! (`interactive`, `system`, `background`) and `session` (a persistent conversation's name: the
//! client sends only the new message, or the `tool` results of the calls the last reply made;
//! a session's tools are set by its first turn). Unknown fields are accepted and ignored, except the
//! deprecated `functions`, which is refused with 400 rather than ignored. Sampling defaults are llama.cpp's server's (temperature 0.8,
//! top-k 40, top-p 0.95, min-p 0.05, a random seed), not OpenAI's (temperature 1, no top-k or
//! min-p), because small local models need the tail cut; `max_tokens` defaults to the rest of
//! the context.
//!
//! Everything here is a pure function of the bytes and the model (fuzzed: `fuzz/`), so a
//! hostile body can only produce an [`ApiError`], never a panic or an unbounded allocation:
//! the body itself is bounded by the server's limit before it gets here, and counts inside it
//! (messages, stop strings, token ids) are bounded by that.
//!
//! Cost: one JSON parse; rendering the chat template is linear in the conversation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use airs_engine::SamplerConfig;
use airs_runtime::json_schema::{Schema, SchemaValue};
use airs_runtime::tools::{ToolChoice, Tools};
use airs_runtime::{
    GenerationParams, LoadedModel, OutputFormat, Priority, Prompt, Request, SessionTurn,
};
use airs_tokenizer::chat::{ChatMessage, ChatToolCall};
use serde::Deserialize;

use crate::error::ApiError;

/// Most messages in one chat request.
pub const MAX_MESSAGES: usize = 4096;
/// Most stop strings (as OpenAI: 4; airs takes up to 16).
pub const MAX_STOPS: usize = 16;
/// Most tokens in one `logit_bias`.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// `content`: a string or an array of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant message's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// `messages[i].tool_calls[j]`: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, the arguments a JSON text (as OpenAI sends them) or an object.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageToolCall {
    #[serde(default)]
    pub id: Option<String>,
    pub function: MessageFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessageFunction {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<SchemaValue>,
}

/// `stop`: a string or an array of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema", "json_schema": ...}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`: OpenAI's `{"name", "schema", "strict", "description"}`, of
/// which only the schema matters here (airs always holds the reply to it).
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub schema: Option<SchemaValue>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The sampling and limit fields chat and completions share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub repeat_penalty: Option<f64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Token id (a string, as JSON keys are) → bias in [-100, 100].
    #[serde(default)]
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    #[serde(default)]
    pub priority: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// airs: the persistent session this message belongs to.
    #[serde(default)]
    pub session: Option<String>,
    /// Function calling: the tools the reply may call ([`airs_runtime::tools`]).
    #[serde(default)]
    pub tools: Option<Vec<SchemaValue>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name"}}`.
    #[serde(default)]
    pub tool_choice: Option<SchemaValue>,
    /// `false`: at most one call per reply (the first).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The deprecated form of `tools`: refused when given, never ignored, so that a client
    /// learns at once that no call will come that way.
    #[serde(default)]
    pub functions: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt`: a string, one string in an array, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// Legacy: the number of most likely tokens to report per position.
    #[serde(default)]
    pub logprobs: Option<i64>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `input` of `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32, what the `openai` client asks for).
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub priority: Option<String>,
}

/// `POST /tokenize` (llama.cpp's).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub content: String,
    /// Add BOS as the model wants it (default false, as llama.cpp).
    #[serde(default)]
    pub add_special: Option<bool>,
    /// Also return each token's text.
    #[serde(default)]
    pub with_pieces: Option<bool>,
}

/// `POST /detokenize` (llama.cpp's).
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// Parse a JSON body of type `T`, with a clear 400 when it is not one.
pub fn parse<'a, T: Deserialize<'a>>(body: &'a [u8], what: &str) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the request body is empty: expected a JSON {what} request"
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid {what} request: {e}")))
}

/// How the answer is to be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub stream: bool,
    pub include_usage: bool,
    /// Top log-probabilities per token, when asked for.
    pub logprobs: Option<usize>,
    pub n: usize,
    /// The tools whose calls are read out of each reply, when the reply may call them.
    pub tools: Option<Arc<Tools>>,
    /// Every call of a reply (true), or only its first.
    pub parallel_tool_calls: bool,
}

/// The priority field (interactive unless given).
pub fn priority(field: Option<&str>) -> Result<Priority, ApiError> {
    match field {
        None => Ok(Priority::Interactive),
        Some(p) => p.parse().map_err(|e: String| ApiError::bad_request(e)),
    }
}

/// A seed for requests that give none: different every time (as OpenAI and llama.cpp).
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = t ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

fn finite(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::bad_request(format!(
            "{name} must be between {lo} and {hi}, not {x}"
        ))),
    }
}

/// The runtime's generation parameters and the delivery of `s`, for a model of `context_len`
/// positions; `logprobs` is the number of top alternatives asked for, if any.
pub fn generation(
    s: &Sampling,
    logprobs: Option<usize>,
    context_len: usize,
    vocab_len: usize,
) -> Result<(GenerationParams, Delivery), ApiError> {
    let max_tokens = match s.max_completion_tokens.or(s.max_tokens) {
        None => context_len,
        Some(m) if m >= 1 => (m as u64).min(context_len as u64) as usize,
        Some(m) => {
            return Err(ApiError::bad_request(format!(
                "max_tokens must be at least 1, not {m}"
            )));
        }
    };
    let n = match s.n {
        None => 1,
        Some(n) if (1..=16).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "n must be between 1 and 16, not {n}"
            )));
        }
    };
    let stop = match &s.stop {
        None => Vec::new(),
        Some(Stop::One(t)) => vec![t.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_STOPS} stop strings, not {}",
            stop.len()
        )));
    }
    let top_k = match s.top_k {
        None => 40,
        Some(k) if k <= 0 => 0,
        Some(k) => k.min(1 << 20) as usize,
    };
    let logit_bias = logit_bias(s.logit_bias.as_ref(), vocab_len)?;
    let d = SamplerConfig::default();
    let sampler = SamplerConfig {
        temperature: finite("temperature", s.temperature, 0.0, 100.0)?.unwrap_or(0.8),
        top_k,
        // top_p 0 keeps only the most likely token (the nucleus needs a positive bound).
        top_p: finite("top_p", s.top_p, 0.0, 1.0)?.map_or(0.95, |p| p.max(f32::MIN_POSITIVE)),
        min_p: finite("min_p", s.min_p, 0.0, 1.0)?.unwrap_or(0.05),
        repeat_penalty: finite("repeat_penalty", s.repeat_penalty, 0.0, 100.0)?
            .filter(|&p| p > 0.0)
            .unwrap_or(1.0),
        presence_penalty: finite("presence_penalty", s.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: finite("frequency_penalty", s.frequency_penalty, -2.0, 2.0)?
            .unwrap_or(0.0),
        seed: s.seed.map_or_else(fresh_seed, |x| x as u64),
        logit_bias,
        ..d
    };
    let format = match &s.response_format {
        None => OutputFormat::Text,
        Some(f) => match (f.kind.as_str(), &f.json_schema) {
            ("text", _) => OutputFormat::Text,
            ("json_object", _) => OutputFormat::JsonObject,
            (
                "json_schema",
                Some(JsonSchemaFormat {
                    schema: Some(schema),
                    ..
                }),
            ) => {
                let compiled = Schema::compile(schema).map_err(|e| {
                    ApiError::bad_request(format!("response_format json_schema: {e}"))
                })?;
                OutputFormat::JsonSchema(Arc::new(compiled))
            }
            ("json_schema", _) => {
                return Err(ApiError::bad_request(
                    "response_format json_schema needs json_schema.schema".to_string(),
                ));
            }
            (other, _) => {
                return Err(ApiError::bad_request(format!(
                    "response_format type must be \"text\", \"json_object\" or \"json_schema\", \
                     not {other:?}"
                )));
            }
        },
    };
    let params = GenerationParams {
        max_tokens,
        stop,
        sampler,
        logprobs,
        n,
        ignore_eos: false,
        format,
    };
    let delivery = Delivery {
        stream: s.stream.unwrap_or(false),
        include_usage: s
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        logprobs,
        n,
        tools: None,
        parallel_tool_calls: true,
    };
    Ok((params, delivery))
}

/// `logit_bias` as the sampler takes it: token ids inside the vocabulary, biases in
/// [-100, 100], and -100 a ban (−∞), as OpenAI documents it ("should result in a ban").
fn logit_bias(
    map: Option<&std::collections::BTreeMap<String, f64>>,
    vocab_len: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::bad_request(format!(
            "logit_bias holds at most {MAX_LOGIT_BIAS} tokens, not {}",
            map.len()
        )));
    }
    map.iter()
        .map(|(key, &bias)| {
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab_len)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "logit_bias keys must be token ids below {vocab_len}, not {key:?}"
                    ))
                })?;
            if !(-100.0..=100.0).contains(&bias) {
                return Err(ApiError::bad_request(format!(
                    "logit_bias values must be between -100 and 100, not {bias}"
                )));
            }
            let bias = if bias <= -100.0 {
                f32::NEG_INFINITY
            } else {
                bias as f32
            };
            Ok((id, bias))
        })
        .collect()
}

/// A message's text: the string, or its text parts joined.
fn text_of(m: &Message) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for p in parts {
                if p.kind != "text" {
                    return Err(ApiError::bad_request(format!(
                        "content parts of type {:?} are not supported (only \"text\")",
                        p.kind
                    )));
                }
                out.push_str(p.text.as_deref().unwrap_or(""));
            }
            Ok(out)
        }
    }
}

/// A message's role as the chat template knows it.
fn role_of(m: &Message) -> Result<&'static str, ApiError> {
    match m.role.as_str() {
        "system" | "developer" => Ok("system"),
        "user" => Ok("user"),
        "assistant" => Ok("assistant"),
        "tool" => Ok("tool"),
        other => Err(ApiError::bad_request(format!(
            "messages with role {other:?} are not supported (system, user, assistant, tool)"
        ))),
    }
}

/// A message as the chat template takes it: role, text, calls (arguments as JSON text) and
/// the call a tool result answers.
fn chat_message(m: &Message) -> Result<ChatMessage, ApiError> {
    let role = role_of(m)?;
    let mut message = ChatMessage::new(role, text_of(m)?);
    for (i, call) in m.tool_calls.iter().flatten().enumerate() {
        if role != "assistant" {
            return Err(ApiError::bad_request(
                "only assistant messages carry tool_calls",
            ));
        }
        let arguments = match &call.function.arguments {
            None => "{}".to_owned(),
            Some(SchemaValue::String(text)) => text.clone(),
            Some(value) => value.to_json(),
        };
        message.tool_calls.push(ChatToolCall {
            id: call.id.clone().unwrap_or_else(|| format!("call_{i}")),
            name: call.function.name.clone(),
            arguments,
        });
    }
    message.tool_call_id = m.tool_call_id.clone();
    Ok(message)
}

/// `tool_choice`: auto unless given; a call can be required only of tools that exist.
fn tool_choice(field: Option<&SchemaValue>) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
             \"function\": {\"name\": ...}}",
        )
    };
    match field {
        None => Ok(ToolChoice::Auto),
        Some(SchemaValue::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Some(SchemaValue::Object(members)) => {
            let get = |v: &SchemaValue, key: &str| match v {
                SchemaValue::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()),
                _ => None,
            };
            let object = SchemaValue::Object(members.clone());
            match get(&object, "function").and_then(|f| get(&f, "name")) {
                Some(SchemaValue::String(name)) => Ok(ToolChoice::Function(name)),
                _ => Err(bad()),
            }
        }
        Some(_) => Err(bad()),
    }
}

/// A chat request as the runtime's request, and how to deliver its answer. The chat template
/// is applied by the runtime (`Prompt::Chat`), or, for a session, to the session's history.
pub fn chat_request(
    req: &ChatRequest,
    model: &LoadedModel,
) -> Result<(Request, Delivery), ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    if req.functions.as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(ApiError::bad_request(
            "functions (the deprecated form of function calling) are not supported: send them \
             as tools",
        ));
    }
    if req.messages.len() > MAX_MESSAGES {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_MESSAGES} messages, not {}",
            req.messages.len()
        )));
    }
    let logprobs = if req.logprobs.unwrap_or(false) {
        Some(match req.top_logprobs {
            None => 0,
            Some(k) if (0..=20).contains(&k) => k as usize,
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "top_logprobs must be between 0 and 20, not {k}"
                )));
            }
        })
    } else {
        None
    };
    let (mut params, mut delivery) = generation(
        &req.sampling,
        logprobs,
        model.context_len(),
        model.tokenizer.vocab_len(),
    )?;
    let priority = priority(req.sampling.priority.as_deref())?;
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let message = chat_message(m)?;
        // As OpenAI: a result answers a call. A session's new messages may open with results:
        // they answer its last reply, which the server holds.
        let answers_a_call = match messages.last() {
            Some(p) => p.role == "tool" || !p.tool_calls.is_empty(),
            None => req.session.is_some(),
        };
        if message.role == "tool" && !answers_a_call {
            return Err(ApiError::bad_request(
                "a message with role \"tool\" must follow an assistant message with tool_calls",
            ));
        }
        messages.push(message);
    }
    let choice = tool_choice(req.tool_choice.as_ref())?;
    let tools = match &req.tools {
        Some(list) if !list.is_empty() => Some(Arc::new(
            Tools::from_openai(list).map_err(|e| ApiError::bad_request(format!("tools: {e}")))?,
        )),
        _ => None,
    };
    let tools = match (tools, &choice) {
        (None, ToolChoice::Required | ToolChoice::Function(_)) => {
            return Err(ApiError::bad_request(
                "tool_choice asks for a call, but the request has no tools",
            ));
        }
        (_, ToolChoice::None) | (None, _) => None,
        (Some(tools), _) => Some(tools),
    };
    if let Some(tools) = &tools {
        let forced = tools
            .forced_call_schema(&choice)
            .map_err(|e| ApiError::bad_request(format!("tool_choice: {e}")))?;
        if let Some(schema) = forced {
            if params.format != OutputFormat::Text {
                return Err(ApiError::bad_request(
                    "a tool_choice that forces a call cannot be combined with a JSON \
                     response_format",
                ));
            }
            params.format = OutputFormat::JsonSchema(Arc::new(schema));
        }
        delivery.tools = Some(Arc::clone(tools));
        delivery.parallel_tool_calls = req.parallel_tool_calls.unwrap_or(true);
    }
    let request = match (&req.session, tools) {
        (None, Some(tools)) => Request::generate(Prompt::ChatWithTools { messages, tools }, params),
        (None, None) => Request::generate(Prompt::Chat(messages), params),
        (Some(name), tools) => {
            if name.is_empty() || name.len() > 256 {
                return Err(ApiError::bad_request(
                    "session names are 1 to 256 bytes long",
                ));
            }
            if delivery.n > 1 {
                return Err(ApiError::bad_request(
                    "a session turn generates one choice (n = 1)",
                ));
            }
            // The client sends only the new messages — a user message, or the results of
            // the functions the last reply called (after a system message for a new
            // session): the server holds the rest of the conversation.
            let mut messages = messages;
            let system = match messages.first() {
                Some(s) if s.role == "system" => Some(messages.remove(0).content),
                _ => None,
            };
            if messages.is_empty()
                || messages
                    .iter()
                    .any(|m| m.role != "user" && m.role != "tool")
            {
                return Err(ApiError::bad_request(
                    "with `session`, send only the new messages — a user message, or `tool` \
                     results of the calls the last reply made — optionally after a system \
                     message that opens a new session: the server keeps the conversation",
                ));
            }
            let prompt = match tools {
                Some(tools) => Prompt::ChatWithTools { messages, tools },
                None => Prompt::Chat(messages),
            };
            let mut r = Request::generate(prompt, params);
            r.session = Some(SessionTurn {
                name: name.clone(),
                system,
            });
            r
        }
    };
    Ok((request.with_priority(priority), delivery))
}

/// A completion request as the runtime's request, and how to deliver its answer.
pub fn completion_request(
    req: &CompletionRequest,
    model: &LoadedModel,
) -> Result<(Request, Delivery), ApiError> {
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=20).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "logprobs must be between 0 and 20, not {k}"
            )));
        }
    };
    let (params, delivery) = generation(
        &req.sampling,
        logprobs,
        model.context_len(),
        model.tokenizer.vocab_len(),
    )?;
    let priority = priority(req.sampling.priority.as_deref())?;
    let prompt = match &req.prompt {
        PromptInput::Text(t) => Prompt::Text(t.clone()),
        PromptInput::Tokens(t) => Prompt::Tokens(t.clone()),
        PromptInput::Texts(v) if v.len() == 1 => Prompt::Text(v[0].clone()),
        PromptInput::TokenLists(v) if v.len() == 1 => Prompt::Tokens(v[0].clone()),
        _ => {
            return Err(ApiError::bad_request(
                "airs takes one prompt per completion request (a string or token ids)",
            ));
        }
    };
    Ok((
        Request::generate(prompt, params).with_priority(priority),
        delivery,
    ))
}

/// The prompts of an embedding request (each becomes one request), and whether to answer in
/// base64.
pub fn embedding_requests(req: &EmbeddingRequest) -> Result<(Vec<Request>, bool), ApiError> {
    let priority = priority(req.priority.as_deref())?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format must be \"float\" or \"base64\", not {other:?}"
            )));
        }
    };
    let prompts: Vec<Prompt> = match &req.input {
        EmbeddingInput::Text(t) => vec![Prompt::Text(t.clone())],
        EmbeddingInput::Texts(v) => v.iter().map(|t| Prompt::Text(t.clone())).collect(),
        EmbeddingInput::Tokens(t) => vec![Prompt::Tokens(t.clone())],
        EmbeddingInput::TokenLists(v) => v.iter().map(|t| Prompt::Tokens(t.clone())).collect(),
    };
    if prompts.is_empty() || prompts.len() > 256 {
        return Err(ApiError::bad_request("input holds 1 to 256 prompts"));
    }
    Ok((
        prompts
            .into_iter()
            .map(|p| Request::embed(p).with_priority(priority))
            .collect(),
        base64,
    ))
}

/// Standard base64 (RFC 4648, with padding) of `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let b = [
            c[0],
            c.get(1).copied().unwrap_or(0),
            c.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(T[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use airs_runtime::Task;

    #[test]
    fn base64_matches_rfc_4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn bodies_of_the_wrong_shape_are_400s_that_say_what_is_wrong() {
        let e = parse::<ChatRequest>(b"", "chat").unwrap_err();
        assert!(e.message.contains("empty"), "{e:?}");
        let e = parse::<ChatRequest>(b"{\"messages\": 5}", "chat").unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("invalid chat request"), "{e:?}");
        let e = parse::<ChatRequest>(b"{\"model\": \"x\"}", "chat").unwrap_err();
        assert!(e.message.contains("messages"), "{e:?}");
        let ok = parse::<ChatRequest>(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "some_future_field": {"x": 1}, "stop": "END", "max_tokens": 5}"#,
            "chat",
        )
        .unwrap();
        assert!(matches!(ok.sampling.stop, Some(Stop::One(_))));
    }

    #[test]
    fn sampling_fields_are_checked_and_defaulted() {
        let s = Sampling {
            temperature: Some(-1.0),
            ..Sampling::default()
        };
        assert!(generation(&s, None, 100, 1000).is_err());
        let s = Sampling {
            max_tokens: Some(0),
            ..Sampling::default()
        };
        assert!(generation(&s, None, 100, 1000).is_err());
        let (p, d) = generation(&Sampling::default(), None, 100, 1000).unwrap();
        assert_eq!(p.max_tokens, 100);
        assert_eq!((p.sampler.top_k, d.n, d.stream), (40, 1, false));
        let s = Sampling {
            max_completion_tokens: Some(7),
            max_tokens: Some(9),
            seed: Some(-1),
            top_k: Some(-1),
            ..Sampling::default()
        };
        let (p, _) = generation(&s, None, 100, 1000).unwrap();
        assert_eq!(
            (p.max_tokens, p.sampler.seed, p.sampler.top_k),
            (7, u64::MAX, 0)
        );
    }

    #[test]
    fn response_formats_are_text_or_a_json_object_and_a_schema_is_refused() {
        let format = |body: &str| {
            let r = parse::<ChatRequest>(body.as_bytes(), "chat")?;
            generation(&r.sampling, None, 100, 1000).map(|(p, _)| p.format)
        };
        let msgs = r#""messages": [{"role": "user", "content": "x"}]"#;
        assert_eq!(format(&format!("{{{msgs}}}")).unwrap(), OutputFormat::Text);
        let with = |f: &str| format(&format!(r#"{{{msgs}, "response_format": {f}}}"#));
        assert_eq!(with(r#"{"type": "text"}"#).unwrap(), OutputFormat::Text);
        assert_eq!(
            with(r#"{"type": "json_object"}"#).unwrap(),
            OutputFormat::JsonObject
        );
        let e = with(r#"{"type": "json_schema", "json_schema": {"name": "x"}}"#).unwrap_err();
        assert!(e.message.contains("json_schema.schema"), "{e:?}");
        let schema = r#"{"type": "object", "properties": {"b": {"type": "integer"}}}"#;
        let f = with(&format!(
            r#"{{"type": "json_schema", "json_schema": {{"name": "x", "strict": true, "schema": {schema}}}}}"#
        ))
        .unwrap();
        assert!(matches!(f, OutputFormat::JsonSchema(_)));
        let e = with(
            r#"{"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}}}}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("pattern"), "{e:?}");
        assert!(
            with(r#"{"type": "yaml"}"#)
                .unwrap_err()
                .message
                .contains("yaml")
        );
        assert!(with(r#""json""#).is_err());
    }

    #[test]
    fn logit_bias_takes_token_ids_in_the_vocabulary_and_minus_100_bans() {
        let bias = |json: &str| {
            let r = parse::<ChatRequest>(
                format!(
                    r#"{{"messages": [{{"role": "user", "content": "x"}}], "logit_bias": {json}}}"#
                )
                .as_bytes(),
                "chat",
            )?;
            generation(&r.sampling, None, 100, 1000).map(|(p, _)| p.sampler.logit_bias)
        };
        assert_eq!(
            bias(r#"{"5": 2.5, "12": -100, "999": 100}"#).unwrap(),
            vec![(12, f32::NEG_INFINITY), (5, 2.5), (999, 100.0)]
        );
        assert!(bias("{}").unwrap().is_empty());
        for bad in [
            r#"{"1000": 1}"#,
            r#"{"-1": 1}"#,
            r#"{"a": 1}"#,
            r#"{"5": 101}"#,
            r#"{"5": -100.5}"#,
        ] {
            let e = bias(bad).unwrap_err();
            assert!(e.message.contains("logit_bias"), "{bad}: {e:?}");
        }
        let many: Vec<String> = (0..=MAX_LOGIT_BIAS)
            .map(|i| format!(r#""{i}": 1"#))
            .collect();
        assert!(bias(&format!("{{{}}}", many.join(","))).is_err());
    }

    #[test]
    fn tools_make_a_tool_prompt_and_tool_choice_is_checked() {
        let model = airs_runtime::LoadedModel::embedded(
            airs_runtime::EMBEDDED_MODEL,
            airs_runtime::EMBEDDED_MODEL_NAME,
            &airs_memory::ModelPool::new(u64::MAX),
            1,
        )
        .unwrap();
        let request = |extra: &str| {
            let body = format!(
                r#"{{"messages": [{{"role": "user", "content": "x"}},
                    {{"role": "assistant", "tool_calls": [{{"id": "c1", "type": "function",
                      "function": {{"name": "f", "arguments": "{{\"a\": 1}}"}}}}]}},
                    {{"role": "tool", "tool_call_id": "c1", "content": "2"}}]{extra}}}"#
            );
            let r = parse::<ChatRequest>(body.as_bytes(), "chat").unwrap();
            chat_request(&r, &model)
        };
        let f = r#", "tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]"#;
        // No tools (or an empty list): a plain conversation, calls and results included.
        for extra in ["", r#", "tools": []"#] {
            let (r, d) = request(extra).unwrap();
            let Prompt::Chat(messages) = &r.prompt else {
                panic!("{:?}", r.prompt)
            };
            assert_eq!(messages[1].tool_calls[0].arguments, r#"{"a": 1}"#);
            assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
            assert!(d.tools.is_none());
        }
        let (r, d) = request(f).unwrap();
        assert!(matches!(r.prompt, Prompt::ChatWithTools { .. }));
        assert!(d.tools.is_some() && d.parallel_tool_calls);
        let Task::Generate(p) = &r.task else { panic!() };
        assert_eq!(p.format, OutputFormat::Text);
        // Forced: generated under the call's schema.
        for choice in [
            r#""required""#,
            r#"{"type": "function", "function": {"name": "f"}}"#,
        ] {
            let (r, _) = request(&format!(r#"{f}, "tool_choice": {choice}"#)).unwrap();
            let Task::Generate(p) = &r.task else { panic!() };
            assert!(matches!(p.format, OutputFormat::JsonSchema(_)), "{choice}");
        }
        // none: the tools are not shown, nothing is parsed.
        let (r, d) = request(&format!(r#"{f}, "tool_choice": "none""#)).unwrap();
        assert!(matches!(r.prompt, Prompt::Chat(_)) && d.tools.is_none());
        let (_, d) = request(&format!(r#"{f}, "parallel_tool_calls": false"#)).unwrap();
        assert!(!d.parallel_tool_calls);
        for (extra, says) in [
            (r#", "tool_choice": "required""#.to_owned(), "no tools"),
            (format!(r#"{f}, "tool_choice": "sometimes""#), "tool_choice"),
            (
                format!(r#"{f}, "tool_choice": {{"type": "function"}}"#),
                "tool_choice",
            ),
            (
                format!(
                    r#"{f}, "tool_choice": {{"type": "function", "function": {{"name": "g"}}}}"#
                ),
                "not a tool",
            ),
            (
                format!(
                    r#"{f}, "tool_choice": "required", "response_format": {{"type": "json_object"}}"#
                ),
                "response_format",
            ),
            (format!(r#"{f}, "session": "s""#), "session"),
            (
                r#", "tools": [{"type": "function", "function": {"name": "a b"}}]"#.into(),
                "name",
            ),
            (r#", "functions": [{"name": "f"}]"#.into(), "functions"),
        ] {
            let e = request(&extra).unwrap_err();
            assert!(e.message.contains(says), "{extra}: {e:?}");
        }
        for (body, says) in [
            (
                r#"{"messages": [{"role": "user", "content": "x", "tool_calls": [
                    {"function": {"name": "f"}}]}]}"#,
                "only assistant messages",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "2"}]}"#,
                "must follow",
            ),
        ] {
            let r = parse::<ChatRequest>(body.as_bytes(), "chat").unwrap();
            let e = chat_request(&r, &model).unwrap_err();
            assert!(e.message.contains(says), "{e:?}");
        }
    }
}
