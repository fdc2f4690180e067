//! `airs serve`: the OpenAI-compatible HTTP server (`airs_server`) over the configured models
//! (the embedded model when none is given), in the device's model pool. Ready when `/health`
//! returns 200. Logs one line per request to stderr. SIGTERM or Ctrl-C stops accepting, lets
//! running requests finish within `--grace`, cancels the rest, and exits 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use airs_engine::KvType;
use airs_runtime::fit::parse_size;
use airs_server::models::{ModelSpec, Models, ServingConfig};
use airs_server::remote::Remote;
use airs_server::{AppState, ConnectionLimits, ServerConfig};
use anyhow::Context;

use crate::model_file::{LoaderArgs, default_threads};
use crate::pool_args::PoolArgs;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A GGUF model to serve (repeatable; the first is loaded at start, others on demand;
    /// default: the embedded stories260K model). Clients name a model by its file name
    /// without `.gguf`.
    #[arg(long = "model")]
    pub models: Vec<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health and the pool page.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The session database (SQLite; default: sessions live in memory until the server stops).
    #[arg(long)]
    pub db: Option<PathBuf>,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Each model's KV pool [default: a quarter of the model pool, at most 256 MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub kv_pool: Option<u64>,
    /// KV cache element type: f16, f32, or q8_0 (34 bytes a 32-value block, about half f16's;
    /// attention as fast as over f16 where measured: BENCHMARKS.md).
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    /// Sequences running at once per model.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    #[command(flatten)]
    pub draft: crate::run::DraftArgs,
    /// Requests waiting per model; more get 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// An OpenAI-compatible endpoint for models not served here (and for everything on a
    /// device without a model pool), e.g. http://192.168.1.10:8080.
    #[arg(long)]
    pub remote: Option<String>,
    /// The remote endpoint's API key.
    #[arg(long, requires = "remote")]
    pub remote_api_key: Option<String>,
    /// A CORS origin to admit besides localhost (repeatable; `*` admits any).
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// Largest request body.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "4M")]
    pub max_body: u64,
    /// Seconds running requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 10.0)]
    pub grace: f64,
    /// Connections open at once; more wait to be accepted (the open-file limit is raised to
    /// hold them where it can be).
    #[arg(long, default_value_t = 512,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Seconds a connection may stay silent while a request head (after it opens, or between
    /// requests when kept alive) or the next piece of a request body is due, before it is
    /// closed.
    #[arg(long, default_value_t = 30.0)]
    pub read_timeout: f64,
    /// Worker threads of each model (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub load: LoaderArgs,
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let policy = args.pool.policy();
    let (budget, _) = policy.budget()?;
    let registry = if budget.model_pool_bytes > 0 {
        Some(policy.registry()?)
    } else {
        tracing::warn!(
            "a device with {} MiB of RAM has no model pool: every request goes to the remote \
             endpoint",
            budget.total_bytes >> 20
        );
        None
    };
    anyhow::ensure!(
        registry.is_some() || args.remote.is_some(),
        "this device has no model pool: give --remote URL (or --model-pool SIZE to serve \
         locally anyway)"
    );
    // A file that cannot be served is an error now, not a 503 at its first request.
    for path in &args.models {
        airs_runtime::LoadedModel::check_file(path)
            .with_context(|| format!("--model {}", path.display()))?;
    }
    let specs: Vec<ModelSpec> = if args.models.is_empty() {
        vec![ModelSpec::embedded()]
    } else {
        args.models.iter().cloned().map(ModelSpec::file).collect()
    };
    let kv_pool_bytes = args
        .kv_pool
        .unwrap_or_else(|| (budget.model_pool_bytes / 4).min(256 << 20));
    let serving = ServingConfig {
        threads: args.threads.unwrap_or_else(default_threads),
        load: args.load.options(),
        kv_pool_bytes: kv_pool_bytes as usize,
        kv_type: args.kv_type,
        parallel: args.parallel.max(1),
        queue: args.queue,
        draft: args.draft.config(),
        db: args.db.clone(),
    };
    let remote = args
        .remote
        .as_deref()
        .map(|u| Remote::new(u, args.remote_api_key.clone()))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(args.grace >= 0.0, "--grace must not be negative");
    anyhow::ensure!(
        args.read_timeout > 0.0 && args.read_timeout.is_finite(),
        "--read-timeout must be a positive number of seconds"
    );
    let config = ServerConfig {
        api_key: args.api_key.clone(),
        cors_origins: args.cors_origins.clone(),
        max_body_bytes: args.max_body as usize,
        grace: Duration::from_secs_f64(args.grace),
        connections: ConnectionLimits {
            max_connections: connections_within_file_limit(args.max_connections),
            read_timeout: Duration::from_secs_f64(args.read_timeout),
        },
    };
    let state = AppState::new(Models::new(registry, specs, serving), remote, config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("airs-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| {
                std::net::ToSocketAddrs::to_socket_addrs(&(args.host.as_str(), args.port))
                    .map_err(anyhow::Error::from)
                    .and_then(|mut a| a.next().context("the host resolves to no address"))
            })
            .with_context(|| format!("--host {}", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        tracing::info!(
            "listening on http://{local} (models: {})",
            state
                .models
                .specs()
                .iter()
                .map(|s| s.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        airs_server::serve(state, listener, shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

/// Descriptors kept for everything but connections: the model files, the session database,
/// the standard streams, the loader's userfaultfd and eventfds.
const OTHER_FILES: u64 = 64;

/// `wanted` connections, after raising the open-file limit's soft value toward its hard one
/// to hold them (as Go's runtime does at start); fewer, with a warning, if the hard limit
/// does not allow them.
fn connections_within_file_limit(wanted: usize) -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let need = wanted as u64 + OTHER_FILES;
    let mut current = limit.current.unwrap_or(u64::MAX);
    if current < need {
        let raised = limit.maximum.map_or(need, |max| max.min(need));
        let mut new = limit;
        new.current = Some(raised);
        if setrlimit(Resource::Nofile, new).is_ok() {
            current = raised;
        }
    }
    let fits = current.saturating_sub(OTHER_FILES).max(1) as usize;
    if fits < wanted {
        tracing::warn!(
            "--max-connections {wanted} needs {need} open files but the limit is {current} \
             (ulimit -n): serving at most {fits} connections"
        );
    }
    fits.min(wanted)
}
