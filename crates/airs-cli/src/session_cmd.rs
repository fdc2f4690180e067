//! `airs session`: one conversation turn (or a script of turns) of a persisted session.
//!
//! The session lives in a SQLite history database (`--db`, see `airs_runtime::store`): the
//! first use creates it (with `--priority`, `--system`, `--temperature`, `--seed`), later uses
//! continue it — in a new process, its KV cache is rebuilt from the stored token history before
//! the new turn. A turn's reply is printed only after the turn is committed (`synchronous=FULL`
//! unless `--sync normal`), so whatever was printed survives the process being killed.
//!
//! - `airs session --db D --model M --session S "text"`: append `text`, generate (greedy unless
//!   `--temperature`), commit, print the reply (`--json`: one object).
//! - `--script FILE`: one user message per non-empty line. Lines the session already holds (a
//!   rerun after a crash) are checked against the history and skipped; each new turn prints
//!   `ack <turn> <json>` once committed.
//! - `--show`: print the conversation (`--json`: an array of `{role, content, tokens}`).
//!
//! Memory: the weights (`--loader`, lazy by default), the KV pool (`--pool`) and the scratch are
//! all charged to the model pool (`--device-ram`, `--model-pool`); what does not fit fails at
//! start with what holds the pool.
//!
//! Cost: loading the model, rebuilding the session's cache (its history's forward
//! passes) on the first turn of the process, then each turn's passes and one commit.

use std::io::Write;
use std::path::PathBuf;

use airs_engine::KvType;
use airs_runtime::{
    Durability, Engine, HistoryStore, ManagerConfig, Priority, RequestOptions, Role,
    SamplerSettings, SessionManager, SessionSpec,
};
use anyhow::Context;
use serde_json::json;

use crate::model_file::LoaderArgs;
use crate::pool_args::PoolArgs;

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
    #[arg(conflicts_with_all = ["script", "show"], required_unless_present_any = ["script", "show"])]
    pub text: Option<String>,
    /// A file of user messages, one per line; prints `ack <turn> <json>` after each commit.
    #[arg(long, conflicts_with = "show")]
    pub script: Option<PathBuf>,
    /// Print the conversation instead of adding to it.
    #[arg(long)]
    pub show: bool,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature of a new session; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sampler seed of a new session.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV pool budget (e.g. 64M), taken from the model pool with the weights and scratch.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub pool: usize,
    #[command(flatten)]
    pub model_pool: PoolArgs,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// KV cache element type.
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

/// A non-zero byte size such as `256K` or `64M` ([`crate::fit::parse_size`]'s units).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let bytes = crate::fit::parse_size(s)?;
    match usize::try_from(bytes) {
        Ok(b) if b > 0 => Ok(b),
        _ => Err(format!("size {s:?} is out of range")),
    }
}

fn threads(t: Option<usize>) -> usize {
    t.unwrap_or_else(crate::run::default_threads)
}

pub fn run(args: SessionArgs) -> anyhow::Result<()> {
    let registry = args.model_pool.registry()?;
    let engine = Engine::load(
        &registry,
        &args.model,
        &args.load.options(),
        threads(args.threads),
    )
    .with_context(|| format!("loading {}", args.model.display()))?;
    let durability = match args.sync {
        SyncMode::Full => Durability::Full,
        SyncMode::Normal => Durability::Normal,
    };
    let store = HistoryStore::open(&args.db, durability)
        .with_context(|| format!("opening {}", args.db.display()))?;
    let mut config = ManagerConfig::new(args.pool);
    config.kv_type = args.kv_type;
    let mut manager = SessionManager::new(engine, store, config)?;
    for n in manager.pool().memory().notices() {
        eprintln!("airs: note: {n}");
    }
    let spec = SessionSpec {
        name: args.session.clone(),
        priority: args.priority,
        system: args.system.clone(),
        sampler: SamplerSettings {
            temperature: args.temperature,
            seed: args.seed,
            ..SamplerSettings::default()
        },
        salt: None,
    };
    let id = manager.open_session(&spec)?;
    let options = RequestOptions {
        max_tokens: args.max_tokens,
    };
    let mut out = std::io::stdout().lock();

    if args.show {
        let store = manager.store();
        let stored = store
            .find_session(&args.session)?
            .context("the session vanished")?;
        let messages = store.load_messages(stored.id)?;
        if args.json {
            let v: Vec<_> = messages
                .iter()
                .map(|m| json!({"role": m.role.name(), "content": m.content, "tokens": m.tokens}))
                .collect();
            writeln!(out, "{}", serde_json::Value::Array(v))?;
        } else {
            for m in &messages {
                writeln!(out, "{}: {}", m.role.name(), m.content)?;
            }
        }
        return Ok(());
    }

    let turn_json = |r: &airs_runtime::Reply| {
        json!({
            "session": args.session,
            "turn": r.turn,
            "text": r.text,
            "tokens": r.tokens,
            "stop_reason": r.stop_reason.name(),
            "prompt_tokens": r.prompt_tokens,
            "prefill_tokens": r.prefill_tokens,
            "rebuild": r.rebuild,
            "evictions": r.evictions,
            "elapsed_ms": r.elapsed.as_secs_f64() * 1e3,
        })
    };

    if let Some(script) = &args.script {
        let text = std::fs::read_to_string(script)
            .with_context(|| format!("reading {}", script.display()))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let done: Vec<String> = manager
            .history(id)?
            .into_iter()
            .filter(|(r, _)| *r == Role::User)
            .map(|(_, c)| c)
            .collect();
        for (i, said) in done.iter().enumerate() {
            anyhow::ensure!(
                lines.get(i) == Some(&said.as_str()),
                "line {} of the script does not match turn {i} of session {:?}",
                i + 1,
                args.session
            );
        }
        for (turn, line) in lines.iter().enumerate().skip(done.len()) {
            let reply = manager.request(id, line, &options)?;
            // The turn is committed: acknowledge it.
            writeln!(out, "ack {turn} {}", turn_json(&reply))?;
            out.flush()?;
        }
        return Ok(());
    }

    let text = args
        .text
        .as_deref()
        .expect("clap requires text, --script or --show");
    let reply = manager.request(id, text, &options)?;
    if args.json {
        writeln!(out, "{}", turn_json(&reply))?;
    } else {
        writeln!(out, "{}", reply.text)?;
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
