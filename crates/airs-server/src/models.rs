//! The models a server serves: the configured model files (or the embedded model), each loaded
//! on demand into the one model pool through the registry, with its scheduler running on an
//! engine thread ([`airs_runtime::service::Service`]).
//!
//! Loading: the first configured model is loaded at start (the server reports 503 on
//! `/health` until it is ready); another is loaded when a request names it. When the model pool
//! cannot hold it, models that serve nothing right now are unloaded, least recently used first,
//! and the load is retried; when that is not enough, the request gets 503 naming what holds the
//! pool. Each model gets its own KV pool (`--kv-pool`), charged to the same model pool, and its
//! own connection to the session database.
//!
//! A model whose engine thread stopped on a panic ([`Service::failure`]: an engine bug) is
//! dropped and loaded again at its next request, so one bug costs the requests it was running
//! (they get 503 `engine_failed` with the panic's message), not the server; the failures are
//! counted (`airs_engine_failures_total`) and logged.
//!
//! Cost: a load is the runtime's (the weights read lazily by default); lookups are a lock and a
//! scan of the few configured models.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airs_engine::{EngineErrorKind, KvType};
use airs_memory::{LoadOptions, ModelRegistry};
use airs_runtime::service::Service;
use airs_runtime::{
    DraftConfig, Durability, HistoryStore, LoadedModel, RuntimeError, RuntimeErrorKind, Scheduler,
    SchedulerConfig,
};

use crate::error::ApiError;

/// A model the server may serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The id clients name it by (the file name without `.gguf`, or `stories260K`).
    pub id: String,
    /// The GGUF file; `None` for the embedded model.
    pub path: Option<PathBuf>,
}

impl ModelSpec {
    /// The spec of a model file, its id from the file name.
    pub fn file(path: PathBuf) -> ModelSpec {
        let id = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let id = id.strip_suffix(".gguf").map_or(id.clone(), str::to_owned);
        ModelSpec {
            id,
            path: Some(path),
        }
    }

    /// The embedded model.
    pub fn embedded() -> ModelSpec {
        ModelSpec {
            id: "stories260K".into(),
            path: None,
        }
    }

    /// Whether a request's `model` field names this model (its id, or its file name).
    pub fn answers_to(&self, name: &str) -> bool {
        name == self.id
            || self.path.as_ref().is_some_and(|p| {
                p.file_name().is_some_and(|f| f.to_string_lossy() == name)
                    || p.to_string_lossy() == name
            })
    }
}

/// How every model's scheduler is set up.
#[derive(Clone, Debug)]
pub struct ServingConfig {
    pub threads: usize,
    pub load: LoadOptions,
    /// Each model's KV pool.
    pub kv_pool_bytes: usize,
    pub kv_type: KvType,
    /// Sequences running at once per model.
    pub parallel: usize,
    /// Requests waiting per model; more get 429.
    pub queue: usize,
    /// Speculative decoding with prompt-lookup drafts.
    pub draft: DraftConfig,
    /// The session database (`None`: sessions live in memory until the server stops).
    pub db: Option<PathBuf>,
}

/// A model being served.
pub struct Served {
    pub spec: ModelSpec,
    pub model: Arc<LoadedModel>,
    pub service: Service,
    /// Unix time it was loaded (`created` in `/v1/models`).
    pub created: u64,
    last_used: AtomicU64,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served").field("id", &self.spec.id).finish()
    }
}

impl Served {
    fn touch(&self) {
        self.last_used.store(unix_ms(), Ordering::Relaxed);
    }

