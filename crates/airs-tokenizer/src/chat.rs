//! Chat templates: turning a conversation into the prompt text a chat model was trained on.
//!
//! GGUF files carry the model's Hugging Face chat template as Jinja source in
//! `tokenizer.chat_template`. [`ChatTemplate`] renders it with minijinja the way Hugging
//! Face's `apply_chat_template` does: `trim_blocks` and `lstrip_blocks` on, the variables
//! `messages` (a list of `{role, content}`), `add_generation_prompt`, `bos_token` and
//! `eos_token` and `tools` (see [`ChatTools`]), the functions `raise_exception(message)`
//! (fails the render with that message) and `strftime_now(format)` (current UTC time; `%Y %m
//! %d %e %H %M %S %b %B %a %A %y %j %p %I %%`), `tojson` as Python's `json.dumps`
//! ([`crate::pyjson`]; minijinja's own is compact and HTML-escaped, which is not the text the
//! model was trained on), mappings in their given order, and Python string/dict/list methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) via minijinja-contrib's pycompat.
//!
//! **Fallback when a model has no template** ([`ChatTemplate::fallback_for`]):
//! - **ChatML** (`<|im_start|>role\ncontent<|im_end|>\n`, then `<|im_start|>assistant\n`)
//!   when the vocabulary has `<|im_start|>` and `<|im_end|>` as special tokens: a model that
//!   carries those tokens was almost certainly tuned on ChatML (Qwen, SmolLM, Hermes, ...),
//!   and the markers encode to the single tokens it knows.
//! - **Gemma** (`<start_of_turn>user\ncontent<end_of_turn>\n`, the assistant's role
//!   written `model`, then `<start_of_turn>model\n`; a system message is prefixed to the
//!   first user turn, as Gemma's own template and llama.cpp's built-in one do, since Gemma
//!   has no system role) when the vocabulary has `<start_of_turn>` and `<end_of_turn>` as
//!   special tokens: Gemma 3 GGUF files often ship without a template.
//! - otherwise a **plain transcript** (`User: content\n` per message, then `Assistant:`):
//!   for a model without chat markers (base models such as stories260K) any marker would be
//!   text it has never seen, while a "Role: text" transcript is the most common dialogue
//!   shape in pre-training text and continues naturally.
//!
//! Cost: parsing a template once (microseconds to a millisecond); rendering is linear in
//! the conversation.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, ErrorKind, context};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{EncodeOptions, TokenId, Tokenizer};

/// The GGUF key holding the model's chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// The ChatML fallback template.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// The Gemma fallback template.
pub const GEMMA_TEMPLATE: &str = "{%- set ns = namespace(prefix='') %}\
{%- for message in messages %}\
{%- if message['role'] == 'system' %}{%- set ns.prefix = ns.prefix + message['content'] + '\n\n' %}\
{%- else %}\
{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' + ns.prefix + message['content'] + '<end_of_turn>\n' }}\
{%- set ns.prefix = '' %}\
{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}";

/// The plain-transcript fallback template.
pub const PLAIN_TEMPLATE: &str = "{%- for message in messages %}\
{{- message['role'] | capitalize + ': ' + message['content'] + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (or whatever else the template knows).
    pub role: String,
    pub content: String,
    /// The functions an assistant message called (rendered as the template renders them; see
    /// [`ChatTools`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty", skip_deserializing)]
    pub tool_calls: Vec<ChatToolCall>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// A function call of an assistant message (OpenAI's `tool_calls[i]`). A template sees it as
/// Hugging Face's templates expect: `{"id", "type": "function", "function": {"name",
/// "arguments"}}` with the arguments as a JSON object (a template writes them with `tojson`),
/// not the JSON text OpenAI carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatToolCall {
    pub id: String,
    pub name: String,
    /// The arguments object's JSON text.
    pub arguments: String,
}

impl ChatToolCall {
    /// The arguments as a template value: the JSON object (members in order), or the text as
    /// a string when it is not JSON.
    fn arguments_value(&self) -> minijinja::Value {
        serde_json::from_str(&self.arguments)
            .unwrap_or_else(|_| minijinja::Value::from(self.arguments.as_str()))
    }
}

