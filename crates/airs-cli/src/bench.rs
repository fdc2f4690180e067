//! `airs bench decode`: prefill and decode speed on a model, reported as medians over
//! repetitions (these machines are noisy), with the weight bytes each decoded token streams
//! and the memory bandwidth that implies. Each repetition is one request through the runtime's
//! scheduler (the paged KV cache the product uses, greedy, end-of-generation ignored), with a
//! fresh KV pool, so nothing is served from the prefix cache. Before and after the repetitions
//! a read-bandwidth probe (`airs_engine::bandwidth`) runs on the same threads, and decode's
//! weight bandwidth is reported as a fraction of the faster of the two.
//!
//! With `--alternate-chunks A,B`, one setting of the engine takes two values step by step
//! within the run ([`crate::bench_alternate`]), which compares them under the same placements;
//! `--alternate-kv-pages` does the same for two KV pools, on huge and on base pages.
//!
//! With `--probe-steps`, one pass of the read probe runs between every two decode steps and
//! each step is weighed against the passes around it ([`crate::bench_probe_steps`]).
//!
//! With `--placement`, every repetition is bracketed by `airs bench host`'s read probes (one
//! thread, then all: `airs_engine::cores`), and decode is reported per placement against the
//! all-threads bandwidth probed around it: a virtual machine's host moves its vCPUs between
//! one path to memory and two, and a decode at the memory's pace follows it (BENCHMARKS.md).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use airs_engine::{KvType, ReadProbe, Sharing, probe_read_bandwidth, probe_read_placement};
use airs_runtime::fit::single_sequence_config;
use airs_runtime::{
    Completion, Event, GenerationParams, LoadedModel, Prompt, Request, RequestId, Scheduler,
};
use airs_tokenizer::EncodeOptions;
use serde_json::json;

use crate::bench_alternate::{Alternation, chunk_counts, read_ahead_kib};
use crate::bench_probe_steps::{self as probe_steps, probed_request};
use crate::model_file::{LoaderArgs, default_threads, load};

#[derive(clap::Args, Debug)]
pub struct BenchDecodeArgs {
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Size of the read-bandwidth probe run before and after the repetitions (0: no probe).
    #[arg(long, default_value_t = 256)]
    pub probe_mib: usize,
    /// Bracket every repetition with the placement probe of `airs bench host` (one thread's
    /// and all threads' read bandwidth over --probe-mib) and report decode per placement,
    /// against the all-threads bandwidth probed around it: the threads each with a path to
    /// memory of their own, or sharing one. Repetitions whose two probes disagree are left out.
    #[arg(long)]
    pub placement: bool,
    /// Deal one token's matrix products in A or B row chunks a thread, switched before every
    /// decode step (A B B A …), and report each setting's step time per window of 256 steps:
    /// two settings compared under the same placements (`A,B`, e.g. `2,8`).
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 1)]
    pub alternate_chunks: Option<Vec<usize>>,
    /// Prefetch A or B KiB of the next matrix product a thread while it waits at the end of
    /// one (0: none), switched before every decode step (A B B A …), and report each setting's
    /// step time per window of 256 steps (`A,B`, e.g. `0,128`).
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 1)]
    #[arg(conflicts_with = "alternate_chunks")]
    pub alternate_read_ahead: Option<Vec<usize>>,
    /// Decode the prompt on two KV pools at once, one on transparent huge pages (A) and one on
    /// base pages (B), a step of one and then of the other (A B B A …), and report each pool's
    /// step time per window of 256 steps: the two compared under the same placements.
    #[arg(long, conflicts_with_all = ["alternate_chunks", "placement"])]
    pub alternate_kv_pages: bool,
    /// Run one pass of the read probe (--probe-mib) between every two decode steps and report
    /// each step's weight bandwidth against the passes just before and after it (median, 10th
    /// and 90th percentile over the steps); decode's tokens/s are then its steps' own time.
    #[arg(long, conflicts_with_all = ["alternate_chunks", "alternate_kv_pages", "placement"])]
    pub probe_steps: bool,
    #[arg(long)]
    pub json: bool,
}

/// One repetition's placement: the read path of the probes around it
/// ([`Sharing::bracketing`]; `Between`: they disagreed, or found neither), and the
/// all-threads read bandwidth, GB/s, their mean.
type Placed = (Sharing, f64);

