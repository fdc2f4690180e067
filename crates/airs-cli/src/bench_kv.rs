//! `airs bench kv`: what the paged KV cache costs and saves on a real model, at the engine
//! level (forward passes over KV caches; nothing is sampled: decode steps feed a fixed token
//! sequence, which costs what any token costs). N sessions share a P-token prompt prefix (real
//! text under the model's tokenizer), each adds its own S-token suffix and decodes G tokens,
//! all in one KV pool and all kept resident. Reports
//! prompt and prefix tokens computed (the prefix once, not N times), KV bytes allocated, bytes
//! per token, waste, the saving versus no sharing and versus contiguous caches, and tokens/s.
//!
//! With `--decode-context C`, it also measures decode speed at context C through the paged
//! cache and through the contiguous cache, alternating rounds of the two on the same machine
//! state (these machines are noisy) and reporting medians.
//!
//! Cost: N prefills of S tokens plus one of P, N × G decode steps; the comparison adds two
//! prefills of C tokens.

use std::path::PathBuf;
use std::time::Instant;

use airs_engine::{
    ContiguousKv, KvCache, KvType, Logits, Model, PagedKv, PagedKvConfig, PagedKvPool, Runtime,
};
use airs_memory::KvPoolStats;
use airs_runtime::LoadedModel;
use airs_tokenizer::EncodeOptions;
use anyhow::Context;
use serde_json::{Value, json};

use crate::model_file::{LoaderArgs, default_threads, load};

