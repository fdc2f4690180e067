//! `airs run`: generate text from a prompt or a chat message, streaming it to stdout — one
//! request to the runtime's scheduler ([`airs_runtime::Scheduler`]), with a KV pool sized for
//! that one sequence.
//!
//! The model file is loaded with `--loader` (default lazy: generation starts while the file is
//! still being read; see `model_file`). `--json` reports the loader, the region's memory state
//! (locked, huge-page, read-only, pinned), the time to first token and to fully resident
//! counted from opening the file, and the region's notices; it waits for the load to complete
//! before reporting.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use airs_engine::{KvType, SamplerConfig};
use airs_runtime::fit::{peak_rss_bytes, single_sequence_config};
use airs_runtime::json_schema::{Schema, SchemaValue};
use airs_runtime::tools::{ReplyPart, ToolCall, ToolCallParser, ToolChoice, Tools, parse_reply};
use airs_runtime::{
    ChoiceEnd, Completion, Event, FinishReason, GenerationParams, OutputFormat, Prompt, Request,
    Scheduler,
};
use airs_tokenizer::chat::ChatMessage;
use anyhow::Context;
use serde_json::json;

use crate::model_file::{FillProgress, LoaderArgs, Notices, default_threads, load};
use crate::pool_args::{PoolArgs, model_pool_json};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Raw prompt text to continue (default: start from BOS alone).
    pub prompt: Option<String>,
    /// A user message, formatted with the model's chat template.
    #[arg(long, conflicts_with = "prompt")]
    pub chat: Option<String>,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Tools --chat may call: a JSON file holding OpenAI's `tools` array. Calls are printed
    /// as JSON lines (`{"tool_call": {"name", "arguments"}}`) and with --json as
    /// `tool_calls`.
    #[arg(long, value_name = "FILE", requires = "chat")]
    pub tools: Option<PathBuf>,
    /// Whether the reply calls a tool: auto (the model decides), required (a call of one of
    /// them), none (the tools are not shown), or a function's name (a call of it).
    #[arg(
        long,
        value_name = "CHOICE",
        default_value = "auto",
        requires = "tools"
    )]
    pub tool_choice: String,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV cache element type: f16, f32, or q8_0 (34 bytes a 32-value block, about half f16's;
    /// attention as fast as over f16 where measured: BENCHMARKS.md).
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    #[command(flatten)]
    pub load: LoaderArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Speculative decoding, as `airs run` and `airs serve` take it.
#[derive(clap::Args, Debug, Clone)]
pub struct DraftArgs {
    /// Most draft tokens a decoding sequence computes a step, looked up in its own context
    /// (prompt lookup; the tokens generated are the same, only faster when the reply copies
    /// its context), as many as the step times measured so far say pay; 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = airs_runtime::lookup::DEFAULT_DRAFT_TOKENS)]
    pub draft_tokens: usize,
}

impl DraftArgs {
    pub fn config(&self) -> airs_runtime::DraftConfig {
        airs_runtime::DraftConfig::with_tokens(self.draft_tokens)
    }
}

/// The generation flags `airs run` and `airs session` share.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate (at least 1).
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Add BIAS to token ID's logit before sampling, as ID=BIAS (repeatable; BIAS `-inf`
    /// bans the token).
    #[arg(long = "logit-bias", value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// The shape of the output: any text, or one JSON object (generation ends when it closes).
    #[arg(long, value_enum, default_value_t = FormatArg::Text)]
    pub format: FormatArg,
    /// One JSON object of the JSON schema in this file (the subset `airs serve` takes as
    /// `response_format` `json_schema`).
    #[arg(long, value_name = "FILE", conflicts_with = "format")]
    pub json_schema: Option<PathBuf>,
}

