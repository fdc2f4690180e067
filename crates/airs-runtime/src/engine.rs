//! What the session manager computes with: one model, its tokenizer and chat template, the
//! thread pool — and how a conversation turn becomes the token ids appended to a session's
//! sequence.
//!
//! Turn encoding keeps a session's sequence *append-only*: its KV cache holds exactly the
//! persisted tokens, so a rebuild recomputes exactly what was there. The first turn is the
//! chat template's rendering of the system and user messages with the generation prompt. A
//! later turn appends only the difference: the template rendering of the whole conversation
//! plus the new user message, minus the text the sequence already holds (the previous
//! rendering with generation prompt, followed by the reply as generated). When the template
//! does not render the earlier conversation as a prefix (a template that rewrites earlier
//! turns), the new user message is rendered on its own. Replies are generated tokens and are
//! never re-tokenized.
//!
//! Memory: an engine belongs to a model pool's account ([`ModelPool`]). [`Engine::load`] loads
//! the weights through a [`ModelRegistry`], which charges them to its pool (evicting models
//! nobody holds, least recently used first, when it must); the engine holds the region as one
//! session, so the model is not evicted, and stays charged, while the engine lives. The session manager charges its
//! KV pool and scratch to the same account. [`Engine::open`] (tools and tests) maps the file and
//! charges it to an account of its own without a limit: everything is counted, nothing refused.
//!
//! Cost: rendering is linear in the conversation; a turn's tokens are encoded once.

use std::path::Path;
use std::sync::Arc;

use airs_engine::footprint::ModelShape;
use airs_engine::image::open_model_in;
use airs_engine::{MappedFile, Model, ModelImage, Runtime};
use airs_memory::{LoadOptions, ModelPool, ModelRegistry, PoolCharge, PoolUse};
use airs_tokenizer::chat::{ChatMessage, ChatTemplate};
use airs_tokenizer::{EncodeOptions, TokenId, Tokenizer};

use crate::error::{Result, RuntimeError, RuntimeErrorKind};
use crate::store::Role;