/// Per placement (own, shared): the median decode tokens/s, weight GB/s, all-threads read probe
/// GB/s and fraction of it, over the repetitions under it.
fn by_placement(placed: &[Placed], decode: &[f64], bytes_per_token: usize) -> serde_json::Value {
    let mut by_path = serde_json::Map::new();
    for path in [Sharing::Own, Sharing::Shared] {
        let runs: Vec<(f64, f64)> = placed
            .iter()
            .zip(decode)
            .filter(|((p, _), _)| *p == path)
            .map(|(&(_, probe), &tps)| (tps, probe))
            .collect();
        if runs.is_empty() {
            continue;
        }
        let gbps = |tps: f64| bytes_per_token as f64 * tps / 1e9;
        let tps = median(&mut runs.iter().map(|r| r.0).collect::<Vec<_>>());
        by_path.insert(
            path.name().to_string(),
            json!({
                "decode_tokens_per_s": tps,
                "decode_weight_gb_per_s": gbps(tps),
                "read_probe_gb_per_s": median(&mut runs.iter().map(|r| r.1).collect::<Vec<_>>()),
                "decode_fraction_of_probe":
                    median(&mut runs.iter().map(|&(t, p)| gbps(t) / p).collect::<Vec<_>>()),
                "runs": runs.len(),
            }),
        );
    }
    json!({
        "read_paths": placed
            .iter()
            .map(|&(p, _)| if p == Sharing::Between { "moved" } else { p.name() })
            .collect::<Vec<_>>(),
        "by_read_path": by_path,
    })
}

/// Text to build benchmark prompts from (tokenized, repeated and cut to length).
const PROMPT_TEXT: &str = "The little robot walked along the river and counted the stones. \
Every morning it checked the weather, wrote a short note for its friends, and planned a \
route through the forest. def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + \
fibonacci(n - 2)\n";

