//! The one loaded-model type: a model ready to serve — its weights in a model region (or the
//! embedded image), the parsed hyperparameters, the tokenizer and chat template, the thread pool
//! its forward passes run on, and the model pool's account its memory is charged to. Every
//! front end (`airs run`, `airs session`, the benchmarks, `airs serve`) loads models only
//! through [`LoadedModel`], and renders prompts with it, so they all see the same tokens.
//!
//! Loading: [`LoadedModel::load`] loads a GGUF file through a [`ModelRegistry`] (the registry
//! charges the weights to its pool, evicting models nobody holds, least recently used first,
//! when it must; an already loaded file is shared) with the loader the [`LoadOptions`] name;
//! [`LoadedModel::embedded`] takes a model compiled into the binary (a static image, already in
//! memory and read-only: nothing to load, but its bytes are still charged to the pool);
//! [`LoadedModel::open`] maps a file with an account of its own without a limit (tools, tests:
//! everything counted, nothing refused).
//!
//! Turn encoding keeps a session's sequence *append-only*: its KV cache holds exactly the
//! persisted tokens, so a rebuild recomputes exactly what was there. The first turn is the
//! chat template's rendering of the system and user messages with the generation prompt. A
//! later turn appends only the difference: the template rendering of the whole conversation
//! plus the turn's new messages (a user message, or function results), minus the text the
//! sequence already holds (the previous rendering with generation prompt, followed by the
//! reply as generated). When the template does not render the earlier conversation as a
//! prefix (a template that rewrites earlier turns), the new messages are rendered on their
//! own. Replies are generated tokens and are
//! never re-tokenized.
//!
//! Cost: building reads the header (and norm vectors as layers run); the tokenizer's tables
//! are built once (tens of milliseconds for a 150k vocabulary). Rendering is linear in the
//! conversation.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use airs_engine::footprint::ModelShape;
use airs_engine::image::open_model_in;
use airs_engine::{
    EngineError, EngineErrorKind, KvShape, MappedFile, Model, ModelImage, Runtime, StaticImage,
};
use airs_memory::{
    LoadOptions, LoaderKind, ModelPool, ModelRegion, ModelRegistry, Notice, PoolCharge, PoolUse,
};
use airs_tokenizer::chat::{ChatMessage, ChatTemplate, ChatTools, TemplateSource};
use airs_tokenizer::{EncodeOptions, TokenId, Tokenizer};

use crate::constraint::VocabBytes;
use crate::error::{Result, RuntimeError, RuntimeErrorKind};
use crate::request::Prompt;
use crate::store::Role;

/// The embedded default model: stories260K (MIT, see `models/LICENSE-stories260K.txt`), 1 MB,
/// compiled into every binary that serves models, so `airs run` and `airs serve` work with no
/// file at all.
pub static EMBEDDED_MODEL: &[u8] = include_bytes!("../../../models/stories260K.gguf");
/// The name the embedded model is reported by.
pub const EMBEDDED_MODEL_NAME: &str = "stories260K.gguf (embedded)";

/// Where a loaded model's weights live.
#[derive(Debug)]
pub enum Weights {
    /// Compiled into the binary.
    Embedded,
    /// A model file loaded into a model region through a registry.
    Region {
        path: PathBuf,
        region: Arc<ModelRegion>,
        /// When the region load started (after the header was parsed).
        load_started: Instant,
    },
    /// A model file mapped read-only ([`LoadedModel::open`]).
    Mapped { path: PathBuf },
}

/// A model ready to serve (see the module documentation).
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// The model's chat template, or the fallback for its vocabulary when it has none (or one
    /// that does not parse: see [`LoadedModel::template_error`]).
    pub template: ChatTemplate,
    template_error: Option<String>,
    pub runtime: Runtime,
    /// What the model needs besides weights (the scratch estimate: [`airs_engine::footprint`]).
    pub shape: ModelShape,
    /// The name to report the model by (the path given, or the embedded model's name).
    pub name: String,
    /// Identifies the model in the history store: sessions are bound to it (file name and
    /// size).
    pub model_key: String,
    pub weights: Weights,
    /// When opening started (for times "from open").
    pub opened_at: Instant,
    /// The model pool's account the weights are charged to; KV and scratch charge it too.
    pool: Arc<ModelPool>,
    /// The weights' charge when no region carries it (embedded or mapped images); a region
    /// loaded through a registry carries its own, held by the image's session on it.
    _weights_charge: Option<PoolCharge>,
    /// Every token's bytes, built on the first request constrained to an output format.
    vocab_bytes: OnceLock<Arc<VocabBytes>>,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("name", &self.name)
            .field("model_key", &self.model_key)
            .finish_non_exhaustive()
    }
}

