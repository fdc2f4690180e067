//! `airs gen-model`: write a synthetic GGUF model of a named shape and quantization mix with
//! seeded random weights and a real vocabulary (see the airs-synth crate).

use std::path::PathBuf;
use std::time::Instant;

use airs_synth::{QuantMix, Recipe, Shape, Vocabulary, default_vocab_dir};
use anyhow::Context;

#[derive(clap::Args)]
pub struct GenModelArgs {
    /// Model shape: tiny, qwen2-tiny, qwen3-tiny, llama3-tiny, phi3-tiny or tinyllama-1.1b.
    #[arg(long)]
    shape: String,
    /// Quantization mix: f32, f16, q8_0, q4_k_m, q5_k_m, q4_1 or q5_1 (llama.cpp's mixes of
    /// those names).
    #[arg(long, default_value = "q4_k_m")]
    quant: String,
    /// Seed of the random weights; the same seed, shape and mix give the same bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: all available cores). Does not change the output.
    #[arg(long)]
    threads: Option<usize>,
    /// Directory of llama.cpp's ggml-vocab-*.gguf files (default: the repository's
    /// testdata/tokenizer).
    #[arg(long)]
    vocab_dir: Option<PathBuf>,
    /// The GGUF file to write (replaced only once it is complete).
    #[arg(short = 'o', long)]
    output: PathBuf,
}

pub fn run(args: GenModelArgs) -> anyhow::Result<()> {
    let shape: Shape = args.shape.parse()?;
    let quant: QuantMix = args.quant.parse()?;
    let threads = match args.threads {
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let recipe = Recipe::new(shape, quant, args.seed);
    let vocab_dir = args.vocab_dir.unwrap_or_else(default_vocab_dir);
    let vocab = Vocabulary::for_shape(shape, &vocab_dir)?;
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating directory {}", dir.display()))?;
    }

    let start = Instant::now();
    let written = recipe.write_file(&args.output, &vocab, threads)?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "wrote {}: {} bytes ({:.1} MiB)",
        written.path.display(),
        written.bytes,
        written.bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "{shape} {quant} seed {}: {} tensors, {:.3} B parameters, {} tokens; {seconds:.1} s on {threads} threads",
        args.seed,
        written.tensors,
        written.parameters as f64 / 1e9,
        vocab.token_count(),
    );
    Ok(())
}
