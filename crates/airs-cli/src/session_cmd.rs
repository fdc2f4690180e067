//! `airs session`: one conversation turn (or a script of turns) of a persisted session.
//!
//! The session lives in a SQLite history database (`--db`, see `airs_runtime::store`): the
//! first use creates it (with `--priority` and `--system`), later uses continue it — in a new
//! process, its KV cache is rebuilt from the stored token history before the new turn. Each
//! turn samples with the flags given (greedy unless `--temperature`); turn `t` draws with a seed
//! derived from `--seed` and `t`, so a rerun of a turn draws what the first run drew. A turn's reply is printed only after the turn is committed (`synchronous=FULL`
//! unless `--sync normal`), so whatever was printed survives the process being killed.
//!
//! - `airs session --db D --model M --session S "text"`: append `text`, generate (greedy unless
//!   `--temperature`), commit, print the reply (`--json`: one object).
//! - `--script FILE`: one user message per non-empty line. Lines the session already holds (a
//!   rerun after a crash) are checked against the history and skipped; each new turn prints
//!   `ack <turn> <json>` once committed.
//! - `--show`: print the conversation (`--json`: an array of `{role, content, tokens}`).
//! - `--tools FILE` (OpenAI's `tools` array; a session's first turn sets them): the reply's
//!   calls print as JSON lines; `--tool-result TEXT` (once per call) sends the results of the
//!   last reply's calls as the next turn, in place of a user message.
//!
//! Memory: the weights (`--loader`, lazy by default), the KV pool (`--pool`) and the scratch are
//! all charged to the model pool (`--device-ram`, `--model-pool`); what does not fit fails at
//! start with what holds the pool.
//!
//! Cost: loading the model, rebuilding the session's cache (its history's forward
//! passes) on the first turn of the process, then each turn's passes and one commit.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use airs_engine::KvType;
use airs_runtime::tools::parse_reply;
use airs_runtime::{
    ChoiceEnd, Completion, Durability, Event, HistoryStore, Priority, Prompt, Request, Role,
    Scheduler, SchedulerConfig, SessionTurn,
};
use airs_tokenizer::chat::ChatMessage;
use anyhow::Context;
use serde_json::json;

use crate::model_file::{LoaderArgs, default_threads, load};
use crate::pool_args::PoolArgs;
use crate::run::{DraftArgs, SamplingArgs};

/// `--sync`: how a commit reaches the disk.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncMode {
    /// fsync the WAL at every commit: survives process kill and power loss.
    Full,
    /// No fsync per commit: survives process kill, not power loss.
    Normal,
}

#[derive(clap::Args, Debug)]
pub struct SessionArgs {
    /// The history database (created if missing).
    #[arg(long)]
    pub db: PathBuf,
    /// The GGUF model (sessions are bound to the model they were created with).
    #[arg(long)]
    pub model: PathBuf,
    /// The session's name.
    #[arg(long)]
    pub session: String,
    /// interactive, system or background (updates an existing session).
    #[arg(long, default_value = "interactive", value_parser = parse_priority)]
    pub priority: Priority,
    /// A system message opening a new session.
    #[arg(long)]
    pub system: Option<String>,
    /// The user message.
    #[arg(
        conflicts_with_all = ["script", "show", "tool_results"],
        required_unless_present_any = ["script", "show", "tool_results"]
    )]
    pub text: Option<String>,
    /// Tools the session may call: a JSON file holding OpenAI's `tools` array. A session's
    /// tools are set by its first turn (later turns give the same file, or none and the reply
    /// is printed as text). Calls are
    /// printed as JSON lines (`{"tool_call": {"name", "arguments"}}`) and with --json as
    /// `tool_calls`.
    #[arg(long, value_name = "FILE", conflicts_with = "show")]
    pub tools: Option<PathBuf>,
    /// Whether the reply calls a tool: auto (the model decides), required (a call of one of
    /// them), none (the reply is text), or a function's name (a call of it).
    #[arg(
        long,
        value_name = "CHOICE",
        default_value = "auto",
        requires = "tools"
    )]
    pub tool_choice: String,
    /// The result of a call the session's last reply made, sent instead of a user message
    /// (repeatable, one per call, in the calls' order).
    #[arg(long = "tool-result", value_name = "TEXT", conflicts_with_all = ["script", "show"])]
    pub tool_results: Vec<String>,
    /// A file of user messages, one per line; prints `ack <turn> <json>` after each commit.
    #[arg(long, conflicts_with = "show")]
    pub script: Option<PathBuf>,
    /// Print the conversation instead of adding to it.
    #[arg(long)]
    pub show: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// KV pool budget (e.g. 64M), taken from the model pool with the weights and scratch.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub pool: usize,
    #[command(flatten)]
    pub model_pool: PoolArgs,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// KV cache element type: f16, f32, or q8_0 (34 bytes a 32-value block, about half f16's;
    /// attention as fast as over f16 where measured: BENCHMARKS.md).
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, value_enum, default_value_t = SyncMode::Full)]
    pub sync: SyncMode,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn parse_priority(s: &str) -> Result<Priority, String> {
    s.parse()
}