    /// Whether it serves nothing right now (may be unloaded to make room).
    fn idle(self: &Arc<Self>) -> bool {
        // The list holds one reference; a handler in flight holds another. A stopped engine's
        // last status may still count the requests it was running.
        let s = self.service.status();
        Arc::strong_count(self) == 1
            && (self.service.failure().is_some() || s.running == 0 && s.waiting == 0)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The server's models (see the module documentation).
pub struct Models {
    /// `None` on a device without a model pool: every request goes to the remote endpoint.
    registry: Option<Arc<ModelRegistry>>,
    specs: Vec<ModelSpec>,
    config: ServingConfig,
    loaded: Mutex<Vec<Arc<Served>>>,
    /// Serializes loads (one at a time: they compete for the same pool).
    load_lock: tokio::sync::Mutex<()>,
    starting: AtomicBool,
    /// Engines found stopped by a panic (each model then loaded again).
    engine_failures: AtomicU64,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Models")
            .field("specs", &self.specs)
            .finish()
    }
}

/// Where a request's model is served.
pub enum Route {
    Local(Arc<Served>),
    Remote,
}

impl Models {
    pub fn new(
        registry: Option<Arc<ModelRegistry>>,
        specs: Vec<ModelSpec>,
        config: ServingConfig,
    ) -> Models {
        Models {
            registry,
            specs,
            config,
            loaded: Mutex::new(Vec::new()),
            load_lock: tokio::sync::Mutex::new(()),
            starting: AtomicBool::new(true),
            engine_failures: AtomicU64::new(0),
        }
    }

    pub fn specs(&self) -> &[ModelSpec] {
        &self.specs
    }

    pub fn registry(&self) -> Option<&Arc<ModelRegistry>> {
        self.registry.as_ref()
    }

    /// Whether models are served here (a model pool exists).
    pub fn local(&self) -> bool {
        self.registry.is_some()
    }

    /// Whether the first model is still being loaded at start.
    pub fn starting(&self) -> bool {
        self.starting.load(Ordering::Acquire)
    }

    /// The models loaded now.
    pub fn loaded(&self) -> Vec<Arc<Served>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Served>>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The spec a request's `model` names: the first model when it names none.
    pub fn spec_for(&self, name: Option<&str>) -> Option<&ModelSpec> {
        match name.filter(|n| !n.is_empty()) {
            None => self.specs.first(),
            Some(n) => self.specs.iter().find(|s| s.answers_to(n)),
        }
    }

    /// Where `name` is served: loaded here (loading it if needed), or the remote endpoint
    /// (`has_remote`); 404 when neither serves it.
    pub async fn route(&self, name: Option<&str>, has_remote: bool) -> Result<Route, ApiError> {
        if !self.local() {
            return if has_remote {
                Ok(Route::Remote)
            } else {
                Err(ApiError::unavailable(
                    "this device has no model pool and no remote endpoint is configured",
                ))
            };
        }
        let Some(spec) = self.spec_for(name).cloned() else {
            if has_remote {
                return Ok(Route::Remote);
            }
            let known: Vec<String> = self.specs.iter().map(|s| s.id.clone()).collect();
            return Err(ApiError::unknown_model(name.unwrap_or(""), &known));
        };
        Ok(Route::Local(self.get(&spec).await?))
    }

    /// Engines found stopped by a panic since the server started.
    pub fn engine_failures(&self) -> u64 {
        self.engine_failures.load(Ordering::Relaxed)
    }

    /// `spec` served, loaded first if it is not (or if its engine stopped on a panic).
    pub async fn get(&self, spec: &ModelSpec) -> Result<Arc<Served>, ApiError> {
        if let Some(s) = self.find(&spec.id) {
            s.touch();
            return Ok(s);
        }
        let _guard = self.load_lock.lock().await;
        if let Some(s) = self.find(&spec.id) {
            return Ok(s);
        }
        if let Some(failed) = self.take_failed(&spec.id) {
            tracing::error!(
                model = %spec.id,
                error = failed.service.failure().unwrap_or(""),
                "the engine stopped on a panic; loading the model again"
            );
            self.engine_failures.fetch_add(1, Ordering::Relaxed);
            // Its thread has ended; joining it and dropping the weights' reference is quick,
            // but not for an async worker.
            tokio::task::spawn_blocking(move || drop(failed))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
        loop {
            let registry = self.registry.clone().expect("checked: a local model pool");
            let (spec2, config) = (spec.clone(), self.config.clone());
            let attempt = tokio::task::spawn_blocking(move || load(&registry, &spec2, &config))
                .await
                .map_err(|e| ApiError::internal(format!("loading {}: {e}", spec.id)))?;
            match attempt {
                Ok(served) => {
                    let served = Arc::new(served);
                    self.lock().push(Arc::clone(&served));
                    return Ok(served);
                }
                Err(Failure::NoRoom(message)) => {
                    // Unload the least recently used model that serves nothing, and retry.
                    let victim = {
                        let mut loaded = self.lock();
                        let idle = loaded
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.idle())
                            .min_by_key(|(_, s)| s.last_used.load(Ordering::Relaxed))
                            .map(|(i, _)| i);
                        idle.map(|i| loaded.remove(i))
                    };
                    let Some(victim) = victim else {
                        return Err(ApiError::unavailable(format!(
                            "cannot load {}: {message}",
                            spec.id
                        ))
                        .with_code("insufficient_memory"));
                    };
                    tracing::info!(model = %victim.spec.id, "unloading to make room for {}", spec.id);
                    tokio::task::spawn_blocking(move || {
                        victim.service.shutdown(Duration::ZERO);
                        drop(victim);
                    })
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                }
                Err(Failure::Other(e)) => return Err(e),
            }
        }
    }

