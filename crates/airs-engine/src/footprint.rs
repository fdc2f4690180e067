//! What a model needs in the model pool besides its weights and KV cache: the scratch of one
//! forward pass, estimated from the GGUF header alone — the same estimate `airs fit` predicts
//! with and the runtime charges to the model pool's account ([`airs_memory::ModelPool`]) before
//! it serves, so that weights, KV blocks and scratch share one budget.
//!
//! The estimate follows the engine's buffers (`forward.rs`, `par.rs`): for a prefill batch of
//! min([`PREFILL_BATCH`], context) rows (decode is one row), the f32 residual, norm output,
//! attention projection output (`n_embd` each), q and attention output (`q_len`), k and v
//! (`kv_len`), gate and up (`n_ff`), the RoPE table, the quantized activation copies (one per
//! activation encoding the weights use, sized for the widest input, plus the tiled kernels'
//! prepared copy), per-thread matmul tiles and attention score buffers (group × context
//! floats), the last row's logits (vocab × 4 bytes), each sequence's sampler and constraint
//! buffers (vocab × 16 bytes) and each thread's draw (vocab × 8), and, for contexts longer
//! than one pass, the residual stream of the
//! further passes a layer-major prefill holds while weights load. `airs fit`'s tests hold it,
//! with the weights and KV cache, within 5 % of the measured peak resident set of `airs run` on
//! both real models.
//!
//! Cost: one pass over the tensor table.

use airs_gguf::{Gguf, ModelConfig};

use crate::error::{EngineError, EngineErrorKind};
use crate::forward::LAYER_MAJOR_PASSES;

/// Most prompt tokens per prefill pass (`airs run` and the session manager use this batch).
pub const PREFILL_BATCH: u64 = 512;

/// The model facts the estimate needs, read from the GGUF header.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub arch: String,
    pub file_bytes: u64,
    pub tensor_bytes: u64,
    pub layers: u64,
    pub embd: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ff: u64,
    pub vocab: u64,
    pub context_len: u64,
    pub rope_dims: u64,
    /// RoPE tables a pass builds: 2 where sliding-window layers rotate at their own base.
    pub rope_tables: u64,
    /// Bytes per activation row of the quantized copies of the layer matmul inputs: the sum
    /// over the activation encodings the layer weights use of the row bytes of the widest
    /// input encoded that way.
    pub act_row_bytes: u64,
    /// The largest of those (the tiled kernels' prepared copy holds one input at a time).
    pub max_act_row_bytes: u64,
    /// Output rows of the largest layer matrix (per-thread matmul tiles are a slice of it).
    pub max_layer_rows: u64,
}

impl ModelShape {
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<ModelShape, EngineError> {
        let c = ModelConfig::from_gguf(gguf)?;
        let mut widest: Vec<(airs_kernels::ActType, u64)> = Vec::new();
        let mut max_rows = 0u64;
        for t in gguf.tensors() {
            if !t.name.starts_with("blk.") || t.dims.len() != 2 {
                continue;
            }
            let (cols, rows) = (t.dims[0], t.dims[1]);
            max_rows = max_rows.max(rows);
            let act = airs_kernels::act_type(t.ty).map_err(|_| {
                EngineError::new(EngineErrorKind::UnsupportedTensorType {
                    tensor: t.name.to_string(),
                    ty: t.ty,
                })
            })?;
            match widest.iter_mut().find(|(a, _)| *a == act) {
                Some((_, w)) => *w = (*w).max(cols),
                None => widest.push((act, cols)),
            }
        }
        let row_bytes = |(a, w): &(airs_kernels::ActType, u64)| a.row_bytes(*w as usize) as u64;
        let u = |x: usize| x as u64;
        Ok(ModelShape {
            arch: c.arch.name().to_string(),
            file_bytes: u(gguf.image().len()),
            tensor_bytes: gguf.tensors().iter().map(|t| t.bytes).sum(),
            layers: u(c.layers),
            embd: u(c.embedding_len),
            heads: u(c.heads),
            kv_heads: u(c.kv_heads),
            head_dim: u(c.head_dim),
            ff: u(c.ff_len),
            vocab: u(c.vocab_len),
            context_len: u(c.context_len),
            rope_dims: u(c.rope_dims),
            rope_tables: if c.sliding_window.is_some() { 2 } else { 1 },
            act_row_bytes: widest.iter().map(row_bytes).sum(),
            max_act_row_bytes: widest.iter().map(row_bytes).max().unwrap_or(0),
            max_layer_rows: max_rows,
        })
    }