/// `len` prompt tokens of real text under the model's tokenizer.
pub fn prompt_tokens(model: &LoadedModel, len: usize) -> Vec<u32> {
    let tok = &model.tokenizer;
    let piece: Vec<u32> = tok
        .encode(PROMPT_TEXT, EncodeOptions::default())
        .into_iter()
        .map(u32::from)
        .collect();
    let mut ids: Vec<u32> = tok
        .bos_id()
        .filter(|_| tok.add_bos())
        .map(u32::from)
        .into_iter()
        .collect();
    while ids.len() < len {
        ids.extend_from_slice(&piece);
    }
    ids.truncate(len);
    ids
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The benchmarks' request: `gen_tokens` drawn greedily after `prompt`, end-of-generation
/// ignored.
fn greedy(prompt: &[u32], gen_tokens: usize) -> Request {
    let params = GenerationParams {
        max_tokens: gen_tokens,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    Request::generate(Prompt::Tokens(prompt.to_vec()), params)
}

/// A greedy request ([`greedy`]) submitted to a fresh scheduler of its own (a KV pool of
/// exactly what the sequence needs), ready to be stepped or run to its end.
pub(crate) struct GreedyRun {
    pub(crate) scheduler: Scheduler,
    pub(crate) id: RequestId,
    done: Arc<Mutex<Option<anyhow::Result<Completion>>>>,
}

impl GreedyRun {
    /// `gen_tokens` after `prompt`; `on_token` runs at every generated token.
    pub(crate) fn submit(
        model: &Arc<LoadedModel>,
        prompt: &[u32],
        gen_tokens: usize,
        kv_type: KvType,
        mut on_token: impl FnMut() + Send + 'static,
    ) -> anyhow::Result<GreedyRun> {
        let config = single_sequence_config(&model.shape, prompt.len() + gen_tokens, kv_type)?;
        let mut scheduler = Scheduler::new(Arc::clone(model), config, None)?;
        let done: Arc<Mutex<Option<anyhow::Result<Completion>>>> = Arc::new(Mutex::new(None));
        let d = Arc::clone(&done);
        let id = scheduler.submit(
            greedy(prompt, gen_tokens),
            Box::new(move |event| {
                match event {
                    Event::Token(_) => on_token(),
                    Event::Done(c) => *d.lock().unwrap() = Some(Ok(c)),
                    Event::Failed(e) => *d.lock().unwrap() = Some(Err(e.into())),
                    _ => {}
                }
                true
            }),
        )?;
        Ok(GreedyRun {
            scheduler,
            id,
            done,
        })
    }

    /// The request's timings, once the scheduler has run it to its end.
    pub(crate) fn completion(self) -> anyhow::Result<Completion> {
        let result = self.done.lock().unwrap().take();
        result.unwrap_or_else(|| Err(anyhow::anyhow!("the request ended without a result")))
    }
}

/// Generate `gen_tokens` greedily after `prompt` as one request on a fresh scheduler
/// ([`GreedyRun`]); returns the request's timings.
pub fn greedy_request(
    model: &Arc<LoadedModel>,
    prompt: &[u32],
    gen_tokens: usize,
    kv_type: KvType,
    alternation: Option<&Arc<Mutex<Alternation>>>,
) -> anyhow::Result<Completion> {
    let alt = alternation.cloned();
    let mut run = GreedyRun::submit(model, prompt, gen_tokens, kv_type, move || {
        if let Some(alt) = &alt {
            alt.lock().unwrap().on_token();
        }
    })?;
    run.scheduler.run_until_done(run.id);
    if let Some(alt) = alternation {
        alt.lock().unwrap().end_request();
    }
    run.completion()
}

/// `--alternate-kv-pages`: per repetition, the same greedy request on two schedulers sharing the
/// model, one whose KV pool is on huge pages (A) and one on base pages (B); both prefill
/// (untimed), then their decode steps alternate A B B A …, timed by an [`Alternation`] whose
/// setting picks the scheduler that steps next. The two sequences stay within two positions of
/// each other, so both attend over the same lengths; their tokens must be the same.
fn alternate_kv_pages(
    model: &Arc<LoadedModel>,
    prompt: &[u32],
    args: &BenchDecodeArgs,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let pick = Arc::clone(&next);
    let mut alternation = Alternation::new(
        "KV pool on huge pages (1) or base pages (0)",
        [1, 0],
        Box::new(move |huge| pick.store(usize::from(huge == 0), Ordering::Relaxed)),
    );
    let mut notes = Vec::new();
    let mut identical = true;
    for _ in 0..args.reps.max(1) {
        let mut runs = Vec::new();
        for huge_pages in [true, false] {
            let mut config =
                single_sequence_config(&model.shape, prompt.len() + args.gen_tokens, args.kv_type)?;
            config.kv_huge_pages = huge_pages;
            let mut scheduler = Scheduler::new(Arc::clone(model), config, None)?;
            notes.extend(
                scheduler
                    .kv_pool()
                    .memory()
                    .notices()
                    .iter()
                    .map(|n| n.to_string()),
            );
            let tokens = Arc::new(Mutex::new(Vec::new()));
            let seen = Arc::clone(&tokens);
            scheduler.submit(
                greedy(prompt, args.gen_tokens),
                Box::new(move |event| {
                    if let Event::Token(t) = event {
                        seen.lock().unwrap().push(t.id);
                    }
                    true
                }),
            )?;
            // The prefill, untimed: up to the first token.
            while tokens.lock().unwrap().is_empty() && scheduler.has_work() {
                scheduler.step();
            }
            runs.push((scheduler, tokens));
        }
        loop {
            alternation.begin_step();
            let (scheduler, tokens) = &mut runs[next.load(Ordering::Relaxed)];
            if !scheduler.has_work() {
                break;
            }
            let before = tokens.lock().unwrap().len();
            scheduler.step();
            alternation.end_step(tokens.lock().unwrap().len() > before);
        }
        alternation.end_request();
        for (scheduler, _) in &mut runs {
            scheduler.run_to_completion();
        }
        let [a, b] = [&runs[0].1, &runs[1].1].map(|t| t.lock().unwrap().clone());
        identical &= a.len() == args.gen_tokens && a == b;
    }
    // Each repetition's pools say the same.
    notes.sort();
    notes.dedup();
    if args.json {
        let report = json!({
            "model": model.name,
            "threads": model.runtime.pool.threads(),
            "kv_type": args.kv_type.name(),
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "notes": notes,
            "identical": identical,
            "alternation": alternation.json(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{}: {} threads ({:?}), kv {} paged, loader {}, pp{} then tg{} on two pools",
        model.name,
        model.runtime.pool.threads(),
        model.runtime.isa,
        args.kv_type.name(),
        model.loader_name(),
        args.prompt_tokens,
        args.gen_tokens
    );
    for note in notes {
        println!("  note: {note}");
    }
    println!(
        "  the two pools' tokens: {}",
        if identical { "identical" } else { "DIFFERENT" }
    );
    alternation.print("decode steps", false);
    Ok(())
}

pub fn run_decode(args: BenchDecodeArgs) -> anyhow::Result<()> {
    // The weights in this machine's model pool; each repetition's KV pool and scratch too.
    let registry = crate::pool_args::PoolArgs::default().registry()?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let model = Arc::new(load(args.model.as_deref(), &args.load, &registry, threads)?);
    // Measure the resident model, not the load.
    model.wait_resident()?;
    let context = model.context_len();
    anyhow::ensure!(
        args.prompt_tokens >= 1
            && args.gen_tokens >= 2
            && args.prompt_tokens + args.gen_tokens <= context,
        "--prompt-tokens ≥ 1 and --gen-tokens ≥ 2 must add up to at most the context length \
         {context}"
    );
    anyhow::ensure!(
        !(args.placement || args.probe_steps) || args.probe_mib > 0,
        "--placement and --probe-steps probe --probe-mib MiB: give a positive size"
    );
    let chunks = chunk_counts(args.alternate_chunks.as_deref())?.map(|[a, b]| {
        let m = Arc::clone(&model);
        let apply = move |chunks| m.runtime.pool.chunks_per_thread().set_one_token(chunks);
        apply(a);
        Alternation::new(
            "one token's product: row chunks a thread",
            [a, b],
            Box::new(apply),
        )
    });
    let read_ahead = read_ahead_kib(args.alternate_read_ahead.as_deref())?.map(|[a, b]| {
        let m = Arc::clone(&model);
        let apply = move |kib: usize| m.runtime.pool.set_read_ahead_bytes(kib << 10);
        apply(a);
        Alternation::new(
            "KiB of the next product a thread prefetches",
            [a, b],
            Box::new(apply),
        )
    });
    let alternation = chunks
        .or(read_ahead)
        .map(|alternation| Arc::new(Mutex::new(alternation)));
    let prompt = prompt_tokens(&model, args.prompt_tokens);
    if args.alternate_kv_pages {
        return alternate_kv_pages(&model, &prompt, &args);
    }
    let probe = |runtime: &airs_engine::Runtime| {
        (args.probe_mib > 0).then(|| {
            probe_read_bandwidth(&runtime.pool, runtime.isa, args.probe_mib << 20, 5)
                .median_bytes_per_s
                / 1e9
        })
    };
    let probe_before = probe(&model.runtime);
    let probe_placement = || {
        let runtime = &model.runtime;
        probe_read_placement(&runtime.pool, runtime.isa, args.probe_mib << 20, 3)
    };
    let step_probe = args
        .probe_steps
        .then(|| ReadProbe::new(&model.runtime.pool, model.runtime.isa, args.probe_mib << 20));
    let mut probed_steps = Vec::new();
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let mut placed: Vec<Placed> = Vec::new();
    for _ in 0..args.reps.max(1) {
        let before = args.placement.then(probe_placement);
        let done = if let Some(probe) = &step_probe {
            let run = probed_request(&model, &prompt, args.gen_tokens, args.kv_type, probe)?;
            decode.push(probe_steps::decode_tokens_per_s(&run.steps));
            probed_steps.extend(run.steps);
            run.completion
        } else {
            let done = greedy_request(
                &model,
                &prompt,
                args.gen_tokens,
                args.kv_type,
                alternation.as_ref(),
            )?;
            decode.push(done.decode_tokens as f64 / done.decode_time.as_secs_f64().max(1e-9));
            done
        };
        let ttft = done.time_to_first_token.unwrap_or_default();
        prefill.push(prompt.len() as f64 / ttft.as_secs_f64().max(1e-9));
        if let Some(before) = before {
            let after = probe_placement();
            let path = Sharing::bracketing(before.read_path(), after.read_path());
            let probe = (before.all_bytes_per_s + after.all_bytes_per_s) / 2.0 / 1e9;
            placed.push((path, probe));
        }
    }
    let bytes_per_token = model.model.weight_bytes_per_token();
    let placement = args
        .placement
        .then(|| by_placement(&placed, &decode, bytes_per_token));
    let stepwise = args
        .probe_steps
        .then(|| probe_steps::summary(&probed_steps, bytes_per_token, args.probe_mib));
    let prefill_tps = median(&mut prefill);
    let decode_tps = median(&mut decode);
    let probe_after = probe(&model.runtime);
    // Against the faster probe, so a slow minute never flatters decode.
    let probe_gbps = probe_before.zip(probe_after).map(|(b, a)| b.max(a));
    let gbps = bytes_per_token as f64 * decode_tps / 1e9;
    let isa = model.runtime.isa;
    if args.json {
        let report = json!({
            "model": model.name,
            "loader": model.loader_name(),
            "threads": threads,
            "isa": format!("{isa:?}").to_lowercase(),
            "kv_type": args.kv_type.name(),
            "kv_cache": "paged",
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "reps": args.reps,
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "prefill_tokens_per_s_all": prefill,
            "decode_tokens_per_s_all": decode,
            "weight_bytes_per_token": bytes_per_token,
            "decode_weight_gb_per_s": gbps,
            "read_probe_gb_per_s": [probe_before, probe_after],
            "decode_fraction_of_probe": probe_gbps.map(|p| gbps / p),
            "placement": placement,
            "probe_steps": stepwise,
            "alternation": alternation.as_ref().map(|a| a.lock().unwrap().json()),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {} threads ({:?}), kv {} paged, loader {}",
            model.name,
            threads,
            isa,
            args.kv_type.name(),
            model.loader_name()
        );
        println!(
            "  prefill pp{:<5} {:>8.1} tokens/s (median of {})",
            args.prompt_tokens,
            prefill_tps,
            prefill.len()
        );
        println!(
            "  decode  tg{:<5} {:>8.1} tokens/s (median of {})",
            args.gen_tokens,
            decode_tps,
            decode.len()
        );
        println!(
            "  weights streamed per token {:.1} MB → {:.1} GB/s",
            bytes_per_token as f64 / 1e6,
            gbps
        );
        if let (Some(before), Some(after), Some(best)) = (probe_before, probe_after, probe_gbps) {
            println!(
                "  read probe {before:.1} GB/s before, {after:.1} after ({} MiB, {threads} threads) \
                 → decode at {:.0}% of it",
                args.probe_mib,
                100.0 * gbps / best
            );
        }
        if let Some(s) = &stepwise {
            let f = |key: &str| 100.0 * s[key].as_f64().unwrap_or(f64::NAN);
            println!(
                "  between steps: read probe {:.1} GB/s (median of the passes, {} MiB) → decode at \
                 {:.0}% of the passes around each step (median of {} steps; 10th-90th percentile \
                 {:.0}-{:.0}%)",
                s["read_probe_gb_per_s_median"].as_f64().unwrap_or(f64::NAN),
                args.probe_mib,
                f("decode_fraction_median"),
                s["steps"],
                f("decode_fraction_p10"),
                f("decode_fraction_p90"),
            );
        }
        if let Some(p) = &placement {
            let paths: Vec<&str> = p["read_paths"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            println!(
                "  by placement (read paths around each repetition: {}; own: each thread its own \
                 path to memory, shared: one):",
                paths.join(", ")
            );
            for (path, r) in p["by_read_path"].as_object().into_iter().flatten() {
                let f = |key: &str| r[key].as_f64().unwrap_or(f64::NAN);
                println!(
                    "    {path:<6} decode {:.1} tokens/s, {:.1} GB/s: {:.0}% of the {:.1} GB/s all \
                     threads read around it ({} runs)",
                    f("decode_tokens_per_s"),
                    f("decode_weight_gb_per_s"),
                    100.0 * f("decode_fraction_of_probe"),
                    f("read_probe_gb_per_s"),
                    r["runs"]
                );
            }
        }
        if let Some(alt) = &alternation {
            alt.lock().unwrap().print("decode steps", true);
        }
    }
    Ok(())
}
