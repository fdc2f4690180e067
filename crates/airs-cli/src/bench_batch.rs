//! `airs bench batch`: what continuous batching buys. For each concurrency in `--sessions`,
//! that many requests (distinct prompts of `--prompt-tokens`, optionally starting with a common
//! `--shared-prefix`) arrive at once at one scheduler and generate `--gen-tokens` each (greedy,
//! or sampled at `--temperature` with a seed; with `--logprobs N`, each token's log-probability
//! and its N most likely alternatives; end-of-generation ignored). Reports, per concurrency, the aggregate decode tokens/s while all
//! of them decode concurrently (tokens produced between the last request's first token and the
//! first request's last token, over that interval: the steady state of that many sessions),
//! the same over the whole span (first request's first token to the last request's last token,
//! which also holds the prefill of requests that arrived behind a full step), the median
//! per-session decode tokens/s, time to first token (median and p99), the scheduler steps, and
//! whether every request's tokens equal the same request served alone. Repetitions alternate
//! the concurrencies (1, 4, 16, 1, 4, 16, …) so that a drifting machine biases none of them, and
//! medians are reported.
//!
//! The scheduler reads each weight matrix once per step for all the sequences in it, so
//! aggregate decode grows with concurrency until the step's compute, not the weight stream,
//! dominates. To say how near that bound a step runs, an int8 dot-product peak probe
//! (`airs_engine::dot_peak`, the instruction the matrix kernels use) runs on the same threads
//! before and after, and each concurrency's aggregate decode is reported as multiply-accumulates
//! per second of the model's matrix products (`Model::matmul_macs_per_token` × tokens/s) and as
//! a fraction of the faster probe. Cost: Σ concurrency × (prompt + gen) tokens of forward
//! passes per repetition, plus each distinct request once alone for the comparison, plus the
//! probe's 12 passes of `--probe-dot-ms`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airs_engine::sampler::SamplerConfig;
use airs_engine::{KvType, Sharing, probe_int8_dot_peak, probe_read_path};
use airs_memory::{LoadOptions, ModelRegistry};
use airs_runtime::{
    Event, GenerationParams, LoadedModel, Prompt, Request, Scheduler, SchedulerConfig,
};
use serde_json::json;

use crate::bench::{median, prompt_tokens};
use crate::bench_alternate::{Alternation, chunk_counts, read_ahead_kib};
use crate::model_file::{LoaderArgs, default_threads};

#[derive(clap::Args, Debug)]
pub struct BenchBatchArgs {
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Concurrencies to measure, e.g. 1,4,16.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub sessions: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Leading prompt tokens every request shares (computed once, then shared).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: usize,
    /// Tokens per scheduler step (decode rows plus prefill chunks).
    #[arg(long, default_value_t = 512)]
    pub step_tokens: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    /// Repetitions per concurrency; medians are reported.
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// Also measure an interactive request's time to first token while this many background
    /// requests are decoding, against its time to first token on an idle runtime (0: skip).
    #[arg(long, default_value_t = 8)]
    pub probe_background: usize,
    /// Milliseconds per pass of the int8 dot-product peak probe run before and after the
    /// measurements (0: no probe).
    #[arg(long, default_value_t = 20)]
    pub probe_dot_ms: u64,
    /// Sample at this temperature with the sampler's other defaults (top-k 40, top-p 0.95,
    /// min-p 0.05; each request seeded, so its run alone draws the same tokens) instead of
    /// greedy decoding: what a chat client's requests cost the scheduler between steps.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Ask for every generated token's log-probability and the N most likely alternatives, as
    /// an evaluation client does.
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Skip serving every request alone for the comparison (profiling the batched runs).
    #[arg(long)]
    pub no_compare: bool,
    /// Bracket every run with the placement probe of `airs bench host` and report, per
    /// concurrency, the medians and speedups within one placement: the threads each with a
    /// path to memory of their own, or sharing one (a virtual machine's host moves its vCPUs
    /// between the two, and one session's decode follows the memory while many sessions'
    /// follow the multipliers). About a quarter of a second a probe.
    #[arg(long)]
    pub placement: bool,
    /// Deal several tokens' matrix products in A or B row chunks a thread, switched before
    /// every step (A B B A …), and report, per concurrency, the mean time of the steps that
    /// decode two sequences or more and prefill nothing, per setting and window of 256 steps
    /// (`A,B`, e.g. `2,8`).
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 1)]
    pub alternate_chunks: Option<Vec<usize>>,
    /// Prefetch A or B KiB of the next matrix product a thread while it waits at the end of
    /// one (0: none), switched before every step (A B B A …), and report it as
    /// `--alternate-chunks` does (`A,B`, e.g. `0,512`).
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 1)]
    #[arg(conflicts_with = "alternate_chunks")]
    pub alternate_read_ahead: Option<Vec<usize>>,
    #[arg(long)]
    pub json: bool,
}

