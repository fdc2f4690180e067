//! Model images: the bytes of a GGUF file as the engine sees them, wherever they live — a
//! memory-mapped file, an owned buffer, or a model region filled by a loader. The forward pass
//! reads weights in place from [`ModelImage::bytes`] and tells the image which layer it is
//! entering, so a lazy loader can prefetch ahead of it.
//!
//! [`RegionImage`] is the image the runtime loads models into: an airs-memory
//! [`ModelRegion`] (pinned, read-only, huge-page backed: §6.2 of
//! `shared/design/model-memory.md`) filled by the loader [`LoadOptions`] names — `eager`,
//! `mmap`, or `lazy` through userfaultfd (§6.4), which lets the first forward pass run while the
//! file is still being read. [`open_model`] builds the region's [`RegionLayout`] from the GGUF
//! tensor table ([`region_layout`]: the header is parsed through a read-only map of the file, so
//! only the header's pages are read) and starts the load.
//! Cost: `bytes()` is free; `enter_layer` is an atomic swap (plus an unpark when the layer
//! changes); `load_error` is an atomic load; the layout is O(tensors).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use airs_gguf::{Gguf, LayerMap};
use airs_kernels::Isa;
use airs_memory::{
    LoadOptions, LoaderHandle, LoaderKind, MemoryError, ModelRegion, ModelRegistry, Notice,
    RegionLayout, RegionRef, RegistryError, Span, SpanKind, Transform,
};

use crate::error::{EngineError, EngineErrorKind};
use crate::model::Model;
use crate::repack::{RepackPlan, plan_of};

/// The bytes of a model file, byte `i` of the image being byte `i` of the file.
pub trait ModelImage: Send + Sync {
    /// The whole image. Reading it may block while a lazy loader fills the page.
    fn bytes(&self) -> &[u8];

    /// Hint: the forward pass is about to read layer `layer`'s weights.
    fn enter_layer(&self, _layer: usize) {}

    /// A failure of the loader behind the image (reads after a failure may see zeros).
    fn load_error(&self) -> Option<MemoryError> {
        None
    }

    /// Whether weights are still being loaded into the image (a lazy region not yet resident):
    /// long prompts then run layer-major ([`crate::Model::forward_passes`]) so that all of their
    /// passes overlap the load.
    fn is_loading(&self) -> bool {
        false
    }

    /// The repack plan whose layout the image's weights are in, if the loader applied one.
    fn repack_plan(&self) -> Option<&RepackPlan> {
        None
    }
}

/// A read-only memory map of a model file (the kernel pages it in on demand).
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> std::io::Result<MappedFile> {
        let file = File::open(path)?;
        // SAFETY: the map is read-only and private to this process; airs never writes model
        // files, and a file truncated by another process while mapped is outside the contract
        // of this image (the lazy loader handles that case and reports it).
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(MappedFile { map })
    }
}

impl ModelImage for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// An owned copy of a model file (tests, embedded models).
pub struct OwnedImage(pub Vec<u8>);