/// `--logit-bias ID=BIAS`.
fn parse_logit_bias(arg: &str) -> Result<(u32, f32), String> {
    let (id, bias) = arg
        .split_once('=')
        .ok_or_else(|| format!("expected ID=BIAS, not {arg:?}"))?;
    let id = id
        .parse()
        .map_err(|_| format!("the token id must be a number, not {id:?}"))?;
    let bias: f32 = bias
        .parse()
        .map_err(|_| format!("the bias must be a number or -inf, not {bias:?}"))?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(format!("the bias must be finite or -inf, not {bias}"));
    }
    Ok((id, bias))
}

/// `--format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum FormatArg {
    Text,
    JsonObject,
}

impl SamplingArgs {
    pub fn params(&self) -> anyhow::Result<GenerationParams> {
        let format = match (&self.json_schema, self.format) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let schema: SchemaValue = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", path.display()))?;
                let schema = Schema::compile(&schema)
                    .with_context(|| format!("the JSON schema in {}", path.display()))?;
                OutputFormat::JsonSchema(std::sync::Arc::new(schema))
            }
            (None, FormatArg::Text) => OutputFormat::Text,
            (None, FormatArg::JsonObject) => OutputFormat::JsonObject,
        };
        Ok(GenerationParams {
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            sampler: SamplerConfig {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                seed: self.seed,
                logit_bias: self.logit_bias.clone(),
                ..SamplerConfig::default()
            },
            logprobs: None,
            n: 1,
            ignore_eos: false,
            format,
        })
    }
}

/// What the sink collected.
#[derive(Default)]
struct Outcome {
    end: Option<ChoiceEnd>,
    done: Option<Completion>,
    error: Option<airs_runtime::RuntimeError>,
}