/// What one request's sink saw.
#[derive(Clone, Debug, Default)]
struct Timeline {
    /// When each token arrived.
    times: Vec<Instant>,
    tokens: Vec<u32>,
    error: Option<String>,
}

impl Timeline {
    fn first(&self) -> Option<Instant> {
        self.times.first().copied()
    }

    fn last(&self) -> Option<Instant> {
        self.times.last().copied()
    }
}

/// One concurrency's measurement.
#[derive(Clone, Debug)]
struct Run {
    /// Decode tokens/s while every request decodes (None: the window was empty).
    concurrent: Option<f64>,
    /// Decode tokens/s from the first first token to the last last token.
    aggregate: f64,
    per_session: Vec<f64>,
    ttft: Vec<Duration>,
    steps: u64,
    peak_batch: u64,
    prefill_tokens: u64,
    prefix_hit_tokens: u64,
    tokens: Vec<Vec<u32>>,
}

/// The prompt of session `i`: `shared` common tokens, then text of its own (the same text cut
/// at another place per session, so that prompts differ right after the shared part).
fn prompt_of(base: &[u32], shared: usize, len: usize, i: usize) -> Vec<u32> {
    let mut p: Vec<u32> = base[..shared.min(len)].to_vec();
    let rest = &base[shared.min(base.len())..];
    let mut k = (i * 7) % rest.len().max(1);
    while p.len() < len {
        p.push(rest[k % rest.len()]);
        k += 1;
    }
    p
}

