//! `airs bench draft`: what speculative decoding with prompt-lookup drafts
//! ([`airs_runtime::lookup`]) buys on chat tasks that copy their context more or less: editing a
//! function (the reply is mostly the prompt's code), correcting a passage (mostly its text), and
//! an open question (little to copy: what drafts cost when they miss). Each task runs as one
//! greedy chat request on a fresh scheduler (as `airs run`) at every draft setting, the settings
//! alternated within each repetition; the decode rate is the median over repetitions, and every
//! setting's reply is checked against the reply without drafts (speculation must not change
//! a token).

use std::path::PathBuf;
use std::sync::Arc;

use airs_engine::KvType;
use airs_runtime::fit::sessions_config;
use airs_runtime::{
    Collected, DraftConfig, DraftCost, GenerationParams, LoadedModel, Prompt, Request, Scheduler,
};
use airs_tokenizer::chat::ChatMessage;
use serde_json::json;

use crate::bench::median;
use crate::model_file::{LoaderArgs, default_threads, load};

#[derive(clap::Args, Debug)]
pub struct BenchDraftArgs {
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Draft settings to compare: N drafts a sequence at most, as many as their measured cost
    /// pays for, or `N:free` for all N whenever the lookup has them (0: no speculation).
    #[arg(long, value_delimiter = ',', default_value = "0,4,8")]
    pub draft_tokens: Vec<DraftSetting>,
    /// Copies of each task served at once (each its own request and drafts), e.g. 1,2,4:
    /// a step with drafts computes at most max(16, 1 + N) rows (`DraftConfig::step_rows`).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub sessions: Vec<usize>,
    /// Most tokens a reply generates.
    #[arg(long, default_value_t = 256)]
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
    #[arg(long)]
    pub json: bool,
}

/// One `--draft-tokens` setting: `N` or `N:free`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DraftSetting(DraftConfig);

impl std::str::FromStr for DraftSetting {
    type Err = String;

    fn from_str(text: &str) -> Result<DraftSetting, String> {
        let (tokens, free) = match text.strip_suffix(":free") {
            Some(tokens) => (tokens, true),
            None => (text, false),
        };
        let tokens: usize = tokens
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: give N or N:free, N a number of draft tokens"))?;
        let config = DraftConfig::with_tokens(tokens);
        Ok(DraftSetting(if free { config.free() } else { config }))
    }
}

impl std::fmt::Display for DraftSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.max_tokens)?;
        if self.0.cost == DraftCost::Free && self.0.enabled() {
            write!(f, ":free")?;
        }
        Ok(())
    }
}

/// The tasks: a name and a user message.
const TASKS: [(&str, &str); 3] = [
    (
        "edit",
        "Rename the function `mean_of` to `average` everywhere in this module and reply with \
         the whole module, nothing else.\n```python\nimport math\n\n\ndef mean_of(values):\n    \
         if not values:\n        raise ValueError(\"no values\")\n    return sum(values) / \
         len(values)\n\n\ndef variance(values):\n    m = mean_of(values)\n    return \
         sum((v - m) ** 2 for v in values) / len(values)\n\n\ndef stddev(values):\n    return \
         math.sqrt(variance(values))\n\n\ndef zscores(values):\n    m = mean_of(values)\n    \
         s = stddev(values)\n    return [(v - m) / s for v in values]\n```",
    ),
    (
        "correct",
        "Correct the spelling mistakes in this passage and reply with the corrected passage \
         only: The small devise keeps its modle in a pool of memmory that the kernel never \
         touches. When a session is idle for a long time, its cache is evicted, and the \
         conversation is rebuilt from the history when the user comes back. Background work \
         gives way first, then system work, and an active conversation is never interupted.",
    ),
    (
        "open",
        "Explain in a short paragraph how a hash map finds a key.",
    ),
];

struct Run {
    /// All copies' decode tokens over the time from the first one's first token to the last
    /// one's last.
    decode_tokens_per_s: f64,
    tokens: Vec<u32>,
    steps: u64,
    draft_tokens: u64,
    drafts_accepted: u64,
    /// The scheduler's fitted step cost at the end, in microseconds: fixed and per row.
    step_cost_us: Option<(f64, f64)>,
}