fn engine_err(kind: EngineErrorKind) -> RuntimeError {
    RuntimeError::from(EngineError::new(kind))
}

impl LoadedModel {
    /// Load the GGUF file at `path` into a model region through `registry` (charged to its
    /// pool; already-loaded models are shared) with `options`, and build the model over it with
    /// `threads` worker threads. A model the pool cannot hold fails here with the registry's
    /// numbers ([`EngineErrorKind::ModelPool`]).
    pub fn load(
        registry: &ModelRegistry,
        path: &Path,
        options: &LoadOptions,
        threads: usize,
    ) -> Result<LoadedModel> {
        let opened_at = Instant::now();
        let opened = open_model_in(registry, path, options, Some(airs_kernels::Isa::detect()))?;
        let weights = Weights::Region {
            path: path.to_path_buf(),
            region: opened.region().clone(),
            load_started: opened.load_started,
        };
        LoadedModel::build(
            path.display().to_string(),
            opened.dyn_image(),
            weights,
            threads,
            registry.pool().clone(),
            None,
            opened_at,
        )
    }

    /// The model compiled into the binary as `bytes`, reported as `name`, its bytes charged to
    /// `pool` as weights.
    pub fn embedded(
        bytes: &'static [u8],
        name: &str,
        pool: &Arc<ModelPool>,
        threads: usize,
    ) -> Result<LoadedModel> {
        let opened_at = Instant::now();
        let charge = pool
            .charge(PoolUse::Weights, bytes.len() as u64, name)
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::PoolFull(e)))?;
        LoadedModel::build(
            name.to_string(),
            Arc::new(StaticImage(bytes)),
            Weights::Embedded,
            threads,
            pool.clone(),
            Some(charge),
            opened_at,
        )
    }

    /// [`LoadedModel::load`] of `path`, or the embedded model when `path` is `None`.
    pub fn load_or_embedded(
        registry: &ModelRegistry,
        path: Option<&Path>,
        options: &LoadOptions,
        threads: usize,
    ) -> Result<LoadedModel> {
        match path {
            Some(p) => LoadedModel::load(registry, p, options, threads),
            None => LoadedModel::embedded(
                EMBEDDED_MODEL,
                EMBEDDED_MODEL_NAME,
                registry.pool(),
                threads,
            ),
        }
    }

    /// Whether the GGUF file at `path` is one airs can run — it opens, parses, and names an
    /// architecture, hyperparameters and tensors airs runs — reading its header (and norm
    /// vectors) only: what a front end checks before it promises to serve a file. Its shape.
    pub fn check_file(path: &Path) -> Result<ModelShape> {
        let image: Arc<dyn ModelImage> =
            Arc::new(MappedFile::open(path).map_err(|e| engine_err(EngineErrorKind::Io(e)))?);
        airs_engine::image::load_model(Arc::clone(&image))?;
        let gguf = airs_gguf::Gguf::parse(image.bytes()).map_err(EngineError::from)?;
        Ok(ModelShape::from_gguf(&gguf)?)
    }

    /// Map the GGUF file at `path` read-only and build the model over it, its weights charged
    /// to a new account without a limit (see the module documentation).
    pub fn open(path: &Path, threads: usize) -> Result<LoadedModel> {
        let opened_at = Instant::now();
        let image: Arc<dyn ModelImage> =
            Arc::new(MappedFile::open(path).map_err(|e| engine_err(EngineErrorKind::Io(e)))?);
        let pool = ModelPool::new(u64::MAX);
        let charge = pool
            .charge(
                PoolUse::Weights,
                image.bytes().len() as u64,
                path.display().to_string(),
            )
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::PoolFull(e)))?;
        LoadedModel::build(
            path.display().to_string(),
            image,
            Weights::Mapped {
                path: path.to_path_buf(),
            },
            threads,
            pool,
            Some(charge),
            opened_at,
        )
    }

    fn build(
        name: String,
        image: Arc<dyn ModelImage>,
        weights: Weights,
        threads: usize,
        pool: Arc<ModelPool>,
        charge: Option<PoolCharge>,
        opened_at: Instant,
    ) -> Result<LoadedModel> {
        let model = airs_engine::image::load_model(image.clone())?;
        let bytes = image.bytes();
        let size = bytes.len();
        let gguf = airs_gguf::Gguf::parse(bytes).map_err(EngineError::from)?;
        let shape = ModelShape::from_gguf(&gguf)?;
        let tokenizer =
            Tokenizer::from_gguf(&gguf).map_err(|e| engine_err(EngineErrorKind::Tokenizer(e)))?;
        let (template, template_error) = match ChatTemplate::from_gguf(&gguf, &tokenizer) {
            Ok(t) => (t, None),
            Err(e) => (ChatTemplate::fallback_for(&tokenizer), Some(e.to_string())),
        };
        drop(gguf);
        let file_name = match &weights {
            Weights::Embedded => name.clone(),
            Weights::Region { path, .. } | Weights::Mapped { path } => path
                .file_name()
                .map_or_else(|| name.clone(), |n| n.to_string_lossy().into_owned()),
        };
        Ok(LoadedModel {
            model,
            tokenizer,
            template,
            template_error,
            runtime: Runtime::new(threads.max(1)),
            shape,
            model_key: format!("{file_name}:{size}"),
            name,
            weights,
            opened_at,
            pool,
            _weights_charge: charge,
            vocab_bytes: OnceLock::new(),
        })
    }

    /// The model pool's account this model's weights are charged to.
    pub fn pool(&self) -> &Arc<ModelPool> {
        &self.pool
    }

    /// Why the model's own chat template was not used (the fallback was), if it was not.
    pub fn template_error(&self) -> Option<&str> {
        self.template_error.as_deref()
    }

    /// Whether the chat template is the model's own (not a fallback).
    pub fn has_own_template(&self) -> bool {
        self.template.source() == TemplateSource::Model
    }

    /// The geometry of the model's KV cache.
    pub fn kv_shape(&self) -> KvShape {
        let c = &self.model.config;
        KvShape {
            layers: c.layers,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// The model's context length (most positions a sequence may hold).
    pub fn context_len(&self) -> usize {
        self.model.config.context_len
    }

    /// The model region, when the weights live in one.
    pub fn region(&self) -> Option<&Arc<ModelRegion>> {
        match &self.weights {
            Weights::Region { region, .. } => Some(region),
            _ => None,
        }
    }

    /// The loader in use after any fallback: `eager`, `mmap`, `lazy`, `embedded` or `map`.
    pub fn loader_name(&self) -> &'static str {
        match &self.weights {
            Weights::Region { region, .. } => region.loader_kind().as_str(),
            Weights::Embedded => "embedded",
            Weights::Mapped { .. } => "map",
        }
    }

    /// Every notice of the region so far (degradations; some arrive when a lazy load ends).
    pub fn notices(&self) -> Vec<Notice> {
        self.region().map(|r| r.notices()).unwrap_or_default()
    }

    /// Whether the weights are still being loaded.
    pub fn is_loading(&self) -> bool {
        self.model.image().is_loading()
    }

    /// Blocks until the region is fully loaded and finalized (at once without a region).
    pub fn wait_resident(&self) -> Result<()> {
        if let Some(r) = self.region() {
            r.loader()
                .wait_resident()
                .map_err(|e| engine_err(EngineErrorKind::Load(e)))?;
        }
        Ok(())
    }

    /// Time from opening until every byte was resident and the region finalized; `None` for
    /// mmap (the kernel pages the file in on demand: not tracked), images without a region,
    /// or a load still running.
    pub fn fully_resident_after_open(&self) -> Option<Duration> {
        let Weights::Region {
            region,
            load_started,
            ..
        } = &self.weights
        else {
            return None;
        };
        if region.loader_kind() == LoaderKind::Mmap {
            return None;
        }
        let after_load_start = region.loader().fully_resident_after()?;
        Some(load_started.duration_since(self.opened_at) + after_load_start)
    }

    /// Every token's bytes, for generation constrained to an output format
    /// ([`crate::constraint`]): built on the first call (a pass over the vocabulary), shared
    /// after.
    pub fn vocab_bytes(&self) -> Arc<VocabBytes> {
        Arc::clone(
            self.vocab_bytes
                .get_or_init(|| Arc::new(VocabBytes::new(&self.tokenizer))),
        )
    }

    /// The token ids of a request's prompt: a text as [`LoadedModel::encode_prompt`], a
    /// conversation as [`LoadedModel::encode_chat`], ids as they are.
    pub fn prompt_tokens(&self, prompt: Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(text) => Ok(self.encode_prompt(&text)),
            Prompt::Tokens(ids) => Ok(ids),
            Prompt::Chat(messages) => self.encode_chat(&messages),
            Prompt::ChatWithTools { messages, tools } => {
                self.encode_chat_with_tools(&messages, Some(tools.chat()))
            }
        }
    }

    /// The token ids of a raw completion prompt: BOS as the model wants it, special tokens
    /// parsed (as llama.cpp's completion endpoint does). An empty text gives BOS alone, or
    /// nothing when the model has no BOS.
    pub fn encode_prompt(&self, text: &str) -> Vec<u32> {
        let tok = &self.tokenizer;
        let mut ids: Vec<u32> = tok
            .encode(text, EncodeOptions::prompt(tok))
            .into_iter()
            .map(u32::from)
            .collect();
        if ids.is_empty()
            && let Some(bos) = tok.bos_id()
        {
            ids.push(bos.into());
        }
        ids
    }

    /// The token ids of a conversation rendered with the chat template and the generation
    /// prompt (BOS not doubled).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_chat_with_tools(messages, None)
    }

    /// [`LoadedModel::encode_chat`] of a conversation that may call `tools`.
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ChatTools>,
    ) -> Result<Vec<u32>> {
        Ok(self
            .template
            .encode_with_tools(&self.tokenizer, messages, tools, true)
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::Template(e)))?
            .into_iter()
            .map(u32::from)
            .collect())
    }

    /// The text of `ids` (special tokens rendered as the tokenizer renders them).
    pub fn decode(&self, ids: &[u32]) -> String {
        let ids: Vec<TokenId> = ids.iter().map(|&t| TokenId(t)).collect();
        self.tokenizer.decode(&ids)
    }

    /// Whether `id` ends generation.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.tokenizer.is_end_of_generation(TokenId(id))
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ChatTools>,
        generation_prompt: bool,
    ) -> Result<String> {
        self.template
            .render_with_tools(messages, tools, generation_prompt)
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::Template(e)))
    }

    fn encode_text(&self, text: &str, bos: bool) -> Vec<u32> {
        let options = EncodeOptions {
            add_bos: bos && self.tokenizer.add_bos(),
            parse_special: true,
        };
        self.tokenizer
            .encode(text, options)
            .into_iter()
            .map(u32::from)
            .collect()
    }

    /// The token ids a turn's new messages `inputs` (user messages, or function results)
    /// append to a session whose conversation so far is `history` (roles and contents as
    /// stored; replies exactly as generated) and which may call `tools`. Never empty.
    pub fn turn_tokens(
        &self,
        history: &[(Role, String)],
        inputs: &[(Role, String)],
        tools: Option<&ChatTools>,
    ) -> Result<Vec<u32>> {
        let mut conversation: Vec<ChatMessage> =
            history.iter().map(|(r, c)| message(*r, c)).collect();
        conversation.extend(inputs.iter().map(|(r, c)| message(*r, c)));
        let first_turn = !history.iter().any(|(r, _)| *r == Role::Assistant);
        let ids = if first_turn {
            let text = self.render(&conversation, tools, true)?;
            let text = self.strip_bos_text(&text);
            self.encode_text(text, true)
        } else {
            self.delta_tokens(history, &conversation, inputs, tools)?
        };
        if ids.is_empty() {
            // An empty rendering (a template that drops empty messages): feed BOS or token 0
            // so the turn still computes something to sample from.
            return Ok(vec![self.tokenizer.bos_id().map_or(0, u32::from)]);
        }
        Ok(ids)
    }

    fn strip_bos_text<'a>(&self, text: &'a str) -> &'a str {
        let bos = self
            .tokenizer
            .bos_id()
            .and_then(|id| self.tokenizer.token_piece(id))
            .unwrap_or("");
        if self.tokenizer.add_bos() && !bos.is_empty() {
            text.strip_prefix(bos).unwrap_or(text)
        } else {
            text
        }
    }

    fn delta_tokens(
        &self,
        history: &[(Role, String)],
        conversation: &[ChatMessage],
        inputs: &[(Role, String)],
        tools: Option<&ChatTools>,
    ) -> Result<Vec<u32>> {
        // The text the sequence holds: the rendering up to the last turn's last new message
        // with the generation prompt, then every reply after it as generated.
        let last_input = history
            .iter()
            .rposition(|(r, _)| *r != Role::Assistant)
            .expect("not the first turn");
        let before: Vec<ChatMessage> = history[..=last_input]
            .iter()
            .map(|(r, c)| message(*r, c))
            .collect();
        let mut held = self.render(&before, tools, true)?;
        for (_, c) in history[last_input + 1..]
            .iter()
            .filter(|(r, _)| *r == Role::Assistant)
        {
            held.push_str(c);
        }
        // Replies as generated, then with leading whitespace trimmed (templates such as the
        // plain transcript put their own space before the content).
        for trim in [false, true] {
            let conv: Vec<ChatMessage> = conversation
                .iter()
                .map(|m| {
                    let c = if trim && m.role == Role::Assistant.name() {
                        m.content.trim_start()
                    } else {
                        m.content.as_str()
                    };
                    ChatMessage::new(m.role.as_str(), c)
                })
                .collect();
            let target = self.render(&conv, tools, true)?;
            if let Some(delta) = target.strip_prefix(held.as_str()) {
                return Ok(self.encode_text(delta, false));
            }
        }
        // The template does not extend the held text: the new messages rendered alone.
        let alone: Vec<ChatMessage> = inputs.iter().map(|(r, c)| message(*r, c)).collect();
        let text = self.render(&alone, None, true)?;
        Ok(self.encode_text(self.strip_bos_text(&text), false))
    }
}

