//! What a front end asks the runtime for, and what it gets back: a [`Request`] (a prompt, the
//! generation parameters, a priority, optionally a persistent session) and the stream of
//! [`Event`]s that answer it — admission, every generated token with the text it made final,
//! and the end of each choice — or an [`Embedding`] for an embedding request.
//!
//! The same request gives the same tokens whichever front end sends it: the CLI and the server
//! both build a [`Request`] and read [`Event`]s; nothing else samples.
//!
//! Cost: a request holds its prompt (text or ids) until it is tokenized at submission.

use std::time::Duration;

use airs_engine::SamplerConfig;
use airs_memory::eviction::Priority;
use airs_tokenizer::chat::ChatMessage;
use serde::Serialize;

/// A request's id within one scheduler, in submission order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// What the model is asked to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Raw text, tokenized with BOS as the model wants it (a completion).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// A conversation, rendered with the model's chat template and the generation prompt.
    Chat(Vec<ChatMessage>),
    /// A conversation that may call tools, rendered with them as the template shows tools
    /// ([`airs_tokenizer::chat::ChatTools`]); the reply's calls are read with
    /// [`crate::tools::ToolCallParser`].
    ChatWithTools {
        messages: Vec<ChatMessage>,
        tools: std::sync::Arc<crate::tools::Tools>,
    },
}

/// A turn of a persistent session: the session's conversation so far is in the history store;
/// the request's prompt must be [`Prompt::Chat`] (or [`Prompt::ChatWithTools`], whose tools
/// must be the session's: its first turn sets them) holding only the new messages — user
/// messages, or `tool` results of the functions the session's last reply called.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionTurn {
    /// The session's name (created on its first turn).
    pub name: String,
    /// The system message a new session opens with (ignored for an existing session).
    pub system: Option<String>,
}

/// How to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationParams {
    /// Most tokens to generate per choice (the context bounds it too).
    pub max_tokens: usize,
    /// Stop when the text contains one of these (never streamed, not part of the text).
    pub stop: Vec<String>,
    /// Sampling; choice `i` of `n` draws with seed `seed + i`.
    pub sampler: SamplerConfig,
    /// Report the log-probability of every generated token and the `top` most likely
    /// alternatives (`Some(0)`: the token's own only).
    pub logprobs: Option<usize>,
    /// Choices to generate; they share the prompt's KV blocks (copy-on-write).
    pub n: usize,
    /// Keep generating through end-of-generation tokens (benchmarks: always `max_tokens`).
    pub ignore_eos: bool,
    /// The shape the generated text must have.
    pub format: OutputFormat,
}

/// The shape generated text must have.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum OutputFormat {
    /// Any text.
    #[default]
    Text,
    /// One JSON object, and the choice ends when it closes ([`crate::constraint`]; OpenAI's
    /// `response_format: {"type": "json_object"}`).
    JsonObject,
    /// One JSON object the schema accepts, and the choice ends when it closes (OpenAI's
    /// `response_format: {"type": "json_schema", ...}`; [`crate::json_schema`]).
    JsonSchema(std::sync::Arc<crate::json_schema::Schema>),
}

impl Default for GenerationParams {
    fn default() -> GenerationParams {
        GenerationParams {
            max_tokens: 128,
            stop: Vec::new(),
            sampler: SamplerConfig::default(),
            logprobs: None,
            n: 1,
            ignore_eos: false,
            format: OutputFormat::Text,
        }
    }
}

/// What kind of work a request is.
#[derive(Clone, Debug, PartialEq)]
pub enum Task {
    /// Generate a continuation.
    Generate(GenerationParams),
    /// Compute the prompt's embedding (mean of the final hidden states after the output norm,
    /// L2-normalized; nothing generated).
    Embed,
}

/// A request to the runtime.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: Prompt,
    pub task: Task,
    /// Admission and preemption order: interactive before system before background.
    pub priority: Priority,
    /// Set for a turn of a persistent conversation.
    pub session: Option<SessionTurn>,
    /// Prefix-cache scope: KV prefixes are shared only among requests with the same salt.
    pub salt: Option<Vec<u8>>,
}

impl Request {
    /// Generate a continuation of `prompt` with `params`, interactive, no session.
    pub fn generate(prompt: Prompt, params: GenerationParams) -> Request {
        Request {
            prompt,
            task: Task::Generate(params),
            priority: Priority::Interactive,
            session: None,
            salt: None,
        }
    }

