//! The decoder forward pass shared by `llama` and `qwen2`, following llama.cpp's graphs op for
//! op so results match it closely: RMSNorm (f64 sum of squares), Q/K/V projections (+ qwen2
//! biases), RoPE in interleaved (llama) or NeoX (qwen2) style with ggml's iterative angle
//! recurrence, grouped-query attention through a [`KvCache`], SwiGLU feed-forward, and the
//! output projection.
//!
//! One call processes a batch of consecutive tokens (prefill) or one token (decode); a prompt of
//! several batches can also run *layer-major* (every batch through layer 0, then layer 1, …),
//! bit-identical to batch after batch, which lets all of it overlap a lazy load. Each
//! matrix product quantizes its input activations once (`QuantizedActs`) and splits weight
//! rows across the thread pool; attention is split over (token, head) pairs. Cost per token:
//! one pass over every weight byte (plus the output projection), and O(context × kv_len)
//! attention work per layer.

use airs_kernels::Isa;

use crate::error::{EngineError, EngineErrorKind};
use crate::kv::KvCache;
use crate::math::silu;
use crate::model::{Model, TensorRef};
use crate::par::{DisjointOut, QuantizedActs, matmul};
use crate::pool::ThreadPool;
use airs_gguf::RopeStyle;

/// Most passes a prefill runs layer-major at once while weights load ([`Model::prefill`]): it
/// holds their residual stream (`passes × pass_rows × n_embd` floats), which the scratch
/// estimate ([`crate::footprint`]) counts.
pub const LAYER_MAJOR_PASSES: usize = 4;

/// Which logits a forward pass returns.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (what generation needs).
    Last,
    /// Every token's, `tokens × vocab` (tests, perplexity).
    All,
}

/// The execution resources a forward pass runs with: explicit, never read from the environment.
pub struct Runtime {
    pub pool: ThreadPool,
    pub isa: Isa,
}

impl Runtime {
    /// A runtime with `threads` threads and the best instruction set of this CPU.
    pub fn new(threads: usize) -> Runtime {
        Runtime::with_isa(threads, Isa::detect())
    }

    pub fn with_isa(threads: usize, isa: Isa) -> Runtime {
        Runtime {
            pool: ThreadPool::new(threads),
            isa,
        }
    }
}