/// A stored message as the chat template receives it.
fn message(role: Role, content: &str) -> ChatMessage {
    ChatMessage::new(role.name(), content)
}

/// A model file's bytes for commands that read only its header (`inspect`, `tokenize`): a
/// read-only map of the file, or the embedded model. Nothing is loaded or charged.
pub struct ModelBytes {
    pub image: Arc<dyn ModelImage>,
    /// The path given, or the embedded model's name.
    pub name: String,
}

impl ModelBytes {
    /// Map `path`, or take the embedded model when `path` is `None`.
    pub fn open(path: Option<&Path>) -> Result<ModelBytes> {
        match path {
            None => Ok(ModelBytes {
                image: Arc::new(StaticImage(EMBEDDED_MODEL)),
                name: EMBEDDED_MODEL_NAME.into(),
            }),
            Some(p) => Ok(ModelBytes {
                image: Arc::new(
                    MappedFile::open(p).map_err(|e| engine_err(EngineErrorKind::Io(e)))?,
                ),
                name: p.display().to_string(),
            }),
        }
    }

    /// The parsed header.
    pub fn parse(&self) -> Result<airs_gguf::Gguf<'_>> {
        Ok(airs_gguf::Gguf::parse(self.image.bytes()).map_err(EngineError::from)?)
    }

    /// The tokenizer the header describes.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_gguf(&self.parse()?).map_err(|e| engine_err(EngineErrorKind::Tokenizer(e)))
    }
}
