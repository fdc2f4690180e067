//! `airs`: run, inspect and benchmark GGUF language models with managed model memory.

mod bench;
mod bench_alternate;
mod bench_batch;
mod bench_draft;
mod bench_host;
mod bench_kv;
mod bench_load;
mod bench_probe_steps;
mod bench_sessions;
mod fit;
mod gen_model;
mod inspect;
mod model_file;
mod perplexity;
mod pool_args;
mod run;
mod serve;
mod session_cmd;
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use airs_runtime::ModelBytes;

#[derive(Parser)]
#[command(
    name = "airs",
    version,
    about = "A local LLM runtime for small Linux devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF file's architecture, hyperparameters, tokenizer, tensors and layout.
    Inspect {
        /// The GGUF file (default: the embedded stories260K model).
        model: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show the token ids and pieces of a text.
    Tokenize {
        /// The GGUF file whose tokenizer to use.
        model: PathBuf,
        /// The text to tokenize.
        text: String,
        /// Do not add the BOS token even if the model wants one.
        #[arg(long)]
        no_bos: bool,
        /// Treat special-token text such as `<|im_start|>` as plain text.
        #[arg(long)]
        no_special: bool,
        #[arg(long)]
        json: bool,
    },
    /// Generate text, streaming it to stdout.
    Run(run::RunArgs),
    /// Will a model fit this device? Pool budget, model pool use and predicted peak RSS.
    Fit(fit::FitArgs),
    /// Write a synthetic GGUF model (named shape, quantization mix, seeded random weights).
    GenModel(gen_model::GenModelArgs),
    /// One turn (or a script of turns) of a persisted conversation session.
    Session(session_cmd::SessionArgs),
    /// Serve models over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Perplexity over a text, and the KL divergence from a reference engine's distributions.
    Perplexity(perplexity::PerplexityArgs),
    /// Benchmarks (reported as medians; not part of the test suite).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Prefill and decode tokens/s and the weight bandwidth decode achieves.
    Decode(bench::BenchDecodeArgs),
    /// Time to first token, time to fully resident and decode speed of each model loader.
    Load(bench_load::BenchLoadArgs),
    /// KV cache memory: sessions sharing a prompt prefix in the paged KV pool.
    Kv(bench_kv::BenchKvArgs),
    /// Sessions of mixed priorities overflowing a KV pool: evictions, rebuilds, invariants.
    Sessions(bench_sessions::BenchSessionsArgs),
    /// Continuous batching: aggregate and per-session decode tokens/s at several concurrencies.
    Batch(bench_batch::BenchBatchArgs),
    /// Speculative decoding: decode tokens/s with prompt-lookup drafts on chat tasks.
    Draft(bench_draft::BenchDraftArgs),
    /// One thread's and all threads' int8 dot rate and read bandwidth: what the threads get
    /// right now (a virtual machine's vCPUs may share a core, or a chiplet's link to memory).
    Host(bench_host::BenchHostArgs),
}

/// Die quietly on a closed pipe (`airs inspect M | head`) like other Unix tools, instead of
/// panicking on the failed write. Never for `serve`: a client that resets its connection makes
/// hyper's next vectored write (`writev`, which has no `MSG_NOSIGNAL`) raise SIGPIPE, and the
/// default disposition would kill the server and every other client's work with it.
fn restore_default_sigpipe() {
    // SAFETY: called at the start of `main`, after argument parsing (which starts no thread)
    // and before any thread exists; SIG_DFL is a valid disposition for SIGPIPE, and the
    // commands that get it write to no socket.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A model file's header for `inspect` and `tokenize` (errors name the file).
fn open_bytes(path: Option<&std::path::Path>) -> anyhow::Result<ModelBytes> {
    ModelBytes::open(path).map_err(|e| match path {
        Some(p) => anyhow::anyhow!("opening {}: {e}", p.display()),
        None => e.into(),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        restore_default_sigpipe();
    }
    let result = match cli.command {
        Command::Inspect { model, json } => {
            open_bytes(model.as_deref()).and_then(|m| inspect::run(&m, json))
        }
        Command::Tokenize {
            model,
            text,
            no_bos,
            no_special,
            json,
        } => open_bytes(Some(&model))
            .and_then(|m| tokenize::run(&m, &text, no_bos, no_special, json)),
        Command::Run(args) => run::run(args),
        Command::Fit(args) => fit::run(args),
        Command::GenModel(args) => gen_model::run(args),
        Command::Bench(BenchCommand::Decode(args)) => bench::run_decode(args),
        Command::Bench(BenchCommand::Load(args)) => bench_load::run_load(args),
        Command::Bench(BenchCommand::Kv(args)) => bench_kv::run(args),
        Command::Bench(BenchCommand::Sessions(args)) => bench_sessions::run(args),
        Command::Bench(BenchCommand::Batch(args)) => bench_batch::run(args),
        Command::Bench(BenchCommand::Draft(args)) => bench_draft::run(args),
        Command::Bench(BenchCommand::Host(args)) => bench_host::run(args),
        Command::Session(args) => session_cmd::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Perplexity(args) => perplexity::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airs: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