    /// The model `id` served by a running engine.
    fn find(&self, id: &str) -> Option<Arc<Served>> {
        self.lock()
            .iter()
            .find(|s| s.spec.id == id && s.service.failure().is_none())
            .cloned()
    }

    /// The model `id` if its engine stopped on a panic, taken out of the list.
    fn take_failed(&self, id: &str) -> Option<Arc<Served>> {
        let mut loaded = self.lock();
        let i = loaded
            .iter()
            .position(|s| s.spec.id == id && s.service.failure().is_some())?;
        Some(loaded.remove(i))
    }

    /// Load the first model (at start).
    pub async fn start(&self) -> Result<(), ApiError> {
        let result = match self.specs.first() {
            Some(spec) if self.local() => self.get(&spec.clone()).await.map(|_| ()),
            _ => Ok(()),
        };
        self.starting.store(false, Ordering::Release);
        result
    }

    /// Stop every model: running requests get `grace` to finish, then are cancelled.
    pub fn shutdown(&self, grace: Duration) -> (u64, u64) {
        let loaded: Vec<Arc<Served>> = std::mem::take(&mut *self.lock());
        let (mut finished, mut cancelled) = (0, 0);
        for s in loaded {
            let r = s.service.shutdown(grace);
            finished += r.finished;
            cancelled += r.cancelled;
        }
        (finished, cancelled)
    }
}

enum Failure {
    /// The model pool cannot hold the model now (the message names what holds it).
    NoRoom(String),
    Other(ApiError),
}

fn no_room(e: &RuntimeError) -> bool {
    match e.kind() {
        RuntimeErrorKind::PoolFull(_) => true,
        RuntimeErrorKind::Engine(ee) => matches!(
            ee.kind(),
            EngineErrorKind::ModelPool(_) | EngineErrorKind::KvPool(_)
        ),
        _ => false,
    }
}

/// Load `spec`'s model, its scheduler and engine thread.
fn load(registry: &ModelRegistry, spec: &ModelSpec, c: &ServingConfig) -> Result<Served, Failure> {
    let fail = |e: RuntimeError| {
        if no_room(&e) {
            Failure::NoRoom(e.to_string())
        } else {
            Failure::Other(ApiError::unavailable(format!("loading {}: {e}", spec.id)))
        }
    };
    let model = LoadedModel::load_or_embedded(registry, spec.path.as_deref(), &c.load, c.threads)
        .map_err(fail)?;
    for n in model.notices() {
        tracing::warn!(model = %spec.id, "{n}");
    }
    let store = match &c.db {
        Some(path) => HistoryStore::open(path, Durability::Full),
        None => HistoryStore::open_in_memory(),
    }
    .map_err(|e| Failure::Other(ApiError::internal(format!("session database: {e}"))))?;
    let mut config = SchedulerConfig::new(c.kv_pool_bytes);
    config.kv_type = c.kv_type;
    config.max_running = c.parallel.max(1);
    config.max_waiting = c.queue;
    config.draft = c.draft;
    config.step_tokens = config.step_tokens.max(config.max_running + 1);
    let model = Arc::new(model);
    let scheduler = Scheduler::new(Arc::clone(&model), config, Some(store)).map_err(fail)?;
    tracing::info!(
        model = %spec.id,
        loader = model.loader_name(),
        kv_pool_bytes = c.kv_pool_bytes,
        "model loaded"
    );
    Ok(Served {
        spec: spec.clone(),
        model,
        service: Service::start(scheduler),
        created: unix_ms() / 1000,
        last_used: AtomicU64::new(unix_ms()),
    })
}