    pub fn q_len(&self) -> u64 {
        self.heads * self.head_dim
    }

    pub fn kv_len(&self) -> u64 {
        self.kv_heads * self.head_dim
    }
}

/// The activation buffers of one forward pass, by kind (bytes).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Scratch {
    /// Rows of the prefill batch the buffers are sized for.
    pub rows: u64,
    /// f32 residual, norm, q/k/v, attention output, projection, gate and up; RoPE table.
    pub activations: u64,
    /// Quantized copies of the matmul inputs (and the tiled kernels' prepared copy).
    pub quantized: u64,
    /// Per-thread matmul tiles and attention score buffers, all threads.
    pub per_thread: u64,
    /// Output norm rows and the logits of every sequence's last row.
    pub logits: u64,
    /// Over the vocabulary: each sequence's sampler candidates (8 bytes a token), penalized
    /// logits and JSON-constrained logits (4 each), which it keeps from draw to draw; and the
    /// probabilities and weights of a draw (8), one draw at a time on each thread.
    pub sampler: u64,
    /// The residual stream of the further passes a layer-major prefill holds while the weights
    /// are loading ([`crate::forward::LAYER_MAJOR_PASSES`]; 0 for contexts of one pass).
    pub residual: u64,
}

impl Scratch {
    /// The scratch of `shape` for one sequence of `context` tokens on `threads` threads, in
    /// passes of up to [`PREFILL_BATCH`] rows.
    pub fn new(shape: &ModelShape, context: u64, threads: u64) -> Scratch {
        Scratch::for_batch(shape, context, threads, context.clamp(1, PREFILL_BATCH), 1)
    }

    /// The scratch of a batched step of up to `step_rows` rows over at most `max_seqs`
    /// sequences (each wanting its last row's logits) of up to `context` tokens, on `threads`
    /// threads: what the runtime's scheduler charges.
    pub fn for_batch(
        shape: &ModelShape,
        context: u64,
        threads: u64,
        step_rows: u64,
        max_seqs: u64,
    ) -> Scratch {
        let r = step_rows.max(1);
        let seqs = max_seqs.max(1);
        let s = shape;
        let f32s = 3 * s.embd + 2 * s.q_len() + 2 * s.kv_len() + 2 * s.ff;
        let rope = s.rope_tables * (s.rope_dims / 2 * 8);
        let prepared = if r > 1 { s.max_act_row_bytes } else { 0 };
        let tile_width = if threads <= 1 {
            s.max_layer_rows
        } else {
            (s.max_layer_rows / (threads * 8))
                .next_multiple_of(4)
                .max(4)
        };
        let tile = if r > 1 { r * tile_width * 4 } else { 0 };
        let group = s.heads / s.kv_heads.max(1);
        let scores = group * context * 4;
        // While weights load, a step runs up to LAYER_MAJOR_PASSES passes layer-major (one
        // sequence's prompt holds at most `context` of those rows).
        let loading_rows = LAYER_MAJOR_PASSES as u64 * r;
        let loading_rows = if seqs == 1 {
            loading_rows.min(context)
        } else {
            loading_rows
        };
        Scratch {
            rows: r,
            activations: r * (f32s * 4 + rope),
            quantized: r * (s.act_row_bytes + prepared),
            per_thread: threads * (tile + scores),
            logits: 0,
            sampler: seqs * s.vocab * 16 + threads.max(1) * s.vocab * 8,
            residual: loading_rows.saturating_sub(r) * s.embd * 4,
        }
        .with_logit_rows(shape, seqs)
    }

    /// The same scratch with the logits of `rows` rows a step instead of one a sequence (a
    /// step that also computes draft tokens wants their logits too).
    pub fn with_logit_rows(mut self, shape: &ModelShape, rows: u64) -> Scratch {
        self.logits = rows.max(1) * (shape.embd * 4 + shape.vocab * 4);
        self
    }

    pub fn total(&self) -> u64 {
        self.activations
            + self.quantized
            + self.per_thread
            + self.logits
            + self.sampler
            + self.residual
    }
}