fn measure(
    model: &Arc<LoadedModel>,
    args: &BenchBatchArgs,
    prompts: &[Vec<u32>],
    mut alternation: Option<&mut Alternation>,
) -> anyhow::Result<Run> {
    let n = prompts.len();
    let per_seq = args.prompt_tokens + args.gen_tokens + 16;
    let bytes_per_token = model
        .kv_shape()
        .bytes_per_token(args.kv_type)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "this model's heads do not fit a {} KV cache",
                args.kv_type.name()
            )
        })?;
    let mut config = SchedulerConfig::new(n * per_seq.next_multiple_of(16) * bytes_per_token);
    config.kv_type = args.kv_type;
    config.max_running = n.max(1);
    config.max_waiting = n.max(64);
    config.step_tokens = args.step_tokens.max(n + 1);
    let mut scheduler = Scheduler::new(Arc::clone(model), config, None)?;
    let params = GenerationParams {
        max_tokens: args.gen_tokens,
        ignore_eos: true,
        sampler: SamplerConfig {
            temperature: args.temperature,
            ..SamplerConfig::default()
        },
        logprobs: args.logprobs,
        ..GenerationParams::default()
    };
    let timelines: Vec<Arc<Mutex<Timeline>>> = (0..n)
        .map(|_| Arc::new(Mutex::new(Timeline::default())))
        .collect();
    let t0 = Instant::now();
    for (p, t) in prompts.iter().zip(&timelines) {
        let t = Arc::clone(t);
        scheduler.submit(
            Request::generate(Prompt::Tokens(p.clone()), params.clone()),
            Box::new(move |event| {
                let mut t = t.lock().unwrap();
                match event {
                    Event::Token(tok) => {
                        let now = Instant::now();
                        t.times.push(now);
                        t.tokens.push(tok.id);
                    }
                    Event::Failed(e) => t.error = Some(e.to_string()),
                    _ => {}
                }
                true
            }),
        )?;
    }
    while scheduler.has_work() {
        if let Some(alt) = alternation.as_deref_mut() {
            alt.begin_step();
        }
        let step = scheduler.step();
        if let Some(alt) = alternation.as_deref_mut() {
            alt.end_step(step.decode_rows >= 2 && step.prefill_rows == 0 && step.draft_rows == 0);
        }
    }
    if let Some(alt) = alternation {
        alt.end_request();
    }
    let lines: Vec<Timeline> = timelines
        .iter()
        .map(|t| t.lock().unwrap().clone())
        .collect();
    if let Some(e) = lines.iter().find_map(|l| l.error.clone()) {
        anyhow::bail!("a request failed: {e}");
    }
    let decode = |l: &Timeline| l.tokens.len().saturating_sub(1);
    let per_session: Vec<f64> = lines
        .iter()
        .map(|l| {
            let span = l
                .last()
                .zip(l.first())
                .map_or(0.0, |(b, a)| (b - a).as_secs_f64());
            decode(l) as f64 / span.max(1e-9)
        })
        .collect();
    let first = lines.iter().filter_map(|l| l.first()).min().unwrap_or(t0);
    let last = lines.iter().filter_map(|l| l.last()).max().unwrap_or(t0);
    let total: usize = lines.iter().map(decode).sum();
    // The window in which every request decodes: after the last first token, up to the first
    // last token.
    let window_start = lines.iter().filter_map(|l| l.first()).max().unwrap_or(t0);
    let window_end = lines.iter().filter_map(|l| l.last()).min().unwrap_or(t0);
    let concurrent = (window_end > window_start).then(|| {
        let in_window: usize = lines
            .iter()
            .map(|l| {
                l.times
                    .iter()
                    .filter(|&&t| t > window_start && t <= window_end)
                    .count()
            })
            .sum();
        in_window as f64 / (window_end - window_start).as_secs_f64()
    });
    let stats = scheduler.stats();
    Ok(Run {
        concurrent,
        aggregate: total as f64 / (last - first).as_secs_f64().max(1e-9),
        per_session,
        ttft: lines
            .iter()
            .map(|l| l.first().map_or(Duration::ZERO, |f| f - t0))
            .collect(),
        steps: stats.steps,
        peak_batch: stats.peak_batch,
        prefill_tokens: stats.prefill_tokens,
        prefix_hit_tokens: stats.prefix_hit_tokens,
        tokens: lines.into_iter().map(|l| l.tokens).collect(),
    })
}