/// A non-zero byte size such as `256K` or `64M` ([`airs_runtime::fit::parse_size`]'s units).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let bytes = airs_runtime::fit::parse_size(s)?;
    match usize::try_from(bytes) {
        Ok(b) if b > 0 => Ok(b),
        _ => Err(format!("size {s:?} is out of range")),
    }
}

/// What the sink of one turn collected.
#[derive(Default)]
struct TurnOutcome {
    end: Option<ChoiceEnd>,
    done: Option<Completion>,
    error: Option<airs_runtime::RuntimeError>,
}

/// The history of session `name` in `store`: `(role, content, tokens)` of every message.
fn stored_history(
    store: &HistoryStore,
    name: &str,
) -> anyhow::Result<Vec<(Role, String, Vec<u32>)>> {
    let Some(stored) = store.find_session(name)? else {
        return Ok(Vec::new());
    };
    Ok(store
        .load_messages(stored.id)?
        .into_iter()
        .map(|m| (m.role, m.content, m.tokens))
        .collect())
}

pub fn run(args: SessionArgs) -> anyhow::Result<()> {
    let durability = match args.sync {
        SyncMode::Full => Durability::Full,
        SyncMode::Normal => Durability::Normal,
    };
    // `--show` only reads: it needs no writer lock, so it works while a server writes.
    let store = if args.show {
        HistoryStore::open_reader(&args.db)
    } else {
        HistoryStore::open(&args.db, durability)
    }
    .with_context(|| format!("opening {}", args.db.display()))?;
    let mut out = std::io::stdout().lock();
    if args.show {
        let messages = stored_history(&store, &args.session)?;
        anyhow::ensure!(!messages.is_empty(), "no session {:?}", args.session);
        if args.json {
            let v: Vec<_> = messages
                .iter()
                .map(|(r, c, t)| json!({"role": r.name(), "content": c, "tokens": t}))
                .collect();
            writeln!(out, "{}", serde_json::Value::Array(v))?;
        } else {
            for (r, c, _) in &messages {
                writeln!(out, "{}: {c}", r.name())?;
            }
        }
        return Ok(());
    }
    let said: Vec<String> = stored_history(&store, &args.session)?
        .into_iter()
        .filter(|(r, _, _)| *r == Role::User)
        .map(|(_, c, _)| c)
        .collect();

    let registry = args.model_pool.registry()?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let model = Arc::new(load(Some(&args.model), &args.load, &registry, threads)?);
    let mut config = SchedulerConfig::new(args.pool);
    config.kv_type = args.kv_type;
    config.draft = args.draft.config();
    let mut scheduler = Scheduler::new(model, config, Some(store))?;
    for n in scheduler.kv_pool().memory().notices() {
        eprintln!("airs: note: {n}");
    }

    let mut params = args.sampling.params()?;
    let tools = match &args.tools {
        None => None,
        Some(path) => crate::run::tools_from_file(path, &args.tool_choice, &mut params)?,
    };
    // A turn's JSON, and with tools its lines: the text, then each call.
    type Reply = (serde_json::Value, Option<Vec<String>>);
    let mut turn = |messages: Vec<ChatMessage>| -> anyhow::Result<Reply> {
        let started = std::time::Instant::now();
        let prompt = match &tools {
            Some(tools) => Prompt::ChatWithTools {
                messages,
                tools: Arc::clone(tools),
            },
            None => Prompt::Chat(messages),
        };
        let mut request = Request::generate(prompt, params.clone()).with_priority(args.priority);
        request.session = Some(SessionTurn {
            name: args.session.clone(),
            system: args.system.clone(),
        });
        let outcome = Arc::new(Mutex::new(TurnOutcome::default()));
        let o = Arc::clone(&outcome);
        let id = scheduler.submit(
            request,
            Box::new(move |event| {
                let mut o = o.lock().unwrap();
                match event {
                    Event::ChoiceEnd(e) => o.end = Some(e),
                    Event::Done(d) => o.done = Some(d),
                    Event::Failed(e) => o.error = Some(e),
                    _ => {}
                }
                true
            }),
        )?;
        scheduler.run_until_done(id);
        let TurnOutcome { end, done, error } = std::mem::take(&mut *outcome.lock().unwrap());
        if let Some(e) = error {
            return Err(e.into());
        }
        let (end, done) = end.zip(done).context("the turn ended without a result")?;
        let calls = tools.as_ref().map(|t| parse_reply(t, &end.text));
        let lines = calls.as_ref().map(|(text, calls)| {
            let mut lines: Vec<String> = calls.iter().map(crate::run::call_line).collect();
            if !text.is_empty() {
                lines.insert(0, text.clone());
            }
            lines
        });
        let reply = json!({
            "session": args.session,
            "turn": done.turn,
            "text": end.text,
            "content": calls.as_ref().map(|(text, _)| text),
            "tool_calls": calls.as_ref().map(|(_, calls)| {
                calls
                    .iter()
                    .map(|c| json!({"name": c.name, "arguments": c.arguments}))
                    .collect::<Vec<_>>()
            }),
            "tokens": end.tokens,
            "stop_reason": end.reason.name(),
            "prompt_tokens": done.usage.prompt_tokens,
            "prefill_tokens": done.prefill_tokens,
            "cached_tokens": done.usage.cached_tokens,
            "rebuild": { "recomputed_tokens": done.rebuilt_tokens },
            "preemptions": done.preemptions,
            "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
        });
        Ok((reply, lines))
    };

    if let Some(script) = &args.script {
        let text = std::fs::read_to_string(script)
            .with_context(|| format!("reading {}", script.display()))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        for (i, said) in said.iter().enumerate() {
            anyhow::ensure!(
                lines.get(i) == Some(&said.as_str()),
                "line {} of the script does not match turn {i} of session {:?}",
                i + 1,
                args.session
            );
        }
        for (n, line) in lines.iter().enumerate().skip(said.len()) {
            let (reply, _) = turn(vec![ChatMessage::user(*line)])?;
            // The turn is committed: acknowledge it.
            writeln!(out, "ack {n} {reply}")?;
            out.flush()?;
        }
        return Ok(());
    }

    let messages = match &args.text {
        Some(text) => vec![ChatMessage::user(text.as_str())],
        None => args
            .tool_results
            .iter()
            .map(|r| ChatMessage::new("tool", r.as_str()))
            .collect(),
    };
    let (reply, lines) = turn(messages)?;
    if args.json {
        writeln!(out, "{reply}")?;
    } else if let Some(lines) = lines {
        for line in lines {
            writeln!(out, "{line}")?;
        }
    } else {
        writeln!(out, "{}", reply["text"].as_str().unwrap_or(""))?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("256K"), Ok(256 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
    }
}