thread_local! {
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The activation buffers of one pass of up to `rows` tokens.
struct PassScratch {
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    acts: QuantizedActs,
    norm: Vec<f32>,
    bias: Vec<f32>,
}

impl PassScratch {
    fn new(cfg: &airs_gguf::ModelConfig, rows: usize) -> PassScratch {
        let f = |len: usize| vec![0.0f32; rows * len];
        PassScratch {
            xn: f(cfg.embedding_len),
            q: f(cfg.q_len()),
            k: f(cfg.kv_len()),
            v: f(cfg.kv_len()),
            attn: f(cfg.q_len()),
            proj: f(cfg.embedding_len),
            gate: f(cfg.ff_len),
            up: f(cfg.ff_len),
            acts: QuantizedActs::default(),
            norm: Vec::new(),
            bias: Vec::new(),
        }
    }
}

impl Model {
    /// Run `tokens` at positions `kv.len()..` through the model, storing their keys and values
    /// in `kv`, and return the requested logits.
    pub fn forward(
        &self,
        rt: &Runtime,
        kv: &mut dyn KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, EngineError> {
        self.forward_passes(rt, kv, tokens, tokens.len().max(1), logits)
    }

    /// The passes of a prompt (at most `pass_rows` tokens each), returning the last token's
    /// logits: pass by pass while the weights are resident (one pass's residual stream at a
    /// time), layer-major ([`Model::forward_passes`]) in groups of [`LAYER_MAJOR_PASSES`] while
    /// they are still loading, so that a long prompt, not only its first pass, overlaps the
    /// load. The same bits either way.
    pub fn prefill(
        &self,
        rt: &Runtime,
        kv: &mut dyn KvCache,
        tokens: &[u32],
        pass_rows: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let pass_rows = pass_rows.max(1);
        let mut logits = Vec::new();
        if tokens.len() > pass_rows && self.image().is_loading() {
            for group in tokens.chunks(pass_rows * LAYER_MAJOR_PASSES) {
                logits = self.forward_passes(rt, kv, group, pass_rows, Logits::Last)?;
            }
        } else {
            for pass in tokens.chunks(pass_rows) {
                logits = self.forward(rt, kv, pass, Logits::Last)?;
            }
        }
        if logits.is_empty() {
            return Err(EngineError::invalid("forward pass over zero tokens"));
        }
        Ok(logits)
    }

    /// [`Model::forward`] over `tokens` as consecutive passes of at most `pass_rows` tokens,
    /// computed *layer-major*: layer 0 of every pass, then layer 1 of every pass, and so on.
    /// Each pass computes exactly what `forward` on it would (the same rows, positions and
    /// kernels: the results are bit-identical to calling `forward` pass by pass), but a layer's
    /// weights are used by all passes before the next layer's are needed — so while the weights
    /// are still loading (lazy or mmap), every pass of a long prompt overlaps the load, not only
    /// the first. Costs the residual stream of all tokens (`tokens × n_embd` floats) on top of
    /// one pass's scratch.
    pub fn forward_passes(
        &self,
        rt: &Runtime,
        kv: &mut dyn KvCache,
        tokens: &[u32],
        pass_rows: usize,
        logits: Logits,
    ) -> Result<Vec<f32>, EngineError> {
        let cfg = &self.config;
        let n_tokens = tokens.len();
        if n_tokens == 0 {
            return Err(EngineError::invalid("forward pass over zero tokens"));
        }
        if pass_rows == 0 {
            return Err(EngineError::invalid("passes of zero tokens"));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_len) {
            return Err(EngineError::new(EngineErrorKind::TokenOutOfRange {
                token: bad,
                vocab_len: cfg.vocab_len,
            }));
        }
        let pos0 = kv.len();
        kv.reserve(pos0 + n_tokens)?;

        let image = self.image().bytes();
        let pool = &rt.pool;
        let n_embd = cfg.embedding_len;

        // Residual stream: the embedding rows of the tokens.
        let mut x = vec![0.0f32; n_tokens * n_embd];
        for (row, &tok) in x.chunks_exact_mut(n_embd).zip(tokens) {
            airs_kernels::dequantize_row(
                self.token_embd.ty,
                self.token_embd.row(image, tok as usize),
                row,
            )
            .map_err(|e| EngineError::bad_tensor("token_embd.weight", e.to_string()))?;
        }

        let mut scratch = PassScratch::new(cfg, pass_rows.min(n_tokens));
        let passes: Vec<(usize, RopeTable)> = (0..n_tokens)
            .step_by(pass_rows)
            .map(|first| {
                let rows = pass_rows.min(n_tokens - first);
                let rope = RopeTable::new(cfg.rope_dims, cfg.rope_base, pos0 + first, rows);
                (first, rope)
            })
            .collect();
        for (l, layer) in self.layers.iter().enumerate() {
            self.image().enter_layer(l);
            for (first, rope) in &passes {
                let rows = rope.tokens;
                let x_pass = &mut x[first * n_embd..(first + rows) * n_embd];
                self.layer_pass(rt, kv, l, layer, x_pass, pos0 + first, rope, &mut scratch);
            }
        }
        if let Some(e) = self.image().load_error() {
            return Err(EngineError::new(EngineErrorKind::Load(e)));
        }

        // Output norm and projection, for the rows whose logits are wanted, per pass (as
        // `forward` on each pass would compute them: the same bits).
        let wanted: Vec<(usize, usize)> = match logits {
            Logits::Last => vec![(n_tokens - 1, 1)],
            Logits::All => passes.iter().map(|(first, r)| (*first, r.tokens)).collect(),
        };
        let rows_total: usize = wanted.iter().map(|&(_, rows)| rows).sum();
        let mut out = vec![0.0f32; rows_total * cfg.vocab_len];
        self.output_norm.decode_vector(image, &mut scratch.norm);
        let act_type = airs_kernels::act_type(self.output.ty).expect("type checked at model load");
        let mut at = 0;
        for (first, rows) in wanted {
            let x_out = &x[first * n_embd..(first + rows) * n_embd];
            let xo = &mut scratch.xn[..rows * n_embd];
            rms_norm(x_out, &scratch.norm, cfg.rms_eps, xo);
            let acts = &mut scratch.acts;
            acts.reset();
            let a = acts.get(pool, act_type, xo, n_embd);
            let out_rows = &mut out[at * cfg.vocab_len..(at + rows) * cfg.vocab_len];
            matmul(pool, rt.isa, image, &self.output, a, rows, out_rows);
            at += rows;
        }
        kv.set_len(pos0 + n_tokens);
        Ok(out)
    }

    /// Layer `l` for one pass: the rows of `x` are the tokens at positions `pos0..`; their keys
    /// and values are stored in `kv` (whose earlier positions of layer `l` must be there).
    #[allow(clippy::too_many_arguments)]
    fn layer_pass(
        &self,
        rt: &Runtime,
        kv: &mut dyn KvCache,
        l: usize,
        layer: &crate::model::LayerWeights,
        x: &mut [f32],
        pos0: usize,
        rope: &RopeTable,
        s: &mut PassScratch,
    ) {
        let cfg = &self.config;
        let image = self.image().bytes();
        let pool = &rt.pool;
        let n_tokens = rope.tokens;
        let (q_len, kv_len, head_dim) = (cfg.q_len(), cfg.kv_len(), cfg.head_dim);
        let group = cfg.heads / cfg.kv_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let n_embd = cfg.embedding_len;
        let xn = &mut s.xn[..n_tokens * n_embd];
        let q = &mut s.q[..n_tokens * q_len];
        let k = &mut s.k[..n_tokens * kv_len];
        let v = &mut s.v[..n_tokens * kv_len];
        let attn = &mut s.attn[..n_tokens * q_len];
        let proj = &mut s.proj[..n_tokens * n_embd];
        let gate = &mut s.gate[..n_tokens * cfg.ff_len];
        let up = &mut s.up[..n_tokens * cfg.ff_len];
        let (acts, norm, bias) = (&mut s.acts, &mut s.norm, &mut s.bias);

        let mm = |acts: &mut QuantizedActs, w: &TensorRef, input: &[f32], out: &mut [f32]| {
            let act_type = airs_kernels::act_type(w.ty).expect("type checked at model load");
            let a = acts.get(pool, act_type, input, w.cols);
            matmul(pool, rt.isa, image, w, a, n_tokens, out);
        };

        layer.attn_norm.decode_vector(image, norm);
        rms_norm(x, norm, cfg.rms_eps, xn);
        acts.reset();
        mm(acts, &layer.wq, xn, q);
        mm(acts, &layer.wk, xn, k);
        mm(acts, &layer.wv, xn, v);
        for (out, b) in [
            (&mut *q, &layer.bq),
            (&mut *k, &layer.bk),
            (&mut *v, &layer.bv),
        ] {
            if let Some(b) = b {
                b.decode_vector(image, bias);
                add_bias(out, bias);
            }
        }
        rope.apply(q, cfg.heads, head_dim, cfg.rope_style);
        rope.apply(k, cfg.kv_heads, head_dim, cfg.rope_style);
        kv.store(l, pos0, k, v);

        // Attention, split over (token, KV head, slice of the query heads sharing that KV
        // head): a slice attends all its heads at once, reading each K/V row once. Groups
        // are sliced only as far as needed to give every thread work (decode has
        // `kv_heads` items per token).
        {
            let kv_ref: &dyn KvCache = kv;
            let writer = DisjointOut::new(attn);
            let q = &*q;
            let pairs = n_tokens * cfg.kv_heads;
            let per_slice = group.div_ceil(pool.threads().div_ceil(pairs).clamp(1, group));
            let slices = group.div_ceil(per_slice);
            pool.for_chunks(pairs * slices, 1, &|range| {
                SCORES.with(|scores| {
                    let mut scores = scores.borrow_mut();
                    for item in range {
                        let (t, rest) = (
                            item / (cfg.kv_heads * slices),
                            item % (cfg.kv_heads * slices),
                        );
                        let (g, s) = (rest / slices, rest % slices);
                        let h0 = g * group + s * per_slice;
                        let h1 = (h0 + per_slice).min((g + 1) * group);
                        let n_ctx = pos0 + t + 1;
                        if scores.len() < (h1 - h0) * n_ctx {
                            scores.resize((h1 - h0) * n_ctx, 0.0);
                        }
                        let at = t * q_len + h0 * head_dim;
                        let end = t * q_len + h1 * head_dim;
                        // SAFETY: each (token, KV head, slice) item is visited once and owns
                        // the disjoint output range of its query heads, [at, end).
                        let out = unsafe { writer.slice(at..end) };
                        kv_ref.attend(l, g, &q[at..end], n_ctx, scale, out, &mut scores);
                    }
                });
            });
        }
        acts.reset();
        mm(acts, &layer.wo, attn, proj);
        add_into(x, proj);

        layer.ffn_norm.decode_vector(image, norm);
        rms_norm(x, norm, cfg.rms_eps, xn);
        acts.reset();
        mm(acts, &layer.w_gate, xn, gate);
        mm(acts, &layer.w_up, xn, up);
        swiglu(pool, gate, up);
        acts.reset();
        mm(acts, &layer.w_down, gate, proj);
        add_into(x, proj);
    }
}

pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &w) in o.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `gate[i] = silu(gate[i]) · up[i]`, in chunks spread over the pool (each element computed
/// the same way whatever the split).
fn swiglu(pool: &ThreadPool, gate: &mut [f32], up: &[f32]) {
    const CHUNK: usize = 4096;
    let writer = DisjointOut::new(gate);
    pool.for_chunks(up.len(), CHUNK, &|range| {
        // SAFETY: `for_chunks` hands every index range to exactly one call, so the slices
        // written concurrently are disjoint.
        let g = unsafe { writer.slice(range.clone()) };
        for (g, &u) in g.iter_mut().zip(&up[range]) {
            *g = silu(*g) * u;
        }
    });
}

fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_into(row, bias);
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// cos/sin of every rotated pair at every position of a batch, with ggml's recurrence
/// `theta_{i+1} = theta_i · base^(-2/dims)` starting from `theta_0 = pos` in f32.
struct RopeTable {
    dims: usize,
    tokens: usize,
    /// `tokens × dims/2` (cos, sin) pairs.
    cos_sin: Vec<(f32, f32)>,
}

impl RopeTable {
    fn new(dims: usize, base: f32, pos0: usize, tokens: usize) -> RopeTable {
        let theta_scale = base.powf(-2.0 / dims as f32);
        let mut cos_sin = Vec::with_capacity(tokens * dims / 2);
        for t in 0..tokens {
            let mut theta = (pos0 + t) as f32;
            for _ in 0..dims / 2 {
                cos_sin.push((theta.cos(), theta.sin()));
                theta *= theta_scale;
            }
        }
        RopeTable {
            dims,
            tokens,
            cos_sin,
        }
    }

    /// Rotate the first `dims` values of each of `heads` heads in every token row of `x`.
    fn apply(&self, x: &mut [f32], heads: usize, head_dim: usize, style: RopeStyle) {
        let half = self.dims / 2;
        for t in 0..self.tokens {
            let cs = &self.cos_sin[t * half..(t + 1) * half];
            for h in 0..heads {
                let at = (t * heads + h) * head_dim;
                let head = &mut x[at..at + head_dim];
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (a, b) = match style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c - x1 * s;
                    head[b] = x0 * s + x1 * c;
                }
            }
        }
    }
}