/// An interactive request's time to first token (seconds) on an idle scheduler, and when it
/// arrives while `probe_background` background requests are decoding (medians of 5).
fn priority_probe(
    model: &Arc<LoadedModel>,
    args: &BenchBatchArgs,
    prompt: &[u32],
) -> anyhow::Result<(f64, f64)> {
    let n = args.probe_background;
    let bytes_per_token = model.kv_shape().bytes_per_token(args.kv_type).unwrap_or(1);
    let per_seq = (args.prompt_tokens + args.gen_tokens * 8 + 32).next_multiple_of(16);
    let mut config = SchedulerConfig::new((n + 1) * per_seq * bytes_per_token);
    config.kv_type = args.kv_type;
    config.max_running = n + 1;
    config.step_tokens = args.step_tokens.max(n + 2);
    let mut scheduler = Scheduler::new(Arc::clone(model), config, None)?;
    let first_token = |s: &mut Scheduler, p: &[u32], salt: u8| -> anyhow::Result<f64> {
        let got = Arc::new(Mutex::new(None::<Instant>));
        let g = Arc::clone(&got);
        let t0 = Instant::now();
        let id = s.submit(
            Request::generate(
                Prompt::Tokens(p.to_vec()),
                GenerationParams {
                    max_tokens: 1,
                    ..GenerationParams::default()
                },
            )
            .with_salt(Some(vec![salt])),
            Box::new(move |e| {
                if matches!(e, Event::Token(_)) {
                    g.lock().unwrap().get_or_insert(Instant::now());
                }
                true
            }),
        )?;
        s.run_until_done(id);
        let at = got
            .lock()
            .unwrap()
            .ok_or_else(|| anyhow::anyhow!("no first token"))?;
        Ok((at - t0).as_secs_f64())
    };
    let mut idle = Vec::new();
    for i in 0..5u8 {
        idle.push(first_token(&mut scheduler, prompt, i)?);
    }
    // Background requests, decoding (their prompts in first).
    let params = GenerationParams {
        max_tokens: args.gen_tokens * 8,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    for i in 0..n {
        let mut p = prompt.to_vec();
        p.rotate_left(i + 1);
        scheduler.submit(
            Request::generate(Prompt::Tokens(p), params.clone())
                .with_priority(airs_runtime::Priority::Background),
            Box::new(|_| true),
        )?;
    }
    while scheduler
        .sequences()
        .iter()
        .any(|q| q.computed < q.tokens.saturating_sub(1))
    {
        scheduler.step();
    }
    let mut busy = Vec::new();
    for i in 0..5u8 {
        busy.push(first_token(&mut scheduler, prompt, 100 + i)?);
    }
    Ok((median(&mut idle), median(&mut busy)))
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * (v.len() - 1) as f64).round() as usize;
    v[rank.min(v.len() - 1)]
}

