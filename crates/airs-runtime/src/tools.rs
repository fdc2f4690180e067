//! Function calling: the tools a chat request offers ([`Tools`], OpenAI's `tools`), how the
//! reply may or must call them ([`ToolChoice`]), and the calls read back out of the generated
//! text ([`ToolCallParser`]).
//!
//! The prompt is the chat template's business ([`airs_tokenizer::chat::ChatTools`]): a
//! template with its own tool format renders the tools as the model was tuned on them, and any
//! other model is told Qwen2.5's (Hermes 2 Pro's) format in its system message. Replies are read
//! as llama.cpp's Hermes parser reads them, and as small models actually answer:
//! - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, anywhere in the reply,
//!   as many as the model writes; text around them is the message's content;
//! - a reply that is nothing but such JSON objects (one, one a line, or a list of them, in an
//!   unmarked or `json` Markdown code fence or not): Qwen2.5-Coder-0.5B answers a weather
//!   question with `{"name": "get_weather", "arguments": {"city": "Paris"}}` and no tags.
//!   `parameters` is taken for `arguments` (Llama 3.1's form).
//!
//! A call counts only when its name is one of the request's tools and its arguments are a
//! JSON object (or a string holding one); anything else stays text, so nothing the model wrote
//! is lost. Arguments are returned as compact JSON text, members in the model's order.
//!
//! `tool_choice` `required` or a named function is enforced, not hoped for: the reply is
//! generated under a JSON schema ([`Tools::forced_call_schema`]) of `{"name": <the function>,
//! "arguments": <its parameters' schema>}`; with several functions to choose from, the name is
//! one of them and the arguments follow the schema of the one it names
//! ([`Schema::tagged`], one arm per function). Parameters outside the subset
//! [`crate::json_schema`] enforces are held to any JSON object instead, since a forced call
//! must still be generated.
//!
//! Streaming ([`ToolCallParser::streaming`], what the server's streamed replies use): a
//! `<tool_call>` block whose JSON opens with `{"name": "<a declared tool>", "arguments": {`
//! (or `"parameters"`) is given out as it is written — its name as soon as the arguments
//! object opens, then the object's text piece by piece (whitespace outside strings dropped) —
//! so a client sees a long call (a file's contents, say) grow instead of waiting for all of it.
//! Once given out it stays a call, even if the object never closes properly (the model ran
//! out of tokens): OpenAI's streamed arguments carry the same caveat. A block of another shape
//! and bare JSON replies are read whole, as above.
//!
//! Cost: the parser holds back at most the text of one unfinished call (or, for a reply that
//! opens as bare calls may — `{`, `[{`, an unmarked or `json` fence — the reply, read once at
//! its end), and searches each pushed piece once; other text is released as soon as it cannot
//! be the start of `<tool_call>`.

use std::sync::Arc;

use airs_tokenizer::chat::ChatTools;

use crate::json_schema::{Schema, SchemaValue};

/// Most tools one request may offer.
pub const MAX_TOOLS: usize = 128;
/// Longest function name (OpenAI's limit; names are `[A-Za-z0-9_.-]`).
pub const MAX_NAME_BYTES: usize = 64;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A request's tools that cannot be offered: the message says which and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolsError(String);

/// One function a reply may call.
#[derive(Clone, Debug)]
struct Function {
    name: String,
    /// The JSON schema of its arguments, as sent.
    parameters: Option<SchemaValue>,
}

/// The tools of one request.
#[derive(Clone, Debug)]
pub struct Tools {
    functions: Vec<Function>,
    chat: ChatTools,
    /// The tools' compact JSON text (what two requests compare equal by).
    json: String,
}

impl PartialEq for Tools {
    fn eq(&self, other: &Tools) -> bool {
        self.json == other.json
    }
}

impl Eq for Tools {}

/// Whether and which tool the reply calls (OpenAI's `tool_choice`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are not shown to the model and the reply is text.
    None,
    /// The model decides (the default when tools are given).
    #[default]
    Auto,
    /// The reply is a call of one of the tools.
    Required,
    /// The reply is a call of this function.
    Function(String),
}

/// A call read from a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object as compact JSON text.
    pub arguments: String,
}

/// A piece of a reply: text, or a call — whole, or (from [`ToolCallParser::streaming`]) as
/// it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyPart {
    Text(String),
    Call(ToolCall),
    /// A call whose name is known opens; its arguments follow as [`ReplyPart::CallArguments`].
    CallBegin {
        name: String,
    },
    /// The next piece of the open call's arguments (JSON text, whitespace outside strings
    /// dropped).
    CallArguments(String),
    /// The open call closed: the whole call, its arguments the pieces joined.
    CallEnd(ToolCall),
}