/// The tools of `--tools FILE` (OpenAI's `tools` array) under `--tool-choice CHOICE` (auto,
/// required, none or a function's name): a choice that forces a call puts `params` under the
/// call's schema; `None` when the choice is `none` (the tools are not shown).
pub fn tools_from_file(
    path: &std::path::Path,
    choice: &str,
    params: &mut GenerationParams,
) -> anyhow::Result<Option<Arc<Tools>>> {
    let choice = match choice {
        "auto" => ToolChoice::Auto,
        "required" => ToolChoice::Required,
        "none" => ToolChoice::None,
        name => ToolChoice::Function(name.to_owned()),
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let list: Vec<SchemaValue> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array", path.display()))?;
    let tools = Arc::new(
        Tools::from_openai(&list).with_context(|| format!("the tools in {}", path.display()))?,
    );
    if let Some(schema) = tools.forced_call_schema(&choice)? {
        anyhow::ensure!(
            params.format == OutputFormat::Text,
            "a --tool-choice that forces a call cannot be combined with --format or \
             --json-schema"
        );
        params.format = OutputFormat::JsonSchema(Arc::new(schema));
    }
    Ok((choice != ToolChoice::None).then_some(tools))
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    // One model pool account: weights (through the registry), scratch and KV cache.
    let registry = args.pool.registry()?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let model = load(args.model.as_deref(), &args.load, &registry, threads)?;
    let mut notices = Notices::default();
    let progress = Arc::new(Mutex::new(FillProgress::start(&model)));
    let load_ms = model.opened_at.elapsed().as_secs_f64() * 1e3;

    let mut params = args.sampling.params()?;
    let tools = match &args.tools {
        None => None,
        Some(path) => tools_from_file(path, &args.tool_choice, &mut params)?,
    };
    let prompt_ids: Vec<u32> = if let Some(user) = &args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::system(system.clone()));
        }
        messages.push(ChatMessage::user(user.clone()));
        model.encode_chat_with_tools(&messages, tools.as_deref().map(Tools::chat))?
    } else {
        model.encode_prompt(args.prompt.as_deref().unwrap_or(""))
    };
    anyhow::ensure!(
        !prompt_ids.is_empty(),
        "the prompt is empty and the model has no BOS token to start from"
    );
    let context_len = model.context_len();
    anyhow::ensure!(
        prompt_ids.len() < context_len,
        "the prompt has {} tokens but the model's context holds {context_len}",
        prompt_ids.len()
    );
    // The paged KV cache: a pool sized for this one sequence, filled block by block on demand.
    let capacity = (prompt_ids.len() + params.max_tokens).min(context_len);
    let mut config = single_sequence_config(&model.shape, capacity, args.kv_type)?;
    config.draft = args.draft.config();
    let model = Arc::new(model);
    let mut scheduler = Scheduler::new(Arc::clone(&model), config, None)?;

    let stdout = std::io::stdout();
    // Streamed text and a redrawn bar cannot share a terminal: the text wins.
    let stdout_is_terminal = stdout.is_terminal();
    let stream = !args.json;
    let write = {
        let progress = Arc::clone(&progress);
        move |piece: &str| {
            if !stream || piece.is_empty() {
                return;
            }
            if stdout_is_terminal && let Some(mut p) = progress.lock().unwrap().take() {
                p.finish();
            }
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    if let Some(p) = &args.prompt {
        write(p);
    }
    // With tools, text goes through the call reader: calls print as JSON lines.
    let mut parser = tools.as_ref().map(|t| ToolCallParser::new(Arc::clone(t)));
    let mut print = move |piece: &str, last: bool| {
        let Some(reader) = parser.as_mut() else {
            write(piece);
            return;
        };
        let mut parts = reader.push(piece);
        if last && let Some(reader) = parser.take() {
            parts.extend(reader.finish());
        }
        for part in parts {
            match part {
                ReplyPart::Text(text) => write(&text),
                ReplyPart::Call(call) | ReplyPart::CallEnd(call) => {
                    write(&format!("\n{}\n", call_line(&call)))
                }
                // A whole-call reader gives out no pieces of calls.
                ReplyPart::CallBegin { .. } | ReplyPart::CallArguments(_) => {}
            }
        }
    };
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let sink = {
        let outcome = Arc::clone(&outcome);
        Box::new(move |event: Event| {
            let mut o = outcome.lock().unwrap();
            match event {
                Event::Token(t) => print(&t.text, false),
                Event::ChoiceEnd(end) => {
                    print(&end.tail, true);
                    o.end = Some(end);
                }
                Event::Done(done) => o.done = Some(done),
                Event::Failed(e) => o.error = Some(e),
                Event::Admitted { .. } | Event::Embedding(_) => {}
            }
            true
        })
    };
    let request = Request::generate(Prompt::Tokens(prompt_ids.clone()), params);
    let submitted_at = std::time::Instant::now();
    let id = scheduler.submit(request, sink)?;
    scheduler.run_until_done(id);
    let Outcome { end, done, error } = std::mem::take(&mut *outcome.lock().unwrap());
    if let Some(e) = error {
        return Err(e.into());
    }
    let (end, done) = end
        .zip(done)
        .context("the request ended without a result")?;
    let ttft_from_open = done
        .time_to_first_token
        .map(|t| submitted_at.duration_since(model.opened_at) + t);
    if args.json {
        // Report the final memory state: locked, huge pages and read-only come at the end.
        model.wait_resident()?;
    }
    if let Some(mut p) = progress.lock().unwrap().take() {
        p.finish();
    }
    notices.print_new(&model);
    // The blocks the sequence held: its computed positions (the last sampled token is not
    // computed unless it ended generation).
    let pool = scheduler.kv_pool();
    let computed = prompt_ids.len() + end.tokens.len()
        - usize::from(end.reason != FinishReason::EndOfGeneration && !end.tokens.is_empty());
    let kv_bytes = computed.div_ceil(pool.tokens_per_block()) * pool.block_bytes();
    if args.json {
        let stats = model.region().map(|r| r.stats());
        let notices: Vec<String> = model.notices().iter().map(|n| n.to_string()).collect();
        let report = json!({
            "model": model.name,
            "loader": model.loader_name(),
            "region_bytes": stats.as_ref().map_or(model.model.image().bytes().len() as u64, |s| s.bytes),
            "locked_bytes": stats.as_ref().map_or(0, |s| s.locked_bytes),
            "huge_page_bytes": stats.as_ref().map_or(0, |s| s.huge_page_bytes),
            // The embedded model lives in the binary's read-only data.
            "read_only": stats.as_ref().is_none_or(|s| s.read_only),
            "pinned": stats.as_ref().is_some_and(|s| s.pinned),
            "ttft_ms": ttft_from_open.map(|d| d.as_secs_f64() * 1e3),
            "fully_resident_ms": model.fully_resident_after_open().map(|d| d.as_secs_f64() * 1e3),
            "notices": notices,
            "prompt_token_ids": prompt_ids,
            "generated_token_ids": end.tokens,
            "text": end.text,
            "tool_calls": tools.as_ref().map(|t| {
                parse_reply(t, &end.text)
                    .1
                    .iter()
                    .map(|c| json!({"name": c.name, "arguments": c.arguments}))
                    .collect::<Vec<_>>()
            }),
            "stop_reason": end.reason.name(),
            "threads": model.runtime.pool.threads(),
            "isa": format!("{:?}", model.runtime.isa).to_lowercase(),
            "kv_type": args.kv_type.name(),
            "timings": {
                "load_ms": load_ms,
                "ttft_ms": done.time_to_first_token.map(|d| d.as_secs_f64() * 1e3),
                "prefill_tokens": done.prefill_tokens,
                "prefill_tokens_per_s": rate(done.prefill_tokens, done.prefill_time),
                "decode_tokens": done.decode_tokens,
                "decode_tokens_per_s": rate(done.decode_tokens, done.decode_time),
                "draft_tokens": scheduler.stats().draft_tokens,
                "drafts_accepted": scheduler.stats().drafts_accepted,
            },
            "memory": {
                "weights_bytes": model.model.weight_bytes(),
                "kv_bytes": kv_bytes,
                "kv_pool": kv_pool_json(&pool.stats()),
                "model_pool": model_pool_json(registry.pool()),
                "peak_rss_bytes": peak_rss_bytes(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens at {:.1} t/s, {} generated at {:.1} t/s, stop: {}]",
            done.prefill_tokens,
            rate(done.prefill_tokens, done.prefill_time),
            end.tokens.len(),
            rate(done.decode_tokens, done.decode_time),
            end.reason.name()
        );
    }
    Ok(())
}

/// A call as `airs run` and `airs session` print it: one JSON line, the arguments as the
/// object they are.
pub(crate) fn call_line(call: &ToolCall) -> String {
    let arguments: serde_json::Value =
        serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!(call.arguments));
    json!({"tool_call": {"name": call.name, "arguments": arguments}}).to_string()
}

pub fn rate(tokens: usize, time: std::time::Duration) -> f64 {
    if time.is_zero() {
        0.0
    } else {
        tokens as f64 / time.as_secs_f64()
    }
}

/// The paged KV pool's accounting, for `--json`.
pub fn kv_pool_json(s: &airs_memory::KvPoolStats) -> serde_json::Value {
    json!({
        "pool_bytes": s.pool_bytes,
        "block_bytes": s.block_bytes,
        "bytes_per_token": s.bytes_per_token,
        "tokens_per_block": s.tokens_per_block,
        "blocks_total": s.blocks_total,
        "blocks_used": s.blocks_used,
        "blocks_free": s.blocks_free,
        "blocks_cached": s.blocks_cached,
        "used_bytes": s.used_bytes,
        "tokens_stored": s.tokens_stored,
        "waste_bytes": s.waste_bytes,
        "shared_blocks": s.shared_blocks,
        "shared_refcounts": s.shared_refcounts,
        "shared_savings_bytes": s.shared_savings_bytes,
        "pinned": s.pinned,
    })
}