pub fn run(args: BenchBatchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.sessions.is_empty() && args.sessions.iter().all(|&s| s >= 1),
        "--sessions takes concurrencies of at least 1, e.g. 1,4,16"
    );
    anyhow::ensure!(args.gen_tokens >= 2, "--gen-tokens must be at least 2");
    let threads = args.threads.unwrap_or_else(default_threads);
    // The benchmark's own account, without a limit: it measures batching, not the pool.
    let registry = ModelRegistry::new(u64::MAX);
    let options: LoadOptions = args.load.options();
    let model = Arc::new(
        LoadedModel::load_or_embedded(&registry, args.model.as_deref(), &options, threads)
            .map_err(|e| anyhow::anyhow!("loading the model: {e}"))?,
    );
    model.wait_resident()?;
    anyhow::ensure!(
        args.prompt_tokens + args.gen_tokens < model.context_len(),
        "--prompt-tokens + --gen-tokens exceed the context length {}",
        model.context_len()
    );
    let max_sessions = *args.sessions.iter().max().expect("not empty");
    let base = prompt_tokens(&model, args.prompt_tokens * 2 + max_sessions * 7);
    let prompts: Vec<Vec<u32>> = (0..max_sessions)
        .map(|i| prompt_of(&base, args.shared_prefix, args.prompt_tokens, i))
        .collect();
    // Every distinct request alone, for the comparison.
    let alone: Vec<Vec<u32>> = if args.no_compare {
        Vec::new()
    } else {
        prompts
            .iter()
            .map(|p| {
                measure(&model, &args, std::slice::from_ref(p), None).map(|r| r.tokens[0].clone())
            })
            .collect::<anyhow::Result<_>>()?
    };

    let dot_peak = || {
        (args.probe_dot_ms > 0).then(|| {
            let runtime = &model.runtime;
            probe_int8_dot_peak(&runtime.pool, runtime.isa, args.probe_dot_ms, 5).median_macs_per_s
        })
    };
    let peak_before = dot_peak();
    let macs_per_token = model.model.matmul_macs_per_token();
    let mut rows = Vec::new();
    let mut identical_all = true;
    let mut one_session: Option<f64> = None;
    let mut one_session_span: Option<f64> = None;
    // Repetitions alternate the concurrencies. With `--placement`, each run's read path
    // (`Sharing::bracketing` the probes before and after it).
    let read_path = || {
        let runtime = &model.runtime;
        probe_read_path(&runtime.pool, runtime.isa, 256 << 20, 3)
    };
    let counts = chunk_counts(args.alternate_chunks.as_deref())?;
    let kib = read_ahead_kib(args.alternate_read_ahead.as_deref())?;
    let mut alternations: Vec<Option<Alternation>> = args
        .sessions
        .iter()
        .map(|_| {
            let m = Arc::clone(&model);
            if let Some(values) = kib {
                let apply = move |kib: usize| m.runtime.pool.set_read_ahead_bytes(kib << 10);
                apply(values[0]);
                let setting = "KiB of the next product a thread prefetches";
                return Some(Alternation::new(setting, values, Box::new(apply)));
            }
            counts.map(|values| {
                let apply = move |chunks| {
                    m.runtime
                        .pool
                        .chunks_per_thread()
                        .set_several_tokens(chunks)
                };
                apply(values[0]);
                Alternation::new(
                    "several tokens' product: row chunks a thread",
                    values,
                    Box::new(apply),
                )
            })
        })
        .collect();
    let mut runs_of: Vec<Vec<Run>> = vec![Vec::new(); args.sessions.len()];
    let mut paths_of: Vec<Vec<Sharing>> = vec![Vec::new(); args.sessions.len()];
    for _ in 0..args.reps.max(1) {
        for (((&n, runs), paths), alt) in args
            .sessions
            .iter()
            .zip(&mut runs_of)
            .zip(&mut paths_of)
            .zip(&mut alternations)
        {
            let before = args.placement.then(read_path);
            runs.push(measure(&model, &args, &prompts[..n], alt.as_mut())?);
            if let Some(before) = before {
                paths.push(Sharing::bracketing(before, read_path()));
            }
        }
    }
    // Per placement, the one-session median the others are divided by.
    let mut one_session_in: Vec<(Sharing, f64)> = Vec::new();
    for (((&n, runs), paths), alt) in args
        .sessions
        .iter()
        .zip(&runs_of)
        .zip(&paths_of)
        .zip(&alternations)
    {
        let identical = !args.no_compare
            && runs
                .iter()
                .all(|r| r.tokens.iter().zip(&alone).all(|(a, b)| a == b));
        identical_all &= identical;
        let concurrent = runs
            .iter()
            .all(|r| r.concurrent.is_some())
            .then(|| median(&mut runs.iter().filter_map(|r| r.concurrent).collect::<Vec<_>>()));
        let aggregate = median(&mut runs.iter().map(|r| r.aggregate).collect::<Vec<_>>());
        let per_session = median(
            &mut runs
                .iter()
                .flat_map(|r| r.per_session.iter().copied())
                .collect::<Vec<_>>(),
        );
        let ttft_ms: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.ttft.iter().map(|d| d.as_secs_f64() * 1e3))
            .collect();
        if n == 1 {
            one_session = concurrent;
            one_session_span = Some(aggregate);
        }
        // Medians within each placement (`--placement`), and their ratios to one session's
        // under the same placement.
        let by_path: Vec<(Sharing, f64, usize)> = [Sharing::Own, Sharing::Shared]
            .into_iter()
            .filter_map(|path| {
                let mut rates: Vec<f64> = runs
                    .iter()
                    .zip(paths)
                    .filter(|&(_, &p)| p == path)
                    .filter_map(|(r, _)| r.concurrent)
                    .collect();
                (!rates.is_empty()).then(|| (path, median(&mut rates), rates.len()))
            })
            .collect();
        if n == 1 {
            one_session_in = by_path.iter().map(|&(p, m, _)| (p, m)).collect();
        }
        let placement = args.placement.then(|| {
            let by_path: serde_json::Map<String, serde_json::Value> = by_path
                .iter()
                .map(|&(path, rate, runs)| {
                    let one = one_session_in
                        .iter()
                        .find(|(p, _)| *p == path)
                        .map(|&(_, o)| o);
                    let row = json!({
                        "aggregate_decode_tokens_per_s": rate,
                        "runs": runs,
                        "speedup_vs_one_session": one.map(|o| rate / o),
                    });
                    (path.name().to_string(), row)
                })
                .collect();
            json!({
                "read_paths": paths.iter().map(|p| p.name()).collect::<Vec<_>>(),
                "by_read_path": by_path,
            })
        });
        rows.push(json!({
            "sessions": n,
            "aggregate_decode_tokens_per_s": concurrent,
            "speedup_vs_one_session": one_session.zip(concurrent).map(|(o, c)| c / o),
            "aggregate_span_tokens_per_s": aggregate,
            "span_speedup_vs_one_session": one_session_span.map(|o| aggregate / o),
            "per_session_decode_tokens_per_s": per_session,
            "ttft_ms_p50": percentile(&ttft_ms, 50.0),
            "ttft_ms_p99": percentile(&ttft_ms, 99.0),
            "steps": median(&mut runs.iter().map(|r| r.steps as f64).collect::<Vec<_>>()),
            "peak_batch": runs.iter().map(|r| r.peak_batch).max(),
            "prompt_tokens_computed": runs[0].prefill_tokens,
            "prefix_hit_tokens": runs[0].prefix_hit_tokens,
            // null when the comparison was skipped (`--no-compare`).
            "identical_to_alone": (!args.no_compare).then_some(identical),
            "aggregate_all": runs.iter().map(|r| r.concurrent).collect::<Vec<_>>(),
            "aggregate_span_all": runs.iter().map(|r| r.aggregate).collect::<Vec<_>>(),
            "placement": placement,
            "alternation": alt.as_ref().map(Alternation::json),
        }));
    }
    let peak_after = dot_peak();
    // Against the faster probe, so a slow minute never flatters the step.
    let peak = peak_before.zip(peak_after).map(|(b, a)| b.max(a));
    for row in &mut rows {
        let macs_per_s = row["aggregate_decode_tokens_per_s"]
            .as_f64()
            .map(|t| t * macs_per_token as f64);
        row["matmul_macs_per_s"] = json!(macs_per_s);
        row["fraction_of_dot_peak"] = json!(macs_per_s.zip(peak).map(|(m, p)| m / p));
    }
    let probe = if args.probe_background > 0 {
        Some(priority_probe(&model, &args, &prompts[0])?)
    } else {
        None
    };
    let report = json!({
        "model": model.name,
        "threads": threads,
        "isa": format!("{:?}", model.runtime.isa).to_lowercase(),
        "kv_type": args.kv_type.name(),
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "temperature": args.temperature,
        "logprobs": args.logprobs,
        "shared_prefix": args.shared_prefix,
        "step_tokens": args.step_tokens,
        "reps": args.reps,
        "matmul_macs_per_token": macs_per_token,
        "int8_dot_peak_macs_per_s": [peak_before, peak_after],
        "runs": rows,
        "identical_to_alone": (!args.no_compare).then_some(identical_all),
        "interactive_probe": probe.as_ref().map(|p| json!({
            "background_sequences": args.probe_background,
            "ttft_ms_idle": p.0 * 1e3,
            "ttft_ms_under_background": p.1 * 1e3,
            "ratio": p.1 / p.0,
        })),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {} threads, kv {}, prompts of {} tokens ({} shared), {} generated each{}",
            model.name,
            threads,
            args.kv_type.name(),
            args.prompt_tokens,
            args.shared_prefix,
            args.gen_tokens,
            if args.temperature > 0.0 {
                format!(", sampled at temperature {}", args.temperature)
            } else {
                String::new()
            }
        );
        println!(
            "{:>8} {:>14} {:>9} {:>10} {:>9} {:>13} {:>10} {:>10} {:>6} {:>10}",
            "sessions",
            "aggregate t/s",
            "speedup",
            "span t/s",
            "speedup",
            "per-session",
            "ttft p50",
            "ttft p99",
            "steps",
            "identical"
        );
        // A ratio to one session, or `-` where no one-session run was asked for.
        let ratio = |v: &serde_json::Value| match v.as_f64() {
            Some(x) if x.is_finite() => format!("{x:.2}x"),
            _ => "-".to_string(),
        };
        for r in report["runs"].as_array().expect("rows") {
            println!(
                "{:>8} {:>14.1} {:>9} {:>10.1} {:>9} {:>13.1} {:>8.1}ms {:>8.1}ms {:>6} {:>10}",
                r["sessions"],
                r["aggregate_decode_tokens_per_s"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                ratio(&r["speedup_vs_one_session"]),
                r["aggregate_span_tokens_per_s"].as_f64().unwrap_or(0.0),
                ratio(&r["span_speedup_vs_one_session"]),
                r["per_session_decode_tokens_per_s"].as_f64().unwrap_or(0.0),
                r["ttft_ms_p50"].as_f64().unwrap_or(0.0),
                r["ttft_ms_p99"].as_f64().unwrap_or(0.0),
                r["steps"],
                r["identical_to_alone"]
                    .as_bool()
                    .map_or("-".to_string(), |i| i.to_string()),
            );
        }
    }
    if args.placement && !args.json {
        println!(
            "by placement (probed before and after each run; own: each thread its own path to \
             memory, shared: one path; runs where the two probes disagree are left out):"
        );
        for r in report["runs"].as_array().expect("rows") {
            let cells: Vec<String> = ["own", "shared"]
                .iter()
                .map(|path| {
                    let p = &r["placement"]["by_read_path"][*path];
                    match p["aggregate_decode_tokens_per_s"].as_f64() {
                        Some(rate) => format!(
                            "{path} {rate:.1} t/s ({} runs, {})",
                            p["runs"],
                            p["speedup_vs_one_session"]
                                .as_f64()
                                .map_or("-".to_string(), |x| format!("{x:.2}x"))
                        ),
                        None => format!("{path} -"),
                    }
                })
                .collect();
            println!("  {:>2} sessions: {}", r["sessions"], cells.join("   "));
        }
    }
    if let (Some(before), Some(after), false) = (peak_before, peak_after, args.json) {
        let best = before.max(after);
        println!(
            "int8 dot peak {:.0} G MAC/s before, {:.0} after ({threads} threads); the products \
             of a token are {:.2} G MAC",
            before / 1e9,
            after / 1e9,
            macs_per_token as f64 / 1e9
        );
        for r in report["runs"].as_array().expect("rows") {
            if let Some(m) = r["matmul_macs_per_s"].as_f64() {
                println!(
                    "  {:>2} sessions: products at {:.0} G MAC/s, {:.0} % of the peak",
                    r["sessions"],
                    m / 1e9,
                    100.0 * m / best
                );
            }
        }
    }
    if !args.json {
        for (&n, alt) in args.sessions.iter().zip(&alternations) {
            if let Some(alt) = alt {
                alt.print(&format!("{n} sessions' steps"), true);
            }
        }
    }
    if let Some((idle, busy)) = probe.filter(|_| !args.json) {
        println!(
            "interactive request beside {} decoding background requests: first token in {:.1} ms \
             (idle: {:.1} ms, {:.2}x)",
            args.probe_background,
            busy * 1e3,
            idle * 1e3,
            busy / idle
        );
    }
    anyhow::ensure!(
        identical_all || args.no_compare,
        "a batched request differed from the same request alone"
    );
    Ok(())
}