impl Serialize for ChatToolCall {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let function: minijinja::Value = [
            ("name", minijinja::Value::from(self.name.as_str())),
            ("arguments", self.arguments_value()),
        ]
        .into_iter()
        .collect();
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry("function", &function)?;
        map.end()
    }
}

/// The tools a conversation may call, as a chat template receives them (its `tools`
/// variable): OpenAI's `tools` array, `[{"type": "function", "function": {"name",
/// "description", "parameters"}}]`, members in the order the client sent them.
///
/// A template that renders `tools` (Qwen2.5's, Hermes', Llama 3.1's, ...) gets them as they
/// are, and the model is prompted the way it was tuned. A template that does not (Gemma 3's,
/// the fallbacks) is given the same instructions Qwen2.5's template writes — the signatures
/// inside `<tools></tools>` and the answer shape `<tool_call>{"name": ..., "arguments":
/// ...}</tool_call>` — in the system message; its assistant calls are written in that shape
/// and `tool` results become a user message of `<tool_response>` blocks.
#[derive(Clone, Debug)]
pub struct ChatTools {
    list: Vec<minijinja::Value>,
}

impl ChatTools {
    /// The tools of an OpenAI request, from the JSON text of its `tools` array.
    pub fn from_json(json: &str) -> Result<ChatTools, ChatTemplateError> {
        let list: Vec<minijinja::Value> = serde_json::from_str(json).map_err(|e| {
            ChatTemplateErrorKind::Render(format!("tools are not a JSON array: {e}"))
        })?;
        Ok(ChatTools { list })
    }

    /// The system prompt text that tells a model without its own tool format about the tools
    /// (Qwen2.5's, which is Hermes 2 Pro's).
    pub fn instructions(&self) -> String {
        let mut text = String::from(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        );
        for tool in &self.list {
            text.push('\n');
            text.push_str(&crate::pyjson::dumps(tool));
        }
        text.push_str(
            "\n</tools>\n\nFor each function call, return a json object with function name and \
             arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
             <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        text
    }
}

/// A call written as text, for a template that does not render `tool_calls`.
fn call_text(call: &ChatToolCall) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
        crate::pyjson::dumps(&minijinja::Value::from(call.name.as_str())),
        crate::pyjson::dumps(&call.arguments_value())
    )
}

/// `messages` for a template without tool support: the instructions in the system message,
/// calls as text, tool results as a user message.
fn inline_tools(messages: &[ChatMessage], tools: Option<&ChatTools>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if let Some(tools) = tools {
        let instructions = tools.instructions();
        match messages.split_first() {
            Some((system, tail)) if system.role == "system" => {
                out.push(ChatMessage::system(format!(
                    "{}\n\n{instructions}",
                    system.content
                )));
                rest = tail;
            }
            _ => out.push(ChatMessage::system(instructions)),
        }
    }
    let mut after_result = false;
    for m in rest {
        let is_result = m.role == "tool";
        if is_result {
            // Consecutive results are one user turn (Gemma's template, for one, refuses two
            // user turns in a row).
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(last) if after_result => {
                    last.content.push('\n');
                    last.content.push_str(&block);
                }
                _ => out.push(ChatMessage::user(block)),
            }
        } else if !m.tool_calls.is_empty() {
            let mut parts: Vec<String> = Vec::new();
            if !m.content.is_empty() {
                parts.push(m.content.clone());
            }
            parts.extend(m.tool_calls.iter().map(call_text));
            out.push(ChatMessage::new(m.role.as_str(), parts.join("\n")));
        } else {
            out.push(ChatMessage::new(m.role.as_str(), m.content.as_str()));
        }
        after_result = is_result;
    }
    out
}

/// What went wrong with a chat template.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ChatTemplateErrorKind {
    /// `tokenizer.chat_template` is present but not a UTF-8 string.
    #[error("{CHAT_TEMPLATE_KEY} is not a UTF-8 string")]
    NotAString,
    /// The template does not parse as Jinja.
    #[error("the chat template does not parse: {0}")]
    Syntax(String),
    /// Rendering failed: an unsupported construct, a type error, or the template called
    /// `raise_exception` (the message says which).
    #[error("the chat template failed to render: {0}")]
    Render(String),
}