#[derive(clap::Args, Debug)]
pub struct BenchKvArgs {
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Prompt tokens every session shares.
    #[arg(long, default_value_t = 512)]
    pub shared_prefix_tokens: usize,
    /// Prompt tokens of each session's own after the shared prefix.
    #[arg(long, default_value_t = 32)]
    pub suffix_tokens: usize,
    /// Tokens each session generates.
    #[arg(long, default_value_t = 16)]
    pub gen_tokens: usize,
    /// KV element type: f32, f16 or q8_0.
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Positions per KV block.
    #[arg(long, default_value_t = airs_memory::DEFAULT_TOKENS_PER_BLOCK)]
    pub tokens_per_block: u32,
    /// KV pool budget in MiB (default: what the sessions would need without sharing).
    #[arg(long)]
    pub pool_mib: Option<usize>,
    /// Also compare decode speed, paged versus contiguous, at this context length (0: skip).
    #[arg(long, default_value_t = 0)]
    pub decode_context: usize,
    /// Decode rounds of the comparison (alternating caches); medians are reported.
    #[arg(long, default_value_t = 6)]
    pub decode_rounds: usize,
    /// Decode tokens per round of the comparison.
    #[arg(long, default_value_t = 16)]
    pub decode_round_tokens: usize,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Text the shared prefix is made of (tokenized, repeated and cut to length).
const PREFIX_TEXT: &str = "You are a careful assistant running on a small device. Answer \
briefly, cite the file you read, and never invent facts. The garden behind the old school has \
three apple trees, a pond with seven goldfish, and a bench where the caretaker reads the \
weather report every morning before unlocking the gates. ";

/// Text each session's suffix is made of, after a line naming the session.
const SUFFIX_TEXT: &str = " Please summarise what the caretaker does first, then list the \
animals in the garden, and finally suggest one improvement to the pond. ";

/// `len` tokens of `text` repeated, after `start` (also tokenized) and an optional BOS.
fn text_tokens(loaded: &LoadedModel, start: &str, text: &str, len: usize, bos: bool) -> Vec<u32> {
    let tok = &loaded.tokenizer;
    let encode = |s: &str| -> Vec<u32> {
        tok.encode(s, EncodeOptions::default())
            .into_iter()
            .map(u32::from)
            .collect()
    };
    let mut ids: Vec<u32> = if bos {
        tok.bos_id()
            .filter(|_| tok.add_bos())
            .map(u32::from)
            .into_iter()
            .collect()
    } else {
        Vec::new()
    };
    ids.extend(encode(start));
    let piece = encode(text);
    while ids.len() < len && !piece.is_empty() {
        ids.extend_from_slice(&piece);
    }
    ids.truncate(len);
    ids
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Prefill `tokens` in batches of 512 and return the last logits.
fn prefill(
    model: &Model,
    rt: &Runtime,
    kv: &mut dyn KvCache,
    tokens: &[u32],
) -> anyhow::Result<Vec<f32>> {
    let mut logits = Vec::new();
    for chunk in tokens.chunks(512) {
        logits = model.forward(rt, kv, chunk, Logits::Last)?;
    }
    Ok(logits)
}

/// `steps` decode steps, one token each, feeding `tokens` in a cycle.
fn decode(
    model: &Model,
    rt: &Runtime,
    kv: &mut dyn KvCache,
    tokens: &[u32],
    steps: usize,
) -> anyhow::Result<()> {
    for t in tokens.iter().cycle().take(steps) {
        std::hint::black_box(model.forward(rt, kv, &[*t], Logits::Last)?);
    }
    Ok(())
}

struct SessionsReport {
    prompt_tokens: usize,
    computed_tokens: usize,
    prefix_tokens_computed: usize,
    served_tokens: usize,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    no_sharing_bytes: usize,
    contiguous_bytes: usize,
    stats: KvPoolStats,
    pool: PagedKvPool,
}

fn run_sessions(
    args: &BenchKvArgs,
    loaded: &LoadedModel,
    rt: &Runtime,
) -> anyhow::Result<SessionsReport> {
    let model = &loaded.model;
    let shape = loaded.kv_shape();
    let (n, p, s, g) = (
        args.sessions,
        args.shared_prefix_tokens,
        args.suffix_tokens,
        args.gen_tokens,
    );
    let tpb = args.tokens_per_block.max(1) as usize;
    let bytes_per_token = shape.bytes_per_token(args.kv_type).with_context(|| {
        format!(
            "a {} KV cache cannot hold this model's {}-value heads",
            args.kv_type.name(),
            shape.head_dim
        )
    })?;
    let per_session = p + s + g;
    anyhow::ensure!(
        per_session >= 1 && per_session <= model.config.context_len,
        "prefix + suffix + gen tokens must be between 1 and the context length {}",
        model.config.context_len
    );
    let block_bytes = tpb * bytes_per_token;
    let no_sharing_bytes = n * per_session.div_ceil(tpb) * block_bytes;
    let pool_bytes = args
        .pool_mib
        .map_or(no_sharing_bytes + n * block_bytes, |m| m << 20);
    let pool = PagedKvPool::new(
        shape,
        args.kv_type,
        &PagedKvConfig {
            pool_bytes,
            tokens_per_block: args.tokens_per_block,
            ..PagedKvConfig::new(pool_bytes)
        },
    )?;
    for notice in pool.memory().notices() {
        eprintln!("airs: note: {notice}");
    }

    let prefix = text_tokens(loaded, "", PREFIX_TEXT, p, true);
    let (mut computed, mut prefix_computed) = (0, 0);
    let (mut prefill_s, mut decode_s) = (0.0, 0.0);
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        let mut prompt = prefix.clone();
        // The session number comes first so that suffixes diverge at once.
        let start = format!("{}. Session", i + 1);
        prompt.extend(text_tokens(loaded, &start, SUFFIX_TEXT, s, false));
        let (mut kv, cached) = PagedKv::new_sequence_with_prefix(&pool, None, &prompt);
        let kv_dyn: &mut dyn KvCache = &mut kv;
        computed += prompt.len() - cached;
        prefix_computed += prefix.len() - cached.min(prefix.len());
        let started = Instant::now();
        prefill(model, rt, kv_dyn, &prompt[cached..])
            .with_context(|| format!("session {}: prefill", i + 1))?;
        prefill_s += started.elapsed().as_secs_f64();
        let started = Instant::now();
        decode(model, rt, kv_dyn, &prompt[prefix.len()..], g)
            .with_context(|| format!("session {}: decode", i + 1))?;
        decode_s += started.elapsed().as_secs_f64();
        sessions.push(kv);
    }
    let stats = pool.memory().audit().map_err(anyhow::Error::msg)?;
    let served_tokens = sessions.iter().map(|kv| kv.len()).sum();
    Ok(SessionsReport {
        prompt_tokens: n * (prefix.len() + s),
        computed_tokens: computed,
        prefix_tokens_computed: prefix_computed,
        served_tokens,
        prefill_tokens_per_s: if prefill_s > 0.0 {
            computed as f64 / prefill_s
        } else {
            0.0
        },
        decode_tokens_per_s: if decode_s > 0.0 {
            (n * g) as f64 / decode_s
        } else {
            0.0
        },
        no_sharing_bytes,
        contiguous_bytes: n * model.config.context_len * bytes_per_token,
        stats,
        pool,
    })
}

struct DecodeComparison {
    context: usize,
    /// Tokens/s per round, by wall time.
    contiguous: Vec<f64>,
    paged: Vec<f64>,
    /// Tokens per CPU-second (all threads, user + system) per round: robust to other
    /// processes sharing the cores, but it also counts the pool's spin-waits.
    contiguous_cpu: Vec<f64>,
    paged_cpu: Vec<f64>,
}

/// CPU time this process has used (user + system), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: `usage` is a valid, writable rusage; getrusage only fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer has no other precondition.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

/// Decode tokens/s at `args.decode_context` through both caches, alternating rounds.
fn compare_decode(
    args: &BenchKvArgs,
    loaded: &LoadedModel,
    rt: &Runtime,
) -> anyhow::Result<DecodeComparison> {
    let model = &loaded.model;
    let context = args.decode_context;
    let (rounds, per_round) = (args.decode_rounds.max(1), args.decode_round_tokens.max(1));
    let total = context + rounds * per_round + 1;
    anyhow::ensure!(
        total <= model.config.context_len,
        "--decode-context plus the decode tokens exceed the context length {}",
        model.config.context_len
    );
    let prompt = text_tokens(loaded, "", PREFIX_TEXT, context, true);
    let shape = loaded.kv_shape();
    let mut contiguous = ContiguousKv::try_new(shape, total, args.kv_type)?;
    let bytes_per_token = shape.bytes_per_token(args.kv_type).unwrap_or(0);
    let tpb = args.tokens_per_block.max(1) as usize;
    let pool = PagedKvPool::new(
        shape,
        args.kv_type,
        &PagedKvConfig {
            tokens_per_block: args.tokens_per_block,
            ..PagedKvConfig::new((total.div_ceil(tpb) + 1) * tpb * bytes_per_token)
        },
    )?;
    let mut paged = PagedKv::new_sequence(&pool, None);
    prefill(model, rt, &mut contiguous, &prompt)?;
    prefill(model, rt, &mut paged, &prompt)?;
    let mut c = DecodeComparison {
        context,
        contiguous: Vec::new(),
        paged: Vec::new(),
        contiguous_cpu: Vec::new(),
        paged_cpu: Vec::new(),
    };
    let n = per_round as f64;
    for _ in 0..rounds {
        let (started, cpu) = (Instant::now(), cpu_seconds());
        decode(model, rt, &mut contiguous, &prompt, per_round)?;
        c.contiguous.push(n / started.elapsed().as_secs_f64());
        c.contiguous_cpu.push(n / (cpu_seconds() - cpu).max(1e-9));
        let (started, cpu) = (Instant::now(), cpu_seconds());
        decode(model, rt, &mut paged, &prompt, per_round)?;
        c.paged.push(n / started.elapsed().as_secs_f64());
        c.paged_cpu.push(n / (cpu_seconds() - cpu).max(1e-9));
    }
    Ok(c)
}

pub fn run(args: BenchKvArgs) -> anyhow::Result<()> {
    // The weights in this machine's model pool (the benchmark's own KV caches are not charged).
    let registry = crate::pool_args::PoolArgs::default().registry()?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let loaded = load(args.model.as_deref(), &args.load, &registry, threads)?;
    loaded.wait_resident()?;
    let rt = &loaded.runtime;
    let r = run_sessions(&args, &loaded, rt)?;
    let comparison = if args.decode_context > 0 {
        Some(compare_decode(&args, &loaded, rt)?)
    } else {
        None
    };
    let st = &r.stats;
    let allocated = st.used_bytes;
    let expected = (args.shared_prefix_tokens
        + args.sessions * (args.suffix_tokens + args.gen_tokens))
        * st.bytes_per_token;
    let saving = r.no_sharing_bytes.saturating_sub(allocated);
    let pct = |a: usize, b: usize| {
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };

    if args.json {
        let mut report = json!({
            "model": loaded.name,
            "threads": threads,
            "isa": format!("{:?}", rt.isa).to_lowercase(),
            "kv_type": args.kv_type.name(),
            "sessions": args.sessions,
            "shared_prefix_tokens": args.shared_prefix_tokens,
            "suffix_tokens": args.suffix_tokens,
            "gen_tokens": args.gen_tokens,
            "tokens_per_block": st.tokens_per_block,
            "block_bytes": st.block_bytes,
            "bytes_per_token": st.bytes_per_token,
            "pool_bytes": st.pool_bytes,
            "pinned": st.pinned,
            "prompt_tokens": r.prompt_tokens,
            "prompt_tokens_computed": r.computed_tokens,
            "prefix_tokens_computed": r.prefix_tokens_computed,
            "tokens_served": r.served_tokens,
            "kv_bytes_allocated": allocated,
            "kv_bytes_expected": expected,
            "kv_bytes_per_served_token": allocated as f64 / r.served_tokens.max(1) as f64,
            "kv_bytes_without_sharing": r.no_sharing_bytes,
            "sharing_savings_bytes": saving,
            "contiguous_full_context_bytes": r.contiguous_bytes,
            "prefill_tokens_per_s": r.prefill_tokens_per_s,
            "decode_tokens_per_s": r.decode_tokens_per_s,
            "pool": pool_json(st),
        });
        if let Some(c) = &comparison {
            report["decode_comparison"] = json!({
                "context": c.context,
                "contiguous_tokens_per_s": median(&c.contiguous),
                "paged_tokens_per_s": median(&c.paged),
                "paged_over_contiguous": median(&c.paged) / median(&c.contiguous),
                "contiguous_tokens_per_s_all": c.contiguous,
                "paged_tokens_per_s_all": c.paged,
                "contiguous_tokens_per_cpu_s": median(&c.contiguous_cpu),
                "paged_tokens_per_cpu_s": median(&c.paged_cpu),
                "paged_over_contiguous_cpu": median(&c.paged_cpu) / median(&c.contiguous_cpu),
            });
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }

    println!(
        "{}: {threads} threads ({:?}), {} KV, {} positions per block of {} bytes ({} bytes per \
         position), pool {:.1} MiB{}",
        loaded.name,
        rt.isa,
        args.kv_type.name(),
        st.tokens_per_block,
        st.block_bytes,
        st.bytes_per_token,
        mib(st.pool_bytes),
        if st.pinned { ", pinned" } else { "" }
    );
    println!(
        "  {} sessions × (shared prefix {} + suffix {} + generated {} tokens)",
        args.sessions, args.shared_prefix_tokens, args.suffix_tokens, args.gen_tokens
    );
    println!(
        "  prompt tokens computed   {:>10} of {} (prefix tokens computed {} of {})",
        r.computed_tokens,
        r.prompt_tokens,
        r.prefix_tokens_computed,
        args.sessions * args.shared_prefix_tokens
    );
    println!(
        "  KV allocated             {:>10.2} MiB in {} blocks ({} shared; expected ≈ (P + N×(S+G)) \
         × bytes/position = {:.2} MiB)",
        mib(allocated),
        st.blocks_used,
        st.shared_blocks,
        mib(expected)
    );
    println!(
        "  positions stored         {:>10} for {} positions served ({:.0} bytes per served \
         position)",
        st.tokens_stored,
        r.served_tokens,
        allocated as f64 / r.served_tokens.max(1) as f64
    );
    println!(
        "  waste                    {:>10.2} KiB ({:.2}% of allocated; partially filled last \
         blocks)",
        st.waste_bytes as f64 / 1024.0,
        pct(st.waste_bytes, allocated)
    );
    println!(
        "  without sharing          {:>10.2} MiB → sharing saves {:.2} MiB ({:.1}%)",
        mib(r.no_sharing_bytes),
        mib(saving),
        pct(saving, r.no_sharing_bytes)
    );
    println!(
        "  contiguous at full context {:>8.2} MiB ({} sessions × {} positions)",
        mib(r.contiguous_bytes),
        args.sessions,
        loaded.model.config.context_len
    );
    println!(
        "  prefill {:.1} tokens/s, decode {:.1} tokens/s",
        r.prefill_tokens_per_s, r.decode_tokens_per_s
    );
    if let Some(c) = &comparison {
        let (mc, mp) = (median(&c.contiguous), median(&c.paged));
        let (cc, cp) = (median(&c.contiguous_cpu), median(&c.paged_cpu));
        println!(
            "  decode at context {}: contiguous {:.2} tokens/s, paged {:.2} tokens/s (paged/\
             contiguous {:.3}); per CPU-second {:.2} vs {:.2} ({:.3}); medians of {} \
             alternating rounds",
            c.context,
            mc,
            mp,
            mp / mc,
            cc,
            cp,
            cp / cc,
            c.paged.len()
        );
    }
    drop(r.pool);
    Ok(())
}

fn pool_json(st: &KvPoolStats) -> Value {
    json!({
        "blocks_total": st.blocks_total,
        "blocks_used": st.blocks_used,
        "blocks_cached": st.blocks_cached,
        "blocks_free": st.blocks_free,
        "used_bytes": st.used_bytes,
        "cached_bytes": st.cached_bytes,
        "tokens_stored": st.tokens_stored,
        "cached_tokens_stored": st.cached_tokens_stored,
        "waste_bytes": st.waste_bytes,
        "shared_blocks": st.shared_blocks,
        "shared_refcounts": st.shared_refcounts.iter()
            .map(|&(refcount, blocks)| json!({"refcount": refcount, "blocks": blocks}))
            .collect::<Vec<_>>(),
        "block_refs": st.block_refs,
        "shared_savings_bytes": st.shared_savings_bytes,
        "indexed_blocks": st.indexed_blocks,
        "counters": {
            "prefix_lookups": st.counters.prefix_lookups,
            "prefix_hit_tokens": st.counters.prefix_hit_tokens,
            "prefix_copied_tokens": st.counters.prefix_copied_tokens,
            "cow_copies": st.counters.cow_copies,
            "reclaimed_blocks": st.counters.reclaimed_blocks,
        },
    })
}