impl ModelImage for OwnedImage {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A model image embedded in the binary.
pub struct StaticImage(pub &'static [u8]);

impl ModelImage for StaticImage {
    fn bytes(&self) -> &[u8] {
        self.0
    }
}

/// A model image in a [`ModelRegion`]: byte `i` is byte `i` of the model file. Holding it
/// counts as a session of the region (§6.2 reference counting); `enter_layer` hints the
/// loader's prefetcher and `load_error` reports a failed (e.g. truncated) lazy load.
#[derive(Debug)]
pub struct RegionImage {
    session: RegionRef,
    loader: LoaderHandle,
}

impl RegionImage {
    /// An image of `region`, registered as one session of it.
    pub fn new(region: &Arc<ModelRegion>) -> RegionImage {
        RegionImage {
            session: region.acquire(),
            loader: region.loader(),
        }
    }

    /// An image over a session already taken on a region (e.g. from
    /// [`airs_memory::ModelRegistry::acquire`], which also marks the model as used).
    pub fn from_session(session: RegionRef) -> RegionImage {
        let loader = session.region().loader();
        RegionImage { session, loader }
    }

    /// The region behind the image (statistics, notices, refcount).
    pub fn region(&self) -> &Arc<ModelRegion> {
        self.session.region()
    }

    /// The loader filling the region (progress, residency, errors).
    pub fn loader(&self) -> &LoaderHandle {
        &self.loader
    }
}

impl ModelImage for RegionImage {
    fn bytes(&self) -> &[u8] {
        self.session.bytes()
    }

    fn enter_layer(&self, layer: usize) {
        // u32::MAX is the loader's "no layer" sentinel; no model has that many layers.
        self.loader.enter_layer(
            u32::try_from(layer)
                .unwrap_or(u32::MAX - 1)
                .min(u32::MAX - 1),
        );
    }

    fn load_error(&self) -> Option<MemoryError> {
        self.loader.error()
    }

    fn is_loading(&self) -> bool {
        !self.loader.is_resident()
    }

    fn repack_plan(&self) -> Option<&RepackPlan> {
        self.region().transform().and_then(|t| plan_of(&**t))
    }
}

fn load_err(e: &MemoryError) -> EngineError {
    EngineError::new(EngineErrorKind::Load(e.clone()))
}

/// The region layout of a parsed GGUF file: the header (magic, metadata, tensor table, up to
/// the aligned data start) as [`SpanKind::Other`], every tensor of `blk.N` as
/// [`SpanKind::Layer`]`(N)`, `token_embd.weight` as [`SpanKind::Embedding`] and every other
/// tensor (output norm, output head) as [`SpanKind::Other`]; one span per tensor, sorted by
/// offset. Bytes between tensors (alignment padding) are left uncovered.
pub fn layout_from_gguf(gguf: &Gguf<'_>) -> RegionLayout {
    let file_len = gguf.image().len() as u64;
    let tensors = gguf.tensors();
    let map = LayerMap::new(gguf);
    let mut spans = Vec::with_capacity(tensors.len() + 1);
    let header_end = gguf.data_offset().min(file_len);
    if header_end > 0 {
        spans.push(Span {
            start: 0,
            end: header_end,
            kind: SpanKind::Other,
        });
    }
    for layer in &map.layers {
        for &i in &layer.tensors {
            let r = tensors[i].byte_range();
            spans.push(Span {
                start: r.start,
                end: r.end,
                kind: SpanKind::Layer(layer.index),
            });
        }
    }
    for &i in &map.other {
        let t = &tensors[i];
        let r = t.byte_range();
        let kind = if t.name == "token_embd.weight" {
            SpanKind::Embedding
        } else {
            SpanKind::Other
        };
        spans.push(Span {
            start: r.start,
            end: r.end,
            kind,
        });
    }
    spans.retain(|s| s.start < s.end);
    spans.sort_by_key(|s| (s.start, s.end));
    RegionLayout { file_len, spans }
}

/// The region layout of the GGUF file at `path`, from its header alone: the file is mapped
/// read-only and parsed in place, which reads the header's pages and none of the tensor data.
pub fn region_layout(path: &Path) -> Result<RegionLayout, EngineError> {
    Ok(prepare_load(path, &LoadOptions::default(), None)?.0)
}

/// The layout of `path` and the load options to use: `options`, plus (when `repack_for` names
/// an instruction set and the loader copies the file) the [`RepackPlan`] that stores the
/// matrices `repack_for` multiplies faster repacked in that layout.
fn prepare_load(
    path: &Path,
    options: &LoadOptions,
    repack_for: Option<Isa>,
) -> Result<(RegionLayout, LoadOptions), EngineError> {
    let map = MappedFile::open(path)?;
    let gguf = Gguf::parse(map.bytes())?;
    let mut options = options.clone();
    let copies = options.loader != LoaderKind::Mmap && options.repack;
    if let Some(isa) = repack_for.filter(|_| copies && options.transform.is_none()) {
        let chunk_bytes = airs_memory::load_chunk_bytes(options.chunk_bytes);
        if let Some(plan) = RepackPlan::new(&gguf, chunk_bytes, isa) {
            options.transform = Some(Transform(Arc::new(plan)));
        }
    }
    Ok((layout_from_gguf(&gguf), options))
}

/// A model file loaded (or loading) into a model region.
#[derive(Debug)]
pub struct OpenedModel {
    /// The image the engine reads weights from.
    pub image: Arc<RegionImage>,
    /// The layout the loader was given.
    pub layout: RegionLayout,
    /// Degradations reported when the load started (more may follow when a lazy load
    /// completes: see [`ModelRegion::notices`]).
    pub notices: Vec<Notice>,
    /// When the region load started (after the header was parsed).
    pub load_started: Instant,
}

impl OpenedModel {
    /// The image as the engine's trait object.
    pub fn dyn_image(&self) -> Arc<dyn ModelImage> {
        self.image.clone()
    }

    /// The region (statistics, notices).
    pub fn region(&self) -> &Arc<ModelRegion> {
        self.image.region()
    }

    /// The loader (progress, residency, errors).
    pub fn loader(&self) -> &LoaderHandle {
        self.image.loader()
    }

    /// Builds the [`Model`] over the region (see [`load_model`]).
    pub fn model(&self) -> Result<Model, EngineError> {
        load_model(self.dyn_image())
    }
}

/// Opens the GGUF file at `path` into a model region with `options` (loader, chunk size,
/// storage pacing): builds the layout from the header, then starts the load. Returns once the
/// region can be read — after the whole file for `eager`, at once for `mmap` and `lazy`.
/// A `lazy` request where userfaultfd is not permitted runs as `mmap` and says so in
/// [`OpenedModel::notices`].
///
/// `repack_for`: the instruction set the model will run with, whose fast kernels decide which
/// matrices the loader repacks (see [`crate::repack`]); `None` keeps the file's layout.
pub fn open_model(
    path: &Path,
    options: &LoadOptions,
    repack_for: Option<Isa>,
) -> Result<OpenedModel, EngineError> {
    let (layout, options) = prepare_load(path, options, repack_for)?;
    let load_started = Instant::now();
    let region = ModelRegion::load(path, layout.clone(), &options).map_err(|e| load_err(&e))?;
    let notices = region.notices();
    Ok(OpenedModel {
        image: Arc::new(RegionImage::new(&region)),
        layout,
        notices,
        load_started,
    })
}

/// [`open_model`] through a model registry: the model is charged to the registry's pool
/// (evicting least recently used models no session holds, when the pool must make room), or
/// the already loaded model is shared. The image holds the model as one session, so it is not
/// evicted while the image lives. A model the pool cannot hold is
/// [`EngineErrorKind::ModelPool`], with the registry's numbers.
pub fn open_model_in(
    registry: &ModelRegistry,
    path: &Path,
    options: &LoadOptions,
    repack_for: Option<Isa>,
) -> Result<OpenedModel, EngineError> {
    let (layout, options) = prepare_load(path, options, repack_for)?;
    let options = &options;
    let load_started = Instant::now();
    let registry_err = |e: RegistryError| match e {
        RegistryError::Load { source, .. } => load_err(&source),
        e => EngineError::new(EngineErrorKind::ModelPool(e)),
    };
    let loaded = registry
        .load(path, layout.clone(), options)
        .map_err(registry_err)?;
    let session = registry.acquire(loaded.id).map_err(registry_err)?;
    let image = RegionImage::from_session(session);
    let notices = image.region().notices();
    Ok(OpenedModel {
        image: Arc::new(image),
        layout,
        notices,
        load_started,
    })
}

/// Parses the GGUF header from `image` and builds the [`Model`] over it. A loader failure
/// noticed meanwhile (the header or norm vectors read as zeros) is reported as
/// [`EngineErrorKind::Load`], before any parse error it may have caused.
pub fn load_model(image: Arc<dyn ModelImage>) -> Result<Model, EngineError> {
    let check = |image: &dyn ModelImage| match image.load_error() {
        Some(e) => Err(EngineError::new(EngineErrorKind::Load(e))),
        None => Ok(()),
    };
    let model = Gguf::parse(image.bytes())
        .map_err(EngineError::from)
        .and_then(|gguf| Model::new(image.clone(), &gguf));
    check(&*image)?;
    model
}
