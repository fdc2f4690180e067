//! What the CLI adds to loading a model: `--loader` and `--threads`, the one-line notices of a
//! region's degradations on stderr, and the lazy load's progress bar. Loading itself is the
//! runtime's ([`LoadedModel`]): a GGUF path through the model registry of the command's model
//! pool, or the embedded default model (stories260K, MIT, see models/LICENSE-stories260K.txt)
//! when no path is given.
//!
//! While a lazy load fills the region in the background, a progress bar is drawn on stderr when
//! stderr is a terminal; it is cleared once the load completes, or when generated text starts
//! streaming to the same terminal.
//! Cost: opening starts the load (see airs-memory); notices are a lock and a clone of a short
//! list.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use airs_memory::{LoadOptions, LoaderKind, ModelRegistry};
use airs_runtime::LoadedModel;
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// `--loader`, shared by the commands that run inference.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoaderArgs {
    /// How to load the model file: eager (read it all, then run), mmap (the kernel pages it in
    /// on demand) or lazy (userfaultfd: inference starts while the file loads) [default: lazy,
    /// or mmap where userfaultfd is not permitted]
    #[arg(long, value_name = "LOADER", value_parser = loader_parser())]
    pub loader: Option<LoaderKind>,
    /// Keep the weights in the file's layout in memory (by default the eager and lazy loaders
    /// repack the matrices this CPU's kernels read faster interleaved; results are identical).
    #[arg(long)]
    pub no_repack: bool,
}

/// Parses `eager|mmap|lazy`, listing them in `--help` and in errors.
pub fn loader_parser() -> impl TypedValueParser<Value = LoaderKind> {
    PossibleValuesParser::new(["eager", "mmap", "lazy"]).map(|s| {
        s.parse::<LoaderKind>()
            .expect("the possible values are loader names")
    })
}

impl LoaderArgs {
    /// Load options with the chosen loader and the defaults for everything else.
    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            repack: !self.no_repack,
            ..LoadOptions::with_loader(self.loader.unwrap_or_default())
        }
    }
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Load `path` (or the embedded model) through `registry` with the loader `args` names and
/// `threads` threads, printing the region's notices to stderr. Errors are one line.
pub fn load(
    path: Option<&Path>,
    args: &LoaderArgs,
    registry: &ModelRegistry,
    threads: usize,
) -> anyhow::Result<LoadedModel> {
    if path.is_none()
        && let Some(l) = args.loader
    {
        eprintln!(
            "airs: note: the embedded model is compiled into the binary; --loader {l} applies \
             to model files (--model PATH)"
        );
    }
    let model =
        LoadedModel::load_or_embedded(registry, path, &args.options(), threads).map_err(|e| {
            let name = path.map_or_else(
                || airs_runtime::EMBEDDED_MODEL_NAME.to_string(),
                |p| p.display().to_string(),
            );
            let hint = match e.kind() {
                airs_runtime::RuntimeErrorKind::Engine(ee)
                    if matches!(ee.kind(), airs_engine::EngineErrorKind::ModelPool(_)) =>
                {
                    format!(" (`airs fit {name}` shows what fits in which pool)")
                }
                _ => String::new(),
            };
            anyhow::anyhow!("loading {name}: {e}{hint}")
        })?;
    Notices::default().print_new(&model);
    Ok(model)
}

/// Prints a model's notices to stderr, each once.
#[derive(Default)]
pub struct Notices {
    shown: usize,
}

impl Notices {
    pub fn print_new(&mut self, model: &LoadedModel) {
        let notices = model.notices();
        for n in notices.iter().skip(self.shown) {
            eprintln!("airs: note: {n}");
        }
        self.shown = notices.len();
    }
}

/// The background-fill progress bar on stderr (a thread polling the loader).
pub struct FillProgress {
    bar: indicatif::ProgressBar,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FillProgress {
    /// A bar for `model`'s lazy load, if it is still filling and stderr is a terminal.
    pub fn start(model: &LoadedModel) -> Option<FillProgress> {
        let region = model.region()?;
        let loader = region.loader();
        if region.loader_kind() != LoaderKind::Lazy
            || loader.is_resident()
            || !std::io::stderr().is_terminal()
        {
            return None;
        }
        let total = loader.progress().total_bytes;
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "loading {bytes:>10}/{total_bytes} [{bar:30}] {bytes_per_sec} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (bar.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("airs-progress".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    b.set_position(loader.progress().filled_bytes);
                    // Resident (true) or failed (error): either way the fill is over.
                    if loader
                        .wait_resident_timeout(Duration::from_millis(100))
                        .unwrap_or(true)
                    {
                        break;
                    }
                }
                b.finish_and_clear();
            })
            .ok()?;
        Some(FillProgress {
            bar,
            stop,
            thread: Some(thread),
        })
    }

    /// Clears the bar and stops its thread.
    pub fn finish(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for FillProgress {
    fn drop(&mut self) {
        self.finish();
    }
}