impl Tools {
    /// The tools of an OpenAI request: `[{"type": "function", "function": {"name",
    /// "description", "parameters", "strict"}}]`, names unique and at most [`MAX_TOOLS`].
    pub fn from_openai(tools: &[SchemaValue]) -> Result<Tools, ToolsError> {
        if tools.len() > MAX_TOOLS {
            return Err(ToolsError(format!(
                "at most {MAX_TOOLS} tools, not {}",
                tools.len()
            )));
        }
        let mut functions: Vec<Function> = Vec::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            match member(tool, "type") {
                Some(SchemaValue::String(t)) if t == "function" => {}
                _ => {
                    return Err(ToolsError(format!(
                        "tools[{i}]: only tools of type \"function\" are supported"
                    )));
                }
            }
            let function = match member(tool, "function") {
                Some(f @ SchemaValue::Object(_)) => f,
                _ => return Err(ToolsError(format!("tools[{i}] needs a function object"))),
            };
            let name = match member(function, "name") {
                Some(SchemaValue::String(n)) if valid_name(n) => n.clone(),
                _ => {
                    return Err(ToolsError(format!(
                        "tools[{i}].function.name must be 1 to {MAX_NAME_BYTES} letters, digits, \
                         underscores, dots or dashes"
                    )));
                }
            };
            if functions.iter().any(|f| f.name == name) {
                return Err(ToolsError(format!("two tools are named {name:?}")));
            }
            let parameters = match member(function, "parameters") {
                None => None,
                Some(p @ SchemaValue::Object(_)) => Some(p.clone()),
                Some(_) => {
                    return Err(ToolsError(format!(
                        "tools[{i}].function.parameters must be a JSON schema object"
                    )));
                }
            };
            functions.push(Function { name, parameters });
        }
        let json = SchemaValue::Array(tools.to_vec()).to_json();
        let chat = ChatTools::from_json(&json).map_err(|e| ToolsError(e.to_string()))?;
        Ok(Tools {
            functions,
            chat,
            json,
        })
    }

    /// [`Tools::from_openai`] of the JSON text of a `tools` array (as [`Tools::json`] gives
    /// it: how a session's tools are stored).
    pub fn from_json(json: &str) -> Result<Tools, ToolsError> {
        match serde_json::from_str::<SchemaValue>(json) {
            Ok(SchemaValue::Array(list)) => Tools::from_openai(&list),
            Ok(_) => Err(ToolsError("tools are not a JSON array".into())),
            Err(e) => Err(ToolsError(format!("tools are not JSON: {e}"))),
        }
    }

    /// The tools' compact JSON text (members in the request's order).
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The tools as the chat template receives them.
    pub fn chat(&self) -> &ChatTools {
        &self.chat
    }

    /// The functions' names, in the request's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.functions.iter().map(|f| f.name.as_str())
    }

    fn has(&self, name: &str) -> bool {
        self.functions.iter().any(|f| f.name == name)
    }

    /// The schema a reply is generated under for `choice`: `None` unless a call is forced
    /// (see the module documentation).
    pub fn forced_call_schema(&self, choice: &ToolChoice) -> Result<Option<Schema>, ToolsError> {
        let functions: Vec<&Function> = match choice {
            ToolChoice::None | ToolChoice::Auto => return Ok(None),
            ToolChoice::Function(name) => {
                vec![
                    self.functions
                        .iter()
                        .find(|f| f.name == *name)
                        .ok_or_else(|| {
                            ToolsError(format!("tool_choice names {name:?}, which is not a tool"))
                        })?,
                ]
            }
            ToolChoice::Required if self.functions.is_empty() => {
                return Err(ToolsError("tool_choice required, but no tools".into()));
            }
            ToolChoice::Required => self.functions.iter().collect(),
        };
        // The name is one of the functions; the arguments follow the schema of the one it
        // names (each compiled as a root of its own, so its `$defs` resolve in it).
        let any_object =
            SchemaValue::Object(vec![("type".into(), SchemaValue::String("object".into()))]);
        let arms: Vec<(&str, &SchemaValue)> = functions
            .iter()
            .map(|f| match &f.parameters {
                Some(p) if Schema::compile(p).is_ok() => (f.name.as_str(), p),
                _ => (f.name.as_str(), &any_object),
            })
            .collect();
        Schema::tagged("name", "arguments", &arms)
            .map(Some)
            .map_err(|e| ToolsError(format!("the forced call's schema: {e}")))
    }

    /// A call if `text` (trimmed) is one JSON call object of a declared tool.
    fn call_of(&self, text: &str) -> Option<ToolCall> {
        let value: SchemaValue = serde_json::from_str(text.trim()).ok()?;
        self.call_of_value(&value)
    }

    fn call_of_value(&self, value: &SchemaValue) -> Option<ToolCall> {
        let name = match member(value, "name")? {
            SchemaValue::String(n) if self.has(n) => n.clone(),
            _ => return None,
        };
        let arguments = match member(value, "arguments").or_else(|| member(value, "parameters")) {
            None => "{}".to_owned(),
            Some(a @ SchemaValue::Object(_)) => a.to_json(),
            Some(SchemaValue::String(s)) => match serde_json::from_str::<SchemaValue>(s).ok()? {
                a @ SchemaValue::Object(_) => a.to_json(),
                _ => return None,
            },
            Some(_) => return None,
        };
        Some(ToolCall { name, arguments })
    }

    /// The calls of a whole reply that is nothing but calls as JSON: one object, a list of
    /// them, either in a code fence.
    fn bare_calls(&self, reply: &str) -> Option<Vec<ToolCall>> {
        let mut text = reply.trim();
        if let Some(fenced) = text.strip_prefix("```") {
            let body = fenced.strip_suffix("```")?;
            // The fence's info string (`json`) ends at the first newline.
            text = body.split_once('\n').map_or(body, |(_, rest)| rest).trim();
        }
        let mut calls = Vec::new();
        // One value, or several separated by whitespace (one call a line).
        for value in serde_json::Deserializer::from_str(text).into_iter::<SchemaValue>() {
            match value.ok()? {
                SchemaValue::Array(items) if !items.is_empty() => {
                    for v in &items {
                        calls.push(self.call_of_value(v)?);
                    }
                }
                v @ SchemaValue::Object(_) => calls.push(self.call_of_value(&v)?),
                _ => return None,
            }
        }
        (!calls.is_empty()).then_some(calls)
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn member<'a>(v: &'a SchemaValue, key: &str) -> Option<&'a SchemaValue> {
    match v {
        SchemaValue::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
        _ => None,
    }
}

