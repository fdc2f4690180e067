//! `airs bench decode`: prefill and decode speed on a model, reported as medians over
//! repetitions (these machines are noisy), with the weight bytes each decoded token streams
//! and the memory bandwidth that implies.

use std::path::PathBuf;
use std::time::Instant;

use airs_engine::{ContiguousKv, KvType, Logits, Runtime, sampler::argmax};
use airs_tokenizer::EncodeOptions;
use serde_json::json;

use crate::model_file::{LoaderArgs, ModelFile};
use crate::run::{Loaded, default_threads};

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
    #[arg(long)]
    pub json: bool,
}

/// Text to build benchmark prompts from (tokenized, repeated and cut to length).
const PROMPT_TEXT: &str = "The little robot walked along the river and counted the stones. \
Every morning it checked the weather, wrote a short note for its friends, and planned a \
route through the forest. def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + \
fibonacci(n - 2)\n";

/// `len` prompt tokens of real text under the model's tokenizer.
pub fn prompt_tokens(loaded: &Loaded, len: usize) -> Vec<u32> {
    let tok = &loaded.tokenizer;
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

pub fn run_decode(args: BenchDecodeArgs) -> anyhow::Result<()> {
    // The weights in this machine's model pool (the benchmark's own KV caches are not charged).
    let registry = crate::pool_args::PoolArgs::default().registry()?;
    let loaded = Loaded::open(ModelFile::open_for_inference(
        args.model.as_deref(),
        &args.load,
        &registry,
    )?)?;
    // Measure the resident model, not the load.
    loaded.file.wait_resident()?;
    let model = &loaded.model;
    let threads = args.threads.unwrap_or_else(default_threads);
    let rt = Runtime::new(threads);
    let context = model.config.context_len;
    anyhow::ensure!(
        args.prompt_tokens >= 1 && args.prompt_tokens + args.gen_tokens <= context,
        "--prompt-tokens + --gen-tokens must be between 1 and the context length {context}"
    );
    let prompt = prompt_tokens(&loaded, args.prompt_tokens);
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for _ in 0..args.reps.max(1) {
        let mut kv = ContiguousKv::new(
            loaded.kv_shape(),
            args.prompt_tokens + args.gen_tokens,
            args.kv_type,
        );
        let started = Instant::now();
        let mut logits = Vec::new();
        for chunk in prompt.chunks(512) {
            logits = model.forward(&rt, &mut kv, chunk, Logits::Last)?;
        }
        prefill.push(prompt.len() as f64 / started.elapsed().as_secs_f64());
        let started = Instant::now();
        for _ in 0..args.gen_tokens {
            let next = argmax(&logits);
            logits = model.forward(&rt, &mut kv, &[next], Logits::Last)?;
        }
        decode.push(args.gen_tokens as f64 / started.elapsed().as_secs_f64());
    }
    let prefill_tps = median(&mut prefill);
    let decode_tps = median(&mut decode);
    let bytes_per_token = model.weight_bytes_per_token();
    let gbps = bytes_per_token as f64 * decode_tps / 1e9;
    if args.json {
        let report = json!({
            "model": loaded.file.name,
            "loader": loaded.file.loader_name(),
            "threads": threads,
            "isa": format!("{:?}", rt.isa).to_lowercase(),
            "kv_type": args.kv_type.name(),
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "reps": args.reps,
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "prefill_tokens_per_s_all": prefill,
            "decode_tokens_per_s_all": decode,
            "weight_bytes_per_token": bytes_per_token,
            "decode_weight_gb_per_s": gbps,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {} threads ({:?}), kv {}, loader {}",
            loaded.file.name,
            threads,
            rt.isa,
            args.kv_type.name(),
            loaded.file.loader_name()
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
    }
    Ok(())
}