/// A model ready to serve sessions.
pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub runtime: Runtime,
    /// Identifies the model in the history store: sessions are bound to it.
    pub model_key: String,
    /// What the model needs besides weights (scratch estimate: [`airs_engine::footprint`]).
    pub shape: ModelShape,
    /// The model pool's account the weights are charged to; KV and scratch charge it too.
    pool: Arc<ModelPool>,
    /// The weights' charge of a mapped file ([`Engine::open`]); a region loaded through a
    /// registry carries its own, held by the engine's session on it.
    _weights: Option<PoolCharge>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model_key", &self.model_key)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Map the GGUF file at `path` and build the model, tokenizer and chat template (the
    /// template's fallback when the file has none), with `threads` worker threads. The model
    /// key is the file name and size. The weights are charged to a new account without a limit
    /// (see the module documentation); serving code loads through a registry ([`Engine::load`]).
    pub fn open(path: &Path, threads: usize) -> Result<Engine> {
        let image: Arc<dyn ModelImage> = Arc::new(MappedFile::open(path).map_err(|e| {
            RuntimeError::new(RuntimeErrorKind::Engine(airs_engine::EngineError::new(
                airs_engine::EngineErrorKind::Io(e),
            )))
        })?);
        let pool = ModelPool::new(u64::MAX);
        let charge = pool
            .charge(
                PoolUse::Weights,
                image.bytes().len() as u64,
                path.display().to_string(),
            )
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::PoolFull(e)))?;
        Engine::build(path, image, threads, pool, Some(charge))
    }

    /// Load the GGUF file at `path` into a model region through `registry` (charged to its
    /// pool; already-loaded models are shared) with `options`, and build the engine over it.
    /// A model the pool cannot hold fails here with the registry's numbers.
    pub fn load(
        registry: &ModelRegistry,
        path: &Path,
        options: &LoadOptions,
        threads: usize,
    ) -> Result<Engine> {
        let opened = open_model_in(registry, path, options)?;
        Engine::build(
            path,
            opened.dyn_image(),
            threads,
            registry.pool().clone(),
            None,
        )
    }

    fn build(
        path: &Path,
        image: Arc<dyn ModelImage>,
        threads: usize,
        pool: Arc<ModelPool>,
        weights: Option<PoolCharge>,
    ) -> Result<Engine> {
        let model = airs_engine::image::load_model(image.clone())?;
        let bytes = image.bytes();
        let size = bytes.len();
        let gguf = airs_gguf::Gguf::parse(bytes)
            .map_err(|e| RuntimeError::from(airs_engine::EngineError::from(e)))?;
        let shape = ModelShape::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(|e| {
            RuntimeError::from(airs_engine::EngineError::new(
                airs_engine::EngineErrorKind::Tokenizer(e.to_string()),
            ))
        })?;
        let template = ChatTemplate::from_gguf(&gguf, &tokenizer)
            .unwrap_or_else(|_| ChatTemplate::fallback_for(&tokenizer));
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        drop(gguf);
        Ok(Engine {
            model,
            tokenizer,
            template,
            runtime: Runtime::new(threads.max(1)),
            model_key: format!("{name}:{size}"),
            shape,
            pool,
            _weights: weights,
        })
    }

    /// The model pool's account this engine's weights are charged to.
    pub fn pool(&self) -> &Arc<ModelPool> {
        &self.pool
    }

    fn render(&self, messages: &[ChatMessage], generation_prompt: bool) -> Result<String> {
        self.template
            .render(messages, generation_prompt)
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::Template(e.to_string())))
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

    /// The token ids a new user message `user` appends to a session whose conversation so far
    /// is `history` (roles and contents as stored; replies exactly as generated). Never empty.
    pub fn turn_tokens(&self, history: &[(Role, String)], user: &str) -> Result<Vec<u32>> {
        let msg = |role: Role, content: &str| ChatMessage::new(role.name(), content);
        let mut conversation: Vec<ChatMessage> = history.iter().map(|(r, c)| msg(*r, c)).collect();
        conversation.push(msg(Role::User, user));
        let first_turn = !history.iter().any(|(r, _)| *r == Role::User);
        let ids = if first_turn {
            let text = self.render(&conversation, true)?;
            let text = self.strip_bos_text(&text);
            self.encode_text(text, true)
        } else {
            self.delta_tokens(history, &conversation)?
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
    ) -> Result<Vec<u32>> {
        // The text the sequence holds: the rendering up to the last user message with the
        // generation prompt, then every reply after it as generated.
        let last_user = history
            .iter()
            .rposition(|(r, _)| *r == Role::User)
            .expect("not the first turn");
        let before: Vec<ChatMessage> = history[..=last_user]
            .iter()
            .map(|(r, c)| ChatMessage::new(r.name(), c.as_str()))
            .collect();
        let mut held = self.render(&before, true)?;
        for (_, c) in history[last_user + 1..]
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
            let target = self.render(&conv, true)?;
            if let Some(delta) = target.strip_prefix(held.as_str()) {
                return Ok(self.encode_text(delta, false));
            }
        }
        let last = conversation.last().expect("the new user message").clone();
        let text = self.render(&[last], true)?;
        Ok(self.encode_text(self.strip_bos_text(&text), false))
    }

    /// Whether every matrix product of the model gives the same bits for a token whatever the
    /// number of tokens in its pass (the kernels match the scalar reference for every row
    /// count; see [`crate::schedule`]).
    pub fn batch_invariant(&self) -> bool {
        let m = &self.model;
        let isa = self.runtime.isa;
        std::iter::once(m.output.ty)
            .chain(m.layers.iter().flat_map(|l| {
                [
                    l.wq.ty,
                    l.wk.ty,
                    l.wv.ty,
                    l.wo.ty,
                    l.w_gate.ty,
                    l.w_up.ty,
                    l.w_down.ty,
                ]
            }))
            .all(|ty| airs_kernels::matmul_matches_scalar(isa, ty))
    }

    /// Whether `id` ends generation.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.tokenizer.is_end_of_generation(TokenId(id))
    }
}