/// Where the parser is in a reply.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet.
    Start,
    /// After a call: whitespace is dropped until text or the next call.
    Between,
    /// Text, released as it comes except a possible start of `<tool_call>`.
    Text,
    /// Inside `<tool_call>`, until `</tool_call>`.
    InCall,
    /// The reply opened with `{`, `[{` or a code fence: held whole, read at the end.
    Bare,
}

/// Reads calls out of a reply as it streams: [`ToolCallParser::push`] each piece of final
/// text, then [`ToolCallParser::finish`]. Text comes out in order, as soon as it cannot be
/// part of a call; a call comes out when it closes (or, for a bare JSON reply, at the end).
#[derive(Clone, Debug)]
pub struct ToolCallParser {
    tools: Arc<Tools>,
    mode: Mode,
    pending: String,
    /// Inside a call: how much of `pending` was searched for the closing tag.
    searched: usize,
    /// Whether calls are given out as they are written ([`ToolCallParser::streaming`]).
    stream: bool,
    /// Inside a call, while streaming: how far it was read.
    call: CallStream,
}

/// How far a `<tool_call>` block was read, while streaming.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum CallStream {
    /// Its head, `{"name": ..., "arguments": `, is still being read.
    #[default]
    Head,
    /// The arguments object is being given out: `pending[..scanned]` was read, `depth`
    /// brackets are open, and the position is inside a string (after a backslash).
    Arguments {
        name: String,
        text: String,
        scanned: usize,
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
    /// The arguments object closed; the rest of the block is ignored.
    Closed { name: String, text: String },
    /// Not a call of the streamed shape: read whole at its end.
    Whole,
}

/// What a block's text so far says about its head.
enum Head {
    /// Too little text to tell.
    More,
    /// Not `{"name": "<declared>", "arguments": {`.
    Other,
    /// The head of a call of `name`; its arguments object opens at byte `at`.
    Call { name: String, at: usize },
}

impl ToolCallParser {
    /// A parser that gives out each call whole, when it closes.
    pub fn new(tools: Arc<Tools>) -> ToolCallParser {
        ToolCallParser {
            tools,
            mode: Mode::Start,
            pending: String::new(),
            searched: 0,
            stream: false,
            call: CallStream::Head,
        }
    }

    /// A parser that gives out `<tool_call>` blocks as they are written
    /// ([`ReplyPart::CallBegin`], [`ReplyPart::CallArguments`], [`ReplyPart::CallEnd`]; see
    /// the module documentation).
    pub fn streaming(tools: Arc<Tools>) -> ToolCallParser {
        ToolCallParser {
            stream: true,
            ..ToolCallParser::new(tools)
        }
    }