    /// A turn of session `name`: `message` appended to its conversation.
    pub fn turn(name: &str, message: &str, params: GenerationParams) -> Request {
        Request {
            prompt: Prompt::Chat(vec![ChatMessage::user(message)]),
            task: Task::Generate(params),
            priority: Priority::Interactive,
            session: Some(SessionTurn {
                name: name.into(),
                system: None,
            }),
            salt: None,
        }
    }

    /// The embedding of `prompt`.
    pub fn embed(prompt: Prompt) -> Request {
        Request {
            prompt,
            task: Task::Embed,
            priority: Priority::Interactive,
            session: None,
            salt: None,
        }
    }

    pub fn with_priority(mut self, priority: Priority) -> Request {
        self.priority = priority;
        self
    }

    pub fn with_salt(mut self, salt: Option<Vec<u8>>) -> Request {
        self.salt = salt;
        self
    }
}

/// Why a choice stopped.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// The text reached one of the stop strings.
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The sequence reached the model's context length.
    ContextFull,
}

impl FinishReason {
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::EndOfGeneration => "eos",
            FinishReason::StopString => "stop_string",
            FinishReason::MaxTokens => "max_tokens",
            FinishReason::ContextFull => "context_full",
        }
    }

    /// OpenAI's `finish_reason`: `stop` or `length`.
    pub fn openai(self) -> &'static str {
        match self {
            FinishReason::EndOfGeneration | FinishReason::StopString => "stop",
            FinishReason::MaxTokens | FinishReason::ContextFull => "length",
        }
    }
}

/// The log-probability of a generated token and its most likely alternatives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// `(token id, log-probability)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub choice: usize,
    pub id: u32,
    /// The text that became final with this token (empty while a multi-byte character or a
    /// possible stop string is pending; several tokens' text when it is released).
    pub text: String,
    pub logprobs: Option<TokenLogprobs>,
}

/// Token counts of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens of the prompt (for a session turn: the tokens the turn appended).
    pub prompt_tokens: usize,
    /// Tokens generated, all choices together.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (or the session's cache) instead of
    /// computed.
    pub cached_tokens: usize,
}

/// How one choice ended.
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceEnd {
    pub choice: usize,
    pub reason: FinishReason,
    /// Text that became final only now (held back as a possible stop string or an incomplete
    /// character) and was in no [`TokenEvent`]: a stream ends with it.
    pub tail: String,
    /// The choice's whole text (stop string excluded).
    pub text: String,
    /// The generated token ids (an end-of-generation token is not among them).
    pub tokens: Vec<u32>,
}

/// The end of a request that completed.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub usage: Usage,
    /// Set for a session turn: the 0-based turn number, committed to the history store before
    /// this event was sent.
    pub turn: Option<u64>,
    /// From submission to the first generated token of the first choice.
    pub time_to_first_token: Option<Duration>,
    /// From the first generated token to the last, and the tokens in between (for
    /// decode tokens/s).
    pub decode_time: Duration,
    pub decode_tokens: usize,
    /// Prompt positions computed and the time from admission to the first token.
    pub prefill_tokens: usize,
    pub prefill_time: Duration,
    /// Times the request's sequences were preempted (KV evicted, recomputed later).
    pub preemptions: u32,
    /// Positions recomputed that had been computed before: a session's history whose cache
    /// was evicted (or built in another process), or a preempted sequence's.
    pub rebuilt_tokens: usize,
}

/// A pooled embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// `n_embd` values, L2-normalized.
    pub values: Vec<f32>,
    pub prompt_tokens: usize,
}

/// What the runtime sends back for a request, in order: `Admitted` once, then `Token`s and
/// `ChoiceEnd`s of the choices interleaved, then `Done` (or an `Embedding` then `Done` for an
/// embedding request); or `Failed` at any point, which ends the stream.
#[derive(Debug)]
pub enum Event {
    /// The request left the queue: its prompt (ids) and how much of it was cached.
    Admitted {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Token(TokenEvent),
    ChoiceEnd(ChoiceEnd),
    Embedding(Embedding),
    Done(Completion),
    Failed(crate::RuntimeError),
}