/// An error parsing or rendering a chat template.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{kind}")]
pub struct ChatTemplateError {
    kind: ChatTemplateErrorKind,
}

impl ChatTemplateError {
    pub fn kind(&self) -> &ChatTemplateErrorKind {
        &self.kind
    }
}

impl From<ChatTemplateErrorKind> for ChatTemplateError {
    fn from(kind: ChatTemplateErrorKind) -> ChatTemplateError {
        ChatTemplateError { kind }
    }
}

/// Where a [`ChatTemplate`] came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// The model's own `tokenizer.chat_template` (or a template given by the caller).
    Model,
    /// The ChatML fallback ([`CHATML_TEMPLATE`]).
    FallbackChatMl,
    /// The Gemma fallback ([`GEMMA_TEMPLATE`]).
    FallbackGemma,
    /// The plain-transcript fallback ([`PLAIN_TEMPLATE`]).
    FallbackPlain,
}

/// A parsed chat template with the model's BOS/EOS texts.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The Jinja source (a copy of what `env` parsed; templates are a few KiB).
    text: String,
    source: TemplateSource,
    bos_token: String,
    eos_token: String,
    /// Whether the template renders a `tools` list (probed on first use).
    renders_tools: std::sync::OnceLock<bool>,
}

/// The probe's function name: a template renders tools if its output names it.
const PROBE_TOOL: &str = "airs_probe_function_5c1f";