fn run_once(
    model: &Arc<LoadedModel>,
    text: &str,
    args: &BenchDraftArgs,
    draft: DraftSetting,
    sessions: usize,
) -> anyhow::Result<Run> {
    let prompt = Prompt::Chat(vec![ChatMessage::user(text)]);
    let prompt_len = model.prompt_tokens(prompt.clone())?.len();
    let mut config = sessions_config(
        &model.shape,
        sessions,
        prompt_len + args.gen_tokens,
        args.kv_type,
    )?;
    config.draft = draft.0;
    let mut scheduler = Scheduler::new(Arc::clone(model), config, None)?;
    let params = GenerationParams {
        max_tokens: args.gen_tokens,
        ..GenerationParams::default()
    };
    let cells = (0..sessions)
        .map(|_| {
            let (sink, cell) = Collected::sink();
            scheduler.submit(Request::generate(prompt.clone(), params.clone()), sink)?;
            Ok(cell)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    scheduler.run_to_completion();
    let (mut first, mut last, mut decoded) = (f64::MAX, 0.0f64, 0);
    let mut tokens: Option<Vec<u32>> = None;
    for cell in cells {
        let mut c = std::mem::take(&mut *cell.lock().unwrap());
        if let Some(e) = c.error.take() {
            return Err(e.into());
        }
        let done = c
            .done
            .ok_or_else(|| anyhow::anyhow!("a request ended without a result"))?;
        let ttft = done.time_to_first_token.unwrap_or_default().as_secs_f64();
        first = first.min(ttft);
        last = last.max(ttft + done.decode_time.as_secs_f64());
        decoded += done.decode_tokens;
        let reply = c
            .choices
            .first()
            .map(|e| e.tokens.clone())
            .unwrap_or_default();
        // Copies of one greedy request: one reply.
        anyhow::ensure!(
            *tokens.get_or_insert_with(|| reply.clone()) == reply,
            "copies of one greedy request replied differently"
        );
    }
    let stats = scheduler.stats();
    Ok(Run {
        decode_tokens_per_s: decoded as f64 / (last - first).max(1e-9),
        tokens: tokens.unwrap_or_default(),
        steps: stats.steps,
        draft_tokens: stats.draft_tokens,
        drafts_accepted: stats.drafts_accepted,
        step_cost_us: scheduler
            .step_cost()
            .map(|c| (c.fixed_seconds * 1e6, c.row_seconds * 1e6)),
    })
}

pub fn run(args: BenchDraftArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.draft_tokens.is_empty() && args.gen_tokens >= 2,
        "give at least one --draft-tokens setting and --gen-tokens ≥ 2"
    );
    let registry = crate::pool_args::PoolArgs::default().registry()?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let model = Arc::new(load(args.model.as_deref(), &args.load, &registry, threads)?);
    model.wait_resident()?;
    let mut rows = Vec::new();
    let mut identical = true;
    let cases = TASKS
        .iter()
        .flat_map(|&(task, text)| args.sessions.iter().map(move |&n| (task, text, n)));
    for (task, text, sessions) in cases {
        // rates[s]: setting s's decode rate in every repetition.
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); args.draft_tokens.len()];
        let mut last: Vec<Option<Run>> = (0..args.draft_tokens.len()).map(|_| None).collect();
        for rep in 0..args.reps.max(1) {
            // Alternate the order, so no setting always runs first.
            let order: Vec<usize> = if rep % 2 == 0 {
                (0..args.draft_tokens.len()).collect()
            } else {
                (0..args.draft_tokens.len()).rev().collect()
            };
            for s in order {
                let r = run_once(&model, text, &args, args.draft_tokens[s], sessions)?;
                rates[s].push(r.decode_tokens_per_s);
                last[s] = Some(r);
            }
        }
        let reference = last[0].as_ref().expect("ran").tokens.clone();
        let base_rate = median(&mut rates[0].clone());
        for (s, draft) in args.draft_tokens.iter().enumerate() {
            let r = last[s].as_ref().expect("ran");
            let same = r.tokens == reference;
            identical &= same;
            let rate = median(&mut rates[s]);
            rows.push(json!({
                "task": task,
                "sessions": sessions,
                "draft_tokens": draft.0.max_tokens,
                "draft_cost": if draft.0.cost == DraftCost::Free { "free" } else { "measured" },
                "draft_setting": draft.to_string(),
                "generated_tokens": r.tokens.len(),
                "steps": r.steps,
                "drafts_computed": r.draft_tokens,
                "drafts_accepted": r.drafts_accepted,
                "decode_tokens_per_s": rate,
                "decode_tokens_per_s_all": rates[s],
                "speedup": rate / base_rate,
                "step_fixed_us": r.step_cost_us.map(|c| c.0),
                "step_row_us": r.step_cost_us.map(|c| c.1),
                "identical_to_first_setting": same,
            }));
        }
    }
    if args.json {
        let report = json!({
            "model": model.name,
            "threads": threads,
            "kv_type": args.kv_type.name(),
            "reps": args.reps,
            "gen_tokens": args.gen_tokens,
            "runs": rows,
            "identical": identical,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {threads} threads, greedy chat replies of up to {} tokens, median of {}",
            model.name, args.gen_tokens, args.reps
        );
        println!(
            "  {:<8} {:>8} {:>6} {:>7} {:>6} {:>16} {:>10} {:>8} {:>18}",
            "task",
            "sessions",
            "drafts",
            "tokens",
            "steps",
            "drafts kept",
            "decode t/s",
            "speedup",
            "step µs: fixed+row"
        );
        for r in &rows {
            println!(
                "  {:<8} {:>8} {:>6} {:>7} {:>6} {:>7}/{:<8} {:>10.1} {:>7.2}× {:>18}{}",
                r["task"].as_str().unwrap_or(""),
                r["sessions"].as_u64().unwrap_or(0),
                r["draft_setting"].as_str().unwrap_or(""),
                r["generated_tokens"].as_u64().unwrap_or(0),
                r["steps"].as_u64().unwrap_or(0),
                r["drafts_accepted"].as_u64().unwrap_or(0),
                r["drafts_computed"].as_u64().unwrap_or(0),
                r["decode_tokens_per_s"].as_f64().unwrap_or(0.0),
                r["speedup"].as_f64().unwrap_or(0.0),
                match (r["step_fixed_us"].as_f64(), r["step_row_us"].as_f64()) {
                    (Some(fixed), Some(row)) => format!("{fixed:.1}+{row:.1}"),
                    _ => "-".into(),
                },
                if r["identical_to_first_setting"] == true {
                    ""
                } else {
                    "  DIFFERENT TOKENS"
                }
            );
        }
    }
    anyhow::ensure!(identical, "a draft setting changed the reply");
    Ok(())
}