    /// Feed the next piece of the reply; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<ReplyPart> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Start | Mode::Between => {
                    let rest = self.pending.trim_start();
                    if rest.is_empty() {
                        if self.mode == Mode::Between {
                            self.pending.clear();
                        }
                        break;
                    }
                    if self.mode == Mode::Start {
                        match bare_start(rest) {
                            Some(true) => {
                                self.mode = Mode::Bare;
                                continue;
                            }
                            None => break,
                            Some(false) => {}
                        }
                    }
                    if self.mode == Mode::Between {
                        self.pending = rest.to_owned();
                    }
                    self.mode = Mode::Text;
                }
                Mode::Text => {
                    if let Some(at) = self.pending.find(OPEN) {
                        let rest = self.pending.split_off(at);
                        push_text(&mut out, std::mem::take(&mut self.pending));
                        self.pending = rest[OPEN.len()..].to_owned();
                        self.searched = 0;
                        self.mode = Mode::InCall;
                        continue;
                    }
                    let keep = partial_suffix(&self.pending, OPEN);
                    let rest = self.pending.split_off(self.pending.len() - keep);
                    push_text(&mut out, std::mem::replace(&mut self.pending, rest));
                    break;
                }
                Mode::InCall => {
                    // Only the new text can hold the closing tag (with the tag's length less
                    // one before it): a long call is not searched again at every piece.
                    let mut from = self.searched.saturating_sub(CLOSE.len() - 1);
                    while !self.pending.is_char_boundary(from) {
                        from -= 1;
                    }
                    let close = self.pending[from..].find(CLOSE).map(|i| from + i);
                    if self.stream {
                        // Read up to the closing tag, or to what may be its start.
                        let limit = close.unwrap_or_else(|| {
                            self.pending.len() - partial_suffix(&self.pending, CLOSE)
                        });
                        self.advance_call(limit, &mut out);
                    }
                    let Some(at) = close else {
                        self.searched = self.pending.len();
                        break;
                    };
                    self.searched = 0;
                    let rest = self.pending[at + CLOSE.len()..].to_owned();
                    self.pending.truncate(at);
                    let part = self.end_call(true);
                    self.mode = match part {
                        ReplyPart::Text(_) => Mode::Text,
                        _ => Mode::Between,
                    };
                    out.push(part);
                    self.pending = rest;
                }
                Mode::Bare => break,
            }
        }
        out
    }

    /// The end of the reply: whatever was held back, as a call where it is one.
    pub fn finish(mut self) -> Vec<ReplyPart> {
        let mut out = Vec::new();
        match self.mode {
            Mode::Between => {}
            Mode::Start | Mode::Text => push_text(&mut out, std::mem::take(&mut self.pending)),
            // An unclosed call (the model ended or ran out of tokens after its JSON).
            Mode::InCall => {
                if self.stream {
                    let limit = self.pending.len();
                    self.advance_call(limit, &mut out);
                }
                out.push(self.end_call(false));
            }
            Mode::Bare => match self.tools.bare_calls(&self.pending) {
                Some(calls) => out.extend(calls.into_iter().map(ReplyPart::Call)),
                None => {
                    // Not calls after all: read it as text that may hold tagged calls.
                    let mut text = ToolCallParser {
                        mode: Mode::Text,
                        ..ToolCallParser::new(Arc::clone(&self.tools))
                    };
                    out.extend(text.push(&self.pending));
                    out.extend(text.finish());
                }
            },
        }
        out
    }

    /// Streaming inside a call: read `pending[..limit]` (a character boundary) further — the
    /// head until it is known, then the arguments object, whose new text goes to `out`.
    fn advance_call(&mut self, limit: usize, out: &mut Vec<ReplyPart>) {
        if self.call == CallStream::Head {
            match head(&self.tools, &self.pending[..limit]) {
                Head::More => return,
                Head::Other => {
                    self.call = CallStream::Whole;
                    return;
                }
                Head::Call { name, at } => {
                    out.push(ReplyPart::CallBegin { name: name.clone() });
                    self.call = CallStream::Arguments {
                        name,
                        text: String::new(),
                        scanned: at,
                        depth: 0,
                        in_string: false,
                        escaped: false,
                    };
                }
            }
        }
        let CallStream::Arguments {
            name,
            text,
            scanned,
            depth,
            in_string,
            escaped,
        } = &mut self.call
        else {
            return;
        };
        let mut piece = String::new();
        let mut closed = false;
        // (The closing tag is never found before what was read: `limit` excluded any text
        // that might start it.)
        for c in self.pending[(*scanned).min(limit)..limit].chars() {
            *scanned += c.len_utf8();
            if *in_string {
                if *escaped {
                    *escaped = false;
                } else if c == '\\' {
                    *escaped = true;
                } else if c == '"' {
                    *in_string = false;
                }
            } else {
                match c {
                    c if c.is_ascii_whitespace() => continue,
                    '"' => *in_string = true,
                    '{' | '[' => *depth += 1,
                    '}' | ']' => *depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            piece.push(c);
            if *depth == 0 {
                closed = true;
                break;
            }
        }
        text.push_str(&piece);
        if !piece.is_empty() {
            out.push(ReplyPart::CallArguments(piece));
        }
        if closed {
            self.call = CallStream::Closed {
                name: std::mem::take(name),
                text: std::mem::take(text),
            };
        }
    }

    /// The end of the held call: a streamed call's end, else the body as a call or as the
    /// text it was (with its tags).
    fn end_call(&mut self, closed: bool) -> ReplyPart {
        match std::mem::take(&mut self.call) {
            CallStream::Arguments { name, text, .. } | CallStream::Closed { name, text } => {
                self.pending.clear();
                ReplyPart::CallEnd(ToolCall {
                    name,
                    arguments: text,
                })
            }
            CallStream::Head | CallStream::Whole => self.call_or_text(closed),
        }
    }

    /// The held call body as a call, or as the text it was (with its tags).
    fn call_or_text(&mut self, closed: bool) -> ReplyPart {
        let body = std::mem::take(&mut self.pending);
        match self.tools.call_of(&body) {
            Some(call) => ReplyPart::Call(call),
            None => ReplyPart::Text(format!("{OPEN}{body}{}", if closed { CLOSE } else { "" })),
        }
    }
}

/// Read the head of a `<tool_call>` block's JSON, `{"name": "<declared>", "arguments": {`
/// (or `"parameters"`), whitespace allowed between tokens.
fn head(tools: &Tools, body: &str) -> Head {
    let bytes = body.as_bytes();
    let mut at = 0;
    // Skip whitespace, then expect `literal`: `Some(true)` when it matched, `None` when the
    // text ends inside it.
    let expect = |at: &mut usize, literal: &str| -> Option<bool> {
        while *at < bytes.len() && bytes[*at].is_ascii_whitespace() {
            *at += 1;
        }
        let rest = &body[*at..];
        if rest.len() < literal.len() {
            return if literal.starts_with(rest) {
                None
            } else {
                Some(false)
            };
        }
        if rest.starts_with(literal) {
            *at += literal.len();
            Some(true)
        } else {
            Some(false)
        }
    };
    macro_rules! step {
        ($literal:expr) => {
            match expect(&mut at, $literal) {
                None => return Head::More,
                Some(false) => return Head::Other,
                Some(true) => {}
            }
        };
    }
    step!("{");
    step!("\"name\"");
    step!(":");
    step!("\"");
    let Some(len) = body[at..].find('"') else {
        return if body[at..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
            && body.len() - at <= MAX_NAME_BYTES
        {
            Head::More
        } else {
            Head::Other
        };
    };
    let name = &body[at..at + len];
    if !tools.functions.iter().any(|f| f.name == name) {
        return Head::Other;
    }
    at += len + 1;
    step!(",");
    let key_at = at;
    let arguments = expect(&mut at, "\"arguments\"");
    if arguments != Some(true) {
        at = key_at;
        match (arguments, expect(&mut at, "\"parameters\"")) {
            (_, Some(true)) => {}
            (None, _) | (_, None) => return Head::More,
            _ => return Head::Other,
        }
    }
    step!(":");
    // The arguments object opens here.
    while at < bytes.len() && bytes[at].is_ascii_whitespace() {
        at += 1;
    }
    match bytes.get(at) {
        None => Head::More,
        Some(b'{') => Head::Call {
            name: name.to_owned(),
            at,
        },
        Some(_) => Head::Other,
    }
}

/// Whether a reply starting with `rest` (not empty, no leading whitespace) may be bare JSON
/// calls: an object, a list of objects, either in a code fence marked `json` or unmarked;
/// `None` while too little is known. (A fence of another language, the common start of a
/// coding model's reply, is text at once, so it streams.)
fn bare_start(rest: &str) -> Option<bool> {
    if let Some(fenced) = rest.strip_prefix("```") {
        return match fenced.split_once('\n') {
            Some((info, body)) if matches!(info.trim(), "" | "json") => match body.trim_start() {
                "" => None,
                json => json_start(json),
            },
            Some(_) => Some(false),
            None if "json".starts_with(fenced.trim()) => None,
            None => Some(false),
        };
    }
    if "```".starts_with(rest) {
        return None;
    }
    json_start(rest)
}

/// Whether JSON text starting with `rest` (not empty) is an object or a list of objects.
fn json_start(rest: &str) -> Option<bool> {
    if rest.starts_with('{') {
        return Some(true);
    }
    match rest.strip_prefix('[').map(str::trim_start) {
        Some("") => None,
        Some(list) => Some(list.starts_with('{')),
        None => Some(false),
    }
}

fn push_text(out: &mut Vec<ReplyPart>, text: String) {
    if !text.is_empty() {
        out.push(ReplyPart::Text(text));
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// A whole reply read at once: its text (parts joined) and its calls.
pub fn parse_reply(tools: &Arc<Tools>, reply: &str) -> (String, Vec<ToolCall>) {
    let mut parser = ToolCallParser::new(Arc::clone(tools));
    let mut parts = parser.push(reply);
    parts.extend(parser.finish());
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in parts {
        match part {
            ReplyPart::Text(t) => text.push_str(&t),
            ReplyPart::Call(c) | ReplyPart::CallEnd(c) => calls.push(c),
            ReplyPart::CallBegin { .. } | ReplyPart::CallArguments(_) => {}
        }
    }
    (text, calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tools() -> Arc<Tools> {
        let json = r#"[
            {"type": "function", "function": {"name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"},
             "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
             "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"]}}}
        ]"#;
        let list: Vec<SchemaValue> = serde_json::from_str(json).unwrap();
        Arc::new(Tools::from_openai(&list).unwrap())
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn tagged_calls_are_read_out_of_text_and_the_text_kept() {
        let t = tools();
        let (text, calls) = parse_reply(
            &t,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \
             \"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": \
             {\"a\": 1, \"b\": 2}}\n</tool_call>",
        );
        assert_eq!(text, "Let me check.\n");
        assert_eq!(
            calls,
            [
                call("get_weather", r#"{"unit":"c","city":"Paris"}"#),
                call("add", r#"{"a":1,"b":2}"#)
            ]
        );
        // Unclosed at the end of the reply (end of generation right after the JSON).
        let (text, calls) = parse_reply(
            &t,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n",
        );
        assert_eq!((text.as_str(), calls.len()), ("", 1));
    }

    #[test]
    fn a_reply_that_is_only_a_call_object_is_a_call() {
        let t = tools();
        for reply in [
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "  \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            r#"{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}"#,
        ] {
            let (text, calls) = parse_reply(&t, reply);
            assert_eq!(text, "", "{reply}");
            assert_eq!(
                calls,
                [call("get_weather", r#"{"city":"Paris"}"#)],
                "{reply}"
            );
        }
        let (_, calls) = parse_reply(
            &t,
            r#"[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a": 3, "b": 4}}]"#,
        );
        assert_eq!(calls.len(), 2);
        let (_, calls) = parse_reply(&t, r#"{"name": "add"}"#);
        assert_eq!(calls, [call("add", "{}")]);
        // One a line, as Qwen2.5-Coder-0.5B writes parallel calls.
        let (text, calls) = parse_reply(
            &t,
            "{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n{\"name\": \"get_weather\", \
             \"arguments\": {\"city\": \"Oslo\"}}\n",
        );
        assert_eq!(text, "");
        assert_eq!(
            calls,
            [
                call("add", r#"{"a":1,"b":2}"#),
                call("get_weather", r#"{"city":"Oslo"}"#)
            ]
        );
        // ... but not when one of them is something else.
        let reply = "{\"name\": \"add\", \"arguments\": {}}\n{\"result\": 42}";
        assert_eq!(parse_reply(&t, reply), (reply.to_owned(), vec![]));
    }

    #[test]
    fn what_is_not_a_call_of_a_declared_tool_stays_text() {
        let t = tools();
        for reply in [
            r#"{"name": "launch_rockets", "arguments": {}}"#,
            r#"{"city": "Paris"}"#,
            r#"{"name": "add", "arguments": [1, 2]}"#,
            "{\"name\": \"add\", \"arguments\": {\"a\": 1}} and more",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\"\n</tool_call> after",
            "<tool_call>not json",
            "a < b and <tool_ca",
            "```python\nprint(1)\n```",
            "   ",
        ] {
            let (text, calls) = parse_reply(&t, reply);
            assert_eq!((text.as_str(), calls.len()), (reply, 0), "{reply}");
        }
    }

    #[test]
    fn a_code_fence_of_another_language_streams_at_once() {
        let t = tools();
        let mut p = ToolCallParser::new(Arc::clone(&t));
        assert!(p.push("```").is_empty());
        assert!(p.push("js").is_empty());
        assert_eq!(
            p.push("x\nlet a = 1;"),
            [ReplyPart::Text("```jsx\nlet a = 1;".into())]
        );
        let mut p = ToolCallParser::new(Arc::clone(&t));
        assert!(p.push("```json\n").is_empty());
        assert_eq!(
            p.push("[1, 2]"),
            [ReplyPart::Text("```json\n[1, 2]".into())]
        );
        let mut p = ToolCallParser::new(Arc::clone(&t));
        assert!(p.push("```json\n{\"name\": \"add\"}").is_empty());
        assert_eq!(p.push("\n```"), []);
        assert_eq!(p.finish(), [ReplyPart::Call(call("add", "{}"))]);
    }

    #[test]
    fn streamed_text_is_released_unless_it_may_start_a_call() {
        let t = tools();
        let mut p = ToolCallParser::new(Arc::clone(&t));
        assert_eq!(p.push("Hello <tool"), [ReplyPart::Text("Hello ".into())]);
        assert_eq!(p.push("s> are"), [ReplyPart::Text("<tools> are".into())]);
        assert_eq!(p.push(" fun <"), [ReplyPart::Text(" fun ".into())]);
        assert!(
            p.push("tool_call>{\"name\": \"add\", \"arguments\": {}}")
                .is_empty()
        );
        assert_eq!(
            p.push("</tool_call>\n\n"),
            [ReplyPart::Call(call("add", "{}"))]
        );
        assert_eq!(p.push("Done."), [ReplyPart::Text("Done.".into())]);
        assert!(p.finish().is_empty());
    }

    #[test]
    fn tools_are_checked_and_forced_calls_compile_to_schemas() {
        let parse = |json: &str| {
            let list: Vec<SchemaValue> = serde_json::from_str(json).unwrap();
            Tools::from_openai(&list)
        };
        for bad in [
            r#"[{"type": "retrieval"}]"#,
            r#"[{"type": "function"}]"#,
            r#"[{"type": "function", "function": {"name": "a b"}}]"#,
            r#"[{"type": "function", "function": {"name": ""}}]"#,
            r#"[{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]"#,
            r#"[{"type": "function", "function": {"name": "f", "parameters": 3}}]"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let t = tools();
        assert!(t.forced_call_schema(&ToolChoice::Auto).unwrap().is_none());
        assert!(
            t.forced_call_schema(&ToolChoice::Function("nope".into()))
                .is_err()
        );
        let accepts = |schema: &Schema, text: &str| {
            let mut s = crate::schema_syntax::SchemaSyntax::new(schema);
            text.bytes().all(|b| s.push(schema, b)) && s.is_complete()
        };
        let one = t
            .forced_call_schema(&ToolChoice::Function("get_weather".into()))
            .unwrap()
            .unwrap();
        assert!(accepts(
            &one,
            r#"{"name":"get_weather","arguments":{"city":"Oslo"}}"#
        ));
        assert!(!accepts(
            &one,
            r#"{"name":"add","arguments":{"city":"Oslo"}}"#
        ));
        assert!(!accepts(
            &one,
            r#"{"name":"get_weather","arguments":{"unit":"c"}}"#
        ));
        // Several: the arguments of the function named.
        let either = t
            .forced_call_schema(&ToolChoice::Required)
            .unwrap()
            .unwrap();
        for (text, ok) in [
            (r#"{"name":"add","arguments":{"a":1,"b":2}}"#, true),
            (
                r#"{"name":"get_weather","arguments":{"city":"Oslo","unit":"c"}}"#,
                true,
            ),
            (
                r#"{"name":"get_weather","arguments":{"city":"Oslo"}}"#,
                true,
            ),
            (r#"{"name":"add","arguments":{"city":"Oslo"}}"#, false),
            (r#"{"name":"get_weather","arguments":{"a":1,"b":2}}"#, false),
            (r#"{"name":"add","arguments":{"a":1.5,"b":2}}"#, false),
            (r#"{"name":"sub","arguments":{}}"#, false),
            (r#"{"arguments":{},"name":"add"}"#, false),
        ] {
            assert_eq!(accepts(&either, text), ok, "{text}");
        }
        // Parameters outside the enforced subset: the arguments are held to any object.
        let loose = parse(
            r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                "properties": {"s": {"type": "string", "pattern": "^a+$"}}}}}]"#,
        )
        .unwrap();
        let s = loose
            .forced_call_schema(&ToolChoice::Required)
            .unwrap()
            .unwrap();
        assert!(accepts(&s, r#"{"name":"f","arguments":{"s":"b","t":1}}"#));
        // The parameters' own $defs resolve (each function is an arm compiled as a root).
        let defs = parse(
            r##"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
                "$defs": {"P": {"type": "object", "properties": {"x": {"type": "boolean"}},
                "required": ["x"]}}}}}]"##,
        )
        .unwrap();
        let s = defs
            .forced_call_schema(&ToolChoice::Required)
            .unwrap()
            .unwrap();
        assert!(accepts(&s, r#"{"name":"f","arguments":{"p":{"x":true}}}"#));
        assert!(!accepts(&s, r#"{"name":"f","arguments":{"p":{"x":1}}}"#));
    }

    /// A streaming parser's parts with each streamed call joined into one `Call`, and
    /// neighbouring texts into one.
    fn joined(parts: Vec<ReplyPart>) -> Vec<ReplyPart> {
        let mut out: Vec<ReplyPart> = Vec::new();
        let mut open: Option<ToolCall> = None;
        for p in parts {
            match p {
                ReplyPart::CallBegin { name } => {
                    assert!(open.is_none(), "a call opens inside another");
                    open = Some(call(&name, ""));
                }
                ReplyPart::CallArguments(piece) => {
                    open.as_mut().expect("arguments of an open call").arguments += &piece;
                }
                ReplyPart::CallEnd(c) => {
                    let streamed = open.take().expect("the end of an open call");
                    assert_eq!(c, streamed, "the end holds what was streamed");
                    out.push(ReplyPart::Call(c));
                }
                p => {
                    assert!(open.is_none(), "{p:?} inside a streamed call");
                    out.push(p);
                }
            }
        }
        assert!(open.is_none(), "a streamed call never ended");
        merged(out)
    }

    #[test]
    fn a_tagged_call_streams_its_name_then_its_arguments() {
        let t = tools();
        let mut p = ToolCallParser::streaming(Arc::clone(&t));
        assert_eq!(
            p.push("Let me check.\n<tool_"),
            [ReplyPart::Text("Let me check.\n".into())]
        );
        assert!(p.push("call>\n{\"name\": \"get_wea").is_empty());
        assert!(p.push("ther\", \"arguments\"").is_empty());
        assert_eq!(
            p.push(": {\"city\": \"New {York} \\\"NY\\\"\", "),
            [
                ReplyPart::CallBegin {
                    name: "get_weather".into()
                },
                ReplyPart::CallArguments(r#"{"city":"New {York} \"NY\"","#.into())
            ]
        );
        assert_eq!(
            p.push("\"unit\": \"c\"}}\n</tool_call>\nDone"),
            [
                ReplyPart::CallArguments(r#""unit":"c"}"#.into()),
                ReplyPart::CallEnd(call(
                    "get_weather",
                    r#"{"city":"New {York} \"NY\"","unit":"c"}"#
                )),
                ReplyPart::Text("Done".into())
            ]
        );
        assert!(p.finish().is_empty());
        // What the whole reader reads of the same call: the same arguments.
        let (_, calls) = parse_reply(
            &t,
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"New {York} \\\"NY\\\"\", \"unit\": \"c\"}}</tool_call>",
        );
        assert_eq!(
            calls,
            [call(
                "get_weather",
                r#"{"city":"New {York} \"NY\"","unit":"c"}"#
            )]
        );

        // `parameters` too; a call cut short by the end of the reply still ends.
        let mut p = ToolCallParser::streaming(Arc::clone(&t));
        let mut parts = p.push("<tool_call> { \"name\" : \"add\" , \"parameters\" : {\"a\": 1");
        parts.extend(p.finish());
        assert_eq!(
            parts,
            [
                ReplyPart::CallBegin { name: "add".into() },
                ReplyPart::CallArguments(r#"{"a":1"#.into()),
                ReplyPart::CallEnd(call("add", r#"{"a":1"#))
            ]
        );
        // Other shapes are read whole: an undeclared name stays text; arguments as a string
        // or keys in another order come out as one call.
        for (reply, whole) in [
            (
                "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>",
                ReplyPart::Text(
                    "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>".into(),
                ),
            ),
            (
                "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
                ReplyPart::Call(call("add", r#"{"a":1}"#)),
            ),
            (
                "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"add\"}</tool_call>",
                ReplyPart::Call(call("add", r#"{"a":1}"#)),
            ),
        ] {
            let mut p = ToolCallParser::streaming(Arc::clone(&t));
            let mut parts = p.push(reply);
            parts.extend(p.finish());
            assert_eq!(parts, [whole], "{reply}");
        }
    }

    /// Pieces replies are made of: text, tags, calls, whitespace, fences, partial tags.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("Hello".to_owned()),
            Just(" ".to_owned()),
            Just("\n".to_owned()),
            Just("<".to_owned()),
            Just("<tool".to_owned()),
            Just(OPEN.to_owned()),
            Just(CLOSE.to_owned()),
            Just("{".to_owned()),
            Just("}".to_owned()),
            Just("[".to_owned()),
            Just("]".to_owned()),
            Just(",".to_owned()),
            Just("```".to_owned()),
            Just("```json\n".to_owned()),
            Just("```python\n".to_owned()),
            Just("json".to_owned()),
            Just("é".to_owned()),
            Just(r#"{"name": "add", "arguments": {"a": 1, "b": 2}}"#.to_owned()),
            Just(r#"{"name": "nope", "arguments": {}}"#.to_owned()),
            Just(r#"{"name": "get_weather", "parameters": {"city": "a\"}b"}}"#.to_owned()),
            "[a-z{}\\[\\]\": ,<>/_é\\\\]{0,6}",
        ]
    }

    fn merged(parts: Vec<ReplyPart>) -> Vec<ReplyPart> {
        let mut out: Vec<ReplyPart> = Vec::new();
        for p in parts {
            match (out.last_mut(), p) {
                (Some(ReplyPart::Text(a)), ReplyPart::Text(b)) => a.push_str(&b),
                (_, p) => out.push(p),
            }
        }
        out
    }

    proptest! {
        /// However a reply is cut into streamed pieces, the parser reads the same text and
        /// calls as from the whole reply; and no text is lost: the parts' text plus the calls'
        /// source is the reply, up to the whitespace between calls.
        #[test]
        fn streaming_in_any_pieces_reads_what_the_whole_reply_reads(
            pieces in proptest::collection::vec(piece(), 0..12),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let t = tools();
            let reply: String = pieces.concat();
            let mut bounds: Vec<usize> = cuts
                .iter()
                .map(|c| c.index(reply.len() + 1))
                .filter(|&i| reply.is_char_boundary(i))
                .collect();
            bounds.sort_unstable();
            // The parts `parser` gives for the reply pushed in the pieces `bounds` cut.
            let read = |mut parser: ToolCallParser, bounds: &[usize]| {
                let mut parts = Vec::new();
                let mut from = 0;
                for &b in bounds.iter().chain([reply.len()].iter()) {
                    parts.extend(parser.push(&reply[from..b]));
                    from = b;
                }
                parts.extend(parser.finish());
                parts
            };
            let expected = merged(read(ToolCallParser::new(Arc::clone(&t)), &[]));
            let got = merged(read(ToolCallParser::new(Arc::clone(&t)), &bounds));
            prop_assert_eq!(got, expected.clone());
            let calls = expected.iter().filter(|p| matches!(p, ReplyPart::Call(_))).count();
            // A streaming parser reads the same whatever the pieces, and its streamed calls'
            // pieces join into their ends.
            let streaming = |bounds: &[usize]| {
                joined(read(ToolCallParser::streaming(Arc::clone(&t)), bounds))
            };
            prop_assert_eq!(streaming(&bounds), streaming(&[]));
            if calls == 0 {
                let text: String = expected
                    .iter()
                    .map(|p| match p { ReplyPart::Text(t) => t.as_str(), _ => "" })
                    .collect();
                prop_assert_eq!(text, reply);
            }
        }
    }
}