impl ChatTemplate {
    /// Parse a Jinja chat template. `bos_token`/`eos_token` are the texts the template's
    /// `bos_token`/`eos_token` variables hold (e.g. `<s>`; empty if the model has none).
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        ChatTemplate::with_source(source.into(), TemplateSource::Model, bos_token, eos_token)
    }

    fn with_source(
        template: String,
        source: TemplateSource,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", crate::pyjson::tojson);
        env.add_template_owned(TEMPLATE_NAME, template.clone())
            .map_err(|e| ChatTemplateErrorKind::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            text: template,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            renders_tools: std::sync::OnceLock::new(),
        })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`), or [`ChatTemplate::fallback_for`]
    /// the tokenizer when the file has none. A template that is present but does not parse
    /// is an error (call `fallback_for` to carry on regardless).
    pub fn from_gguf(
        gguf: &airs_gguf::Gguf<'_>,
        tokenizer: &Tokenizer,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        match gguf.get(CHAT_TEMPLATE_KEY) {
            None => Ok(ChatTemplate::fallback_for(tokenizer)),
            Some(value) => {
                let source = value.as_str().ok_or(ChatTemplateErrorKind::NotAString)?;
                let (bos, eos) = special_texts(tokenizer);
                ChatTemplate::new(source, bos, eos)
            }
        }
    }

    /// The fallback for a model without a template: ChatML if the vocabulary has
    /// `<|im_start|>`/`<|im_end|>` special tokens, Gemma's turns if it has
    /// `<start_of_turn>`/`<end_of_turn>`, else a plain transcript (see the module documentation
    /// for why).
    pub fn fallback_for(tokenizer: &Tokenizer) -> ChatTemplate {
        let is_special = |text: &str| {
            tokenizer
                .token_id(text)
                .is_some_and(|id| tokenizer.is_special(id))
        };
        let (template, source) = if is_special("<|im_start|>") && is_special("<|im_end|>") {
            (CHATML_TEMPLATE, TemplateSource::FallbackChatMl)
        } else if is_special("<start_of_turn>") && is_special("<end_of_turn>") {
            (GEMMA_TEMPLATE, TemplateSource::FallbackGemma)
        } else {
            (PLAIN_TEMPLATE, TemplateSource::FallbackPlain)
        };
        let (bos, eos) = special_texts(tokenizer);
        // The built-in templates parse; an error here would be a bug caught by the tests.
        ChatTemplate::with_source(template.to_owned(), source, bos, eos)
            .unwrap_or_else(|e| unreachable!("built-in chat template: {e}"))
    }

    /// Where this template came from.
    pub fn source(&self) -> TemplateSource {
        self.source
    }

    /// The Jinja source.
    pub fn template_source(&self) -> &str {
        &self.text
    }

    /// Render `messages` to prompt text; with `add_generation_prompt` the text ends with
    /// the header of an assistant turn for the model to complete.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Render a conversation that may call `tools` (or holds calls and their results): the
    /// template's own tool format when it has one, else the instructions and calls written
    /// into the messages ([`ChatTools`]).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ChatTools>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let has_tool_messages = messages
            .iter()
            .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
        if (tools.is_some() || has_tool_messages) && !self.renders_tools() {
            let inlined = inline_tools(messages, tools);
            return self.render_raw(&inlined, None, add_generation_prompt);
        }
        self.render_raw(messages, tools, add_generation_prompt)
    }

    /// Whether the template writes a `tools` list itself (a conversation with a probe
    /// function names it in the rendering).
    pub fn renders_tools(&self) -> bool {
        *self.renders_tools.get_or_init(|| {
            let probe = format!(
                r#"[{{"type": "function", "function": {{"name": "{PROBE_TOOL}", "description": "probe", "parameters": {{"type": "object", "properties": {{}}}}}}}}]"#
            );
            let tools = ChatTools::from_json(&probe).expect("the probe is JSON");
            self.render_raw(&[ChatMessage::user("x")], Some(&tools), true)
                .is_ok_and(|text| text.contains(PROBE_TOOL))
        })
    }

    fn render_raw(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ChatTools>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateErrorKind::Render(describe(&e)))?;
        // Without tools the variable is undefined, as transformers leaves it (a template may
        // test `tools is defined`).
        let tools = tools.map_or(minijinja::Value::UNDEFINED, |t| {
            minijinja::Value::from(t.list.clone())
        });
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| ChatTemplateErrorKind::Render(describe(&e)).into())
    }

    /// Render and tokenize a conversation as the model expects: special tokens parsed, BOS
    /// added if the model adds one — and then a BOS the template itself wrote at the start
    /// is removed from the text first, so it is not doubled (as llama.cpp does).
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<TokenId>, ChatTemplateError> {
        self.encode_with_tools(tokenizer, messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::encode`] of a conversation that may call `tools`
    /// ([`ChatTemplate::render_with_tools`]).
    pub fn encode_with_tools(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&ChatTools>,
        add_generation_prompt: bool,
    ) -> Result<Vec<TokenId>, ChatTemplateError> {
        let text = self.render_with_tools(messages, tools, add_generation_prompt)?;
        let mut prompt = text.as_str();
        if tokenizer.add_bos() && !self.bos_token.is_empty() {
            prompt = prompt.strip_prefix(&self.bos_token).unwrap_or(prompt);
        }
        Ok(tokenizer.encode(prompt, EncodeOptions::prompt(tokenizer)))
    }
}

/// The texts of the tokenizer's BOS and EOS tokens (empty if it has none).
fn special_texts(tokenizer: &Tokenizer) -> (String, String) {
    let text = |id: Option<TokenId>| {
        id.and_then(|id| tokenizer.token_piece(id))
            .unwrap_or("")
            .to_owned()
    };
    (text(tokenizer.bos_id()), text(tokenizer.eos_id()))
}

/// A minijinja error with its chain of causes, on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

fn strftime_now(format: String) -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime_utc(&format, seconds)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Format a Unix time (UTC) with the common strftime directives; others are copied as is.
fn strftime_utc(format: &str, unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let secs_of_day = unix_seconds % 86_400;
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{hour12:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday_name[..3]),
            Some('A') => out.push_str(weekday_name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01 (Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        let t = 1_721_999_109;
        assert_eq!(strftime_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%A %B %e %H:%M:%S %j %y %I%p %%", t),
            "Friday July 26 13:05:09 208 24 01PM %"
        );
        assert_eq!(strftime_utc("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime_utc("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
        for days in [-1000i64, 0, 59, 60, 365, 11_016, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
