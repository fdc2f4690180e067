//! Opening the model a command names: a GGUF path, or the embedded default model
//! (stories260K, MIT-licensed, see models/LICENSE-stories260K.txt) when none is given.
//!
//! Commands that only read the header (`inspect`, `tokenize`) map the file ([`ModelFile::open`]).
//! Commands that run inference (`run`, `bench decode`) load it into a model region through the
//! model registry of their model pool ([`ModelFile::open_for_inference`], design §6.2/§6.4 of
//! `shared/design/model-memory.md`), which charges the weights to the pool's account first, with
//! the loader `--loader` names: `lazy` by default, which runs as `mmap` where userfaultfd is not
//! permitted; every such degradation is printed to stderr as one `airs: note:` line.
//! The embedded model is compiled into the binary, so there is no file to load: it stays a
//! static image (already in memory, read-only) and reports its loader as `embedded`; its bytes
//! are still charged to the model pool. `--loader` applies to model files only.
//! Cost: opening maps the file or starts the load (see airs-memory); notices are a lock and a
//! clone of a short list.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airs_engine::image::open_model_in;
use airs_engine::{MappedFile, ModelImage, StaticImage};
use airs_memory::{
    LoadOptions, LoaderKind, ModelRegion, ModelRegistry, Notice, PoolCharge, PoolUse,
};
use anyhow::Context;
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// The embedded default model.
pub static DEFAULT_MODEL: &[u8] = include_bytes!("../../../models/stories260K.gguf");
pub const DEFAULT_MODEL_NAME: &str = "stories260K.gguf (embedded)";

/// `--loader`, shared by the commands that run inference.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoaderArgs {
    /// How to load the model file: eager (read it all, then run), mmap (the kernel pages it in
    /// on demand) or lazy (userfaultfd: inference starts while the file loads) [default: lazy,
    /// or mmap where userfaultfd is not permitted]
    #[arg(long, value_name = "LOADER", value_parser = loader_parser())]
    pub loader: Option<LoaderKind>,
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
        LoadOptions::with_loader(self.loader.unwrap_or_default())
    }
}

/// A model image and the name to report it by.
pub struct ModelFile {
    pub image: Arc<dyn ModelImage>,
    pub name: String,
    pub path: Option<PathBuf>,
    /// The model region, when the file was loaded into one.
    pub region: Option<Arc<ModelRegion>>,
    /// When opening started (for times "from open").
    pub opened_at: Instant,
    /// When the region load started (after the header was parsed).
    pub load_started: Option<Instant>,
    /// Notices already printed to stderr.
    notices_shown: Cell<usize>,
    /// The embedded model's charge to the model pool (a region loaded through the registry
    /// carries its own, held by `image`'s session on it).
    _weights: Option<PoolCharge>,
}

impl ModelFile {
    /// Map `path`, or use the embedded default when `path` is `None`.
    pub fn open(path: Option<&Path>) -> anyhow::Result<ModelFile> {
        let opened_at = Instant::now();
        match path {
            None => Ok(ModelFile::embedded(opened_at)),
            Some(p) => {
                let map =
                    MappedFile::open(p).with_context(|| format!("opening {}", p.display()))?;
                Ok(ModelFile {
                    image: Arc::new(map),
                    name: p.display().to_string(),
                    path: Some(p.to_path_buf()),
                    region: None,
                    opened_at,
                    load_started: None,
                    notices_shown: Cell::new(0),
                    _weights: None,
                })
            }
        }
    }

    /// Load `path` into a model region through `registry` (charged to its model pool) with the
    /// loader `args` names (printing the region's notices to stderr), or use the embedded
    /// default when `path` is `None` (its bytes charged to the same pool).
    pub fn open_for_inference(
        path: Option<&Path>,
        args: &LoaderArgs,
        registry: &ModelRegistry,
    ) -> anyhow::Result<ModelFile> {
        let opened_at = Instant::now();
        let Some(p) = path else {
            if let Some(l) = args.loader {
                eprintln!(
                    "airs: note: the embedded model is compiled into the binary; --loader {l} \
                     applies to model files (--model PATH)"
                );
            }
            let charge = registry.pool().charge(
                PoolUse::Weights,
                DEFAULT_MODEL.len() as u64,
                DEFAULT_MODEL_NAME,
            )?;
            let mut file = ModelFile::embedded(opened_at);
            file._weights = Some(charge);
            return Ok(file);
        };
        // The engine error's message already includes its cause: one line, no repeated chain.
        let opened = open_model_in(registry, p, &args.options()).map_err(|e| {
            let hint = match e.kind() {
                airs_engine::EngineErrorKind::ModelPool(_) => format!(
                    " (`airs fit {}` shows what fits in which pool)",
                    p.display()
                ),
                _ => String::new(),
            };
            anyhow::anyhow!("loading {}: {e}{hint}", p.display())
        })?;
        let file = ModelFile {
            image: opened.dyn_image(),
            name: p.display().to_string(),
            path: Some(p.to_path_buf()),
            region: Some(opened.region().clone()),
            opened_at,
            load_started: Some(opened.load_started),
            notices_shown: Cell::new(0),
            _weights: None,
        };
        file.print_new_notices();
        Ok(file)
    }

    fn embedded(opened_at: Instant) -> ModelFile {
        ModelFile {
            image: Arc::new(StaticImage(DEFAULT_MODEL)),
            name: DEFAULT_MODEL_NAME.into(),
            path: None,
            region: None,
            opened_at,
            load_started: None,
            notices_shown: Cell::new(0),
            _weights: None,
        }
    }

    pub fn parse(&self) -> anyhow::Result<airs_gguf::Gguf<'_>> {
        airs_gguf::Gguf::parse(self.image.bytes()).with_context(|| format!("reading {}", self.name))
    }

    /// The loader in use after any fallback: `eager`, `mmap`, `lazy`, `embedded`, or `map`
    /// (a plain read-only map, for header-only commands).
    pub fn loader_name(&self) -> &'static str {
        match (&self.region, &self.path) {
            (Some(r), _) => r.loader_kind().as_str(),
            (None, None) => "embedded",
            (None, Some(_)) => "map",
        }
    }

    /// Every notice of the region so far (degradations, some arriving when a lazy load ends).
    pub fn notices(&self) -> Vec<Notice> {
        self.region
            .as_ref()
            .map(|r| r.notices())
            .unwrap_or_default()
    }

    /// Prints the notices not printed yet to stderr, one line each.
    pub fn print_new_notices(&self) {
        let notices = self.notices();
        for n in notices.iter().skip(self.notices_shown.get()) {
            eprintln!("airs: note: {n}");
        }
        self.notices_shown.set(notices.len());
    }

    /// Blocks until the region is fully loaded and finalized (at once without a region).
    pub fn wait_resident(&self) -> anyhow::Result<()> {
        if let Some(r) = &self.region {
            r.loader()
                .wait_resident()
                .with_context(|| format!("loading {}", self.name))?;
        }
        Ok(())
    }

    /// Time from opening until every byte was resident and the region finalized; `None` for
    /// mmap (the kernel pages the file in on demand: not tracked), the embedded model, or a
    /// load still running.
    pub fn fully_resident_after_open(&self) -> Option<Duration> {
        let region = self.region.as_ref()?;
        if region.loader_kind() == LoaderKind::Mmap {
            return None;
        }
        let after_load_start = region.loader().fully_resident_after()?;
        let load_started = self.load_started?;
        Some(load_started.duration_since(self.opened_at) + after_load_start)
    }
}
