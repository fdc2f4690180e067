//! The decoder forward pass shared by `llama`, `qwen2`, `qwen3`, `gemma3` and `phi3`, following
//! llama.cpp's graphs op for op so results match it closely: RMSNorm (f64 sum of squares),
//! Q/K/V projections (+ qwen2 biases; qwen3's and gemma3's per-head q/k RMSNorm; phi3's fused
//! matrices arrive as row slices), RoPE in interleaved (llama) or NeoX style with ggml's
//! iterative angle recurrence, frequency factors and magnitude factor (Llama 3, Phi-3), and a
//! local base on gemma3's sliding-window layers, grouped-query attention through a [`KvCache`]
//! over every position or the layer's window, a gated feed-forward (SwiGLU or GeGLU), gemma3's
//! norms of both block outputs before their residual adds, and the output projection.
//!
//! One call ([`Model::forward_batch`]) is one *step* over a batch of sequences, each with its
//! own KV cache (a paged block table) and positions: decode rows of some sequences and prefill
//! chunks of others together, as continuous batching needs (llama.cpp's `llama_batch` names
//! the sequence of every row in the same way). Every weight matrix is read once per pass for
//! all rows; attention runs per row through its own sequence's cache. A long prompt can also
//! run *layer-major* (every pass through layer 0, then layer 1, …), bit-identical to pass
//! after pass, which lets all of it overlap a lazy load. Each matrix product quantizes its
//! input activations once (`QuantizedActs`) and splits weight rows across the thread pool;
//! attention is split over (row, head) pairs. Cost per step: one pass over every weight byte
//! (plus the output projection, once for all rows that want logits), and O(context × kv_len)
//! attention work per row and layer.

use airs_kernels::Isa;

use crate::error::{EngineError, EngineErrorKind};
use crate::kv::KvCache;
use crate::lines::LineBuf;
use crate::model::Model;
use crate::par::{
    DisjointOut, QuantizedActs, Upcoming, for_chunks_of, matmul, matmul_gated, matmuls, read_ahead,
};
use crate::pool::{Take, ThreadPool};
use airs_gguf::RopeStyle;

/// Most passes a step runs layer-major at once while weights load ([`Model::forward_batch`];
/// the runtime's scheduler gives a prompt that many passes per step then): it holds their
/// residual stream (`passes × pass_rows × n_embd` floats), which the scratch estimate
/// ([`crate::footprint`]) counts.
pub const LAYER_MAJOR_PASSES: usize = 4;

/// Which logits [`Model::forward`] returns.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (what generation needs).
    Last,
    /// Every token's, `tokens × vocab` (tests, perplexity).
    All,
}

/// What a batched forward pass returns for one of its sequences.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Nothing (a prefill chunk that does not reach the end of its prompt).
    Nothing,
    /// The last token's logits (`vocab` values).
    LastLogits,
    /// Every token's logits (`tokens × vocab`).
    AllLogits,
    /// Every token's final hidden state after the output norm (`tokens × n_embd`): what
    /// embeddings are pooled from.
    AllHidden,
}

impl From<Logits> for Output {
    fn from(l: Logits) -> Output {
        match l {
            Logits::Last => Output::LastLogits,
            Logits::All => Output::AllLogits,
        }
    }
}

/// One sequence of a batched forward pass: its tokens are computed at positions
/// `kv.len()..` of its own KV cache.
pub struct BatchSeq<'a> {
    pub kv: &'a mut dyn KvCache,
    pub tokens: &'a [u32],
    pub output: Output,
}

/// The outputs of a batched forward pass: sequence `i`'s values are
/// `values[ranges[i].clone()]` (empty for [`Output::Nothing`]). Several rows' logits start a few
/// floats into `values`, on a cache line.
#[derive(Clone, Debug, Default)]
pub struct BatchOutput {
    pub values: Vec<f32>,
    pub ranges: Vec<std::ops::Range<usize>>,
}

impl BatchOutput {
    /// Sequence `i`'s output values.
    pub fn get(&self, i: usize) -> &[f32] {
        &self.values[self.ranges[i].clone()]
    }
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

/// Prompt rows of one sequence attended together (their queries share every K/V row read).
const QUERY_BLOCK: usize = 16;

/// A thread's attention buffers: scores, and a block's queries and outputs made contiguous.
#[derive(Default)]
struct AttentionScratch {
    scores: Vec<f32>,
    queries: Vec<f32>,
    outs: Vec<f32>,
}

thread_local! {
    static ATTENTION_SCRATCH: std::cell::RefCell<AttentionScratch> =
        std::cell::RefCell::new(AttentionScratch::default());
}

/// The activation buffers of one pass of up to `rows` tokens, on cache lines (`crate::lines`).
struct PassScratch {
    xn: LineBuf,
    q: LineBuf,
    k: LineBuf,
    v: LineBuf,
    attn: LineBuf,
    proj: LineBuf,
    gate: LineBuf,
    up: LineBuf,
    acts: QuantizedActs,
    norm: Vec<f32>,
    bias: Vec<f32>,
}

impl PassScratch {
    fn new(cfg: &airs_gguf::ModelConfig, rows: usize) -> PassScratch {
        let f = |len: usize| LineBuf::zeroed(rows * len);
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

/// The rows of one sequence inside one pass: rows `row0..row0 + rope.tokens` of the pass are
/// its tokens at positions `pos0..`.
struct Segment {
    seq: usize,
    row0: usize,
    pos0: usize,
    rope: RopeTable,
    /// The table at the local layers' own base, for models whose sliding-window layers have
    /// one ([`airs_gguf::ModelConfig::layer_rope_base`]).
    rope_local: Option<RopeTable>,
}

/// One pass of a batch: up to `pass_rows` consecutive rows of the batch's residual stream.
struct Pass {
    /// First row of the pass in the batch.
    first: usize,
    rows: usize,
    segments: Vec<Segment>,
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

    /// [`Model::forward`] over `tokens` as consecutive passes of at most `pass_rows` tokens,
    /// computed *layer-major* ([`Model::forward_batch`]).
    pub fn forward_passes(
        &self,
        rt: &Runtime,
        kv: &mut dyn KvCache,
        tokens: &[u32],
        pass_rows: usize,
        logits: Logits,
    ) -> Result<Vec<f32>, EngineError> {
        let mut seqs = [BatchSeq {
            kv,
            tokens,
            output: logits.into(),
        }];
        let mut out = self.forward_batch(rt, &mut seqs, pass_rows)?;
        let wanted = out.ranges[0].clone();
        out.values.truncate(wanted.end);
        out.values.drain(..wanted.start);
        Ok(out.values)
    }

    /// One forward step over a batch of sequences, each with its own KV cache and positions:
    /// decode rows of some and prefill chunks of others together. Every weight matrix is read
    /// once per pass for all the rows; attention runs per sequence through its own cache.
    ///
    /// The rows of all sequences, in order, are split into consecutive passes of at most
    /// `pass_rows` rows, computed *layer-major*: layer 0 of every pass, then layer 1 of every
    /// pass, and so on. With one pass (the usual step) that is simply a forward pass over all
    /// the rows; with several, a layer's weights are used by every pass before the next layer's
    /// are needed, so while the weights are still loading (lazy or mmap) all of a long prompt
    /// overlaps the load, not only its first pass. It costs the residual stream of all rows
    /// (`rows × n_embd` floats) on top of one pass's scratch.
    ///
    /// Batch invariance: every matrix kernel gives a row the same bits whatever the rows it is
    /// computed with (`airs_kernels::matmul`), and norms, RoPE, attention and activations are
    /// per row, so a sequence's results do not depend on what it was batched with, on how its
    /// prompt was chunked, nor on the pass split.
    pub fn forward_batch(
        &self,
        rt: &Runtime,
        seqs: &mut [BatchSeq<'_>],
        pass_rows: usize,
    ) -> Result<BatchOutput, EngineError> {
        let mut out = BatchOutput::default();
        self.forward_batch_into(rt, seqs, pass_rows, &mut out)?;
        Ok(out)
    }

    /// [`Model::forward_batch`] into `out`, whose buffer is reused: a caller that steps many
    /// times (the scheduler) keeps one, and the logits (16 rows of a 152k vocabulary are
    /// 9.7 MB) are written over the last step's instead of into freshly zeroed memory. On
    /// error `out`'s contents are unspecified.
    pub fn forward_batch_into(
        &self,
        rt: &Runtime,
        seqs: &mut [BatchSeq<'_>],
        pass_rows: usize,
        out: &mut BatchOutput,
    ) -> Result<(), EngineError> {
        let cfg = &self.config;
        let n_rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if seqs.iter().any(|s| s.tokens.is_empty()) || n_rows == 0 {
            return Err(EngineError::invalid("forward pass over zero tokens"));
        }
        if pass_rows == 0 {
            return Err(EngineError::invalid("passes of zero tokens"));
        }
        for s in seqs.iter() {
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab_len) {
                return Err(EngineError::new(EngineErrorKind::TokenOutOfRange {
                    token: bad,
                    vocab_len: cfg.vocab_len,
                }));
            }
        }
        let pos0: Vec<usize> = seqs.iter().map(|s| s.kv.len()).collect();
        for (s, &p) in seqs.iter_mut().zip(&pos0) {
            s.kv.reserve(p + s.tokens.len())?;
        }

        let image = self.image().bytes();
        let pool = &rt.pool;
        let n_embd = cfg.embedding_len;

        // Residual stream: the embedding rows of every sequence's tokens, in order.
        let mut x = vec![0.0f32; n_rows * n_embd];
        let all_tokens = seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &tok) in x.chunks_exact_mut(n_embd).zip(all_tokens) {
            self.token_embd
                .dequantize_row(image, tok as usize, row)
                .map_err(|e| EngineError::bad_tensor("token_embd.weight", e.to_string()))?;
        }
        if let Some(scale) = cfg.embedding_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }

        let factors = self.rope_factors.as_ref().map(|f| {
            let mut v = Vec::new();
            f.decode_vector(image, &mut v);
            v.truncate(cfg.rope_dims / 2);
            v
        });
        let rope = RopeParams {
            dims: cfg.rope_dims,
            factors: factors.as_deref(),
            attn_factor: cfg.rope_attn_factor,
        };

        // Passes of at most `pass_rows` rows, each made of the segments of the sequences it
        // covers.
        let seq_first: Vec<usize> = seqs
            .iter()
            .scan(0, |at, s| {
                let first = *at;
                *at += s.tokens.len();
                Some(first)
            })
            .collect();
        let passes: Vec<Pass> = (0..n_rows)
            .step_by(pass_rows)
            .map(|first| {
                let end = (first + pass_rows).min(n_rows);
                let segments = (0..seqs.len())
                    .filter_map(|i| {
                        let (a, b) = (seq_first[i], seq_first[i] + seqs[i].tokens.len());
                        let (lo, hi) = (a.max(first), b.min(end));
                        (lo < hi).then(|| {
                            let pos = pos0[i] + (lo - a);
                            Segment {
                                seq: i,
                                row0: lo - first,
                                pos0: pos,
                                rope: RopeTable::new(&rope, cfg.rope_base, pos, hi - lo),
                                rope_local: cfg
                                    .sliding_window
                                    .and_then(|w| w.local_rope_base)
                                    .map(|base| RopeTable::new(&rope, base, pos, hi - lo)),
                            }
                        })
                    })
                    .collect();
                Pass {
                    first,
                    rows: end - first,
                    segments,
                }
            })
            .collect();
        let mut scratch = PassScratch::new(cfg, pass_rows.min(n_rows));
        // The rows whose logits the output matrix computes after the last layer.
        let logit_count: usize = seqs
            .iter()
            .map(|s| match s.output {
                Output::LastLogits => 1,
                Output::AllLogits => s.tokens.len(),
                Output::Nothing | Output::AllHidden => 0,
            })
            .sum();
        let output = [&self.output];
        for (l, layer) in self.layers.iter().enumerate() {
            self.image().enter_layer(l);
            for (p, pass) in passes.iter().enumerate() {
                // What the pool reads after this pass's last product: the next pass's q, k
                // and v (this layer's or the next's), or the output matrix.
                let next_layer = if p + 1 < passes.len() {
                    Some((layer, passes[p + 1].rows))
                } else {
                    self.layers.get(l + 1).map(|next| (next, passes[0].rows))
                };
                let after = match next_layer {
                    Some((next, rows)) => {
                        let qkv = [&next.wq, &next.wk, &next.wv];
                        read_ahead(pool, rt.isa, image, rows, &Upcoming::Products(&qkv))
                    }
                    None if logit_count > 0 => read_ahead(
                        pool,
                        rt.isa,
                        image,
                        logit_count,
                        &Upcoming::Products(&output),
                    ),
                    None => Vec::new(),
                };
                let x_pass = &mut x[pass.first * n_embd..(pass.first + pass.rows) * n_embd];
                self.layer_pass(rt, seqs, l, layer, x_pass, pass, &after, &mut scratch);
            }
        }
        if let Some(e) = self.image().load_error() {
            return Err(EngineError::new(EngineErrorKind::Load(e)));
        }

        // Output norm (and projection) of the rows whose outputs are wanted, all sequences'
        // together: the output matrix is read once for the whole batch.
        let mut logit_rows: Vec<usize> = Vec::new();
        let mut hidden_rows: Vec<usize> = Vec::new();
        let mut wanted: Vec<(Output, usize, usize)> = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter().enumerate() {
            let (first, n) = (seq_first[i], s.tokens.len());
            let rows: Vec<usize> = match s.output {
                Output::Nothing => Vec::new(),
                Output::LastLogits => vec![first + n - 1],
                Output::AllLogits | Output::AllHidden => (first..first + n).collect(),
            };
            let list = if s.output == Output::AllHidden {
                &mut hidden_rows
            } else {
                &mut logit_rows
            };
            wanted.push((s.output, list.len(), rows.len()));
            list.extend(rows);
        }
        self.output_norm.decode_vector(image, &mut scratch.norm);
        let normed = |rows: &[usize]| {
            let mut xo = vec![0.0f32; rows.len() * n_embd];
            for (o, &r) in xo.chunks_exact_mut(n_embd).zip(rows) {
                rms_norm(
                    &x[r * n_embd..(r + 1) * n_embd],
                    &scratch.norm,
                    cfg.rms_eps,
                    o,
                );
            }
            xo
        };
        let vocab = cfg.vocab_len;
        // The logits first, written over whatever `out` held (only a grown tail is zeroed).
        // Several rows' logits start `pad` floats in, on a cache line, so that they leave the
        // product with streaming stores (`crate::lines`); one row's, the usual decode step of
        // one sequence, start at 0 (its stores are ordinary ones).
        let logits_len = logit_rows.len() * vocab;
        let most = logits_len + 15;
        if out.values.capacity() < most {
            out.values.reserve(most - out.values.len());
        }
        let pad = if logit_rows.len() > 1 {
            out.values.as_ptr().align_offset(64).min(15)
        } else {
            0
        };
        let hidden_at = pad + logits_len;
        out.values.truncate(hidden_at);
        out.values.resize(hidden_at, 0.0);
        if !logit_rows.is_empty() {
            let xo = normed(&logit_rows);
            let acts = &mut scratch.acts;
            acts.reset();
            acts.encode(pool, &self.output, &xo);
            let mut product = acts.product(&self.output, &mut out.values[pad..]);
            matmul(pool, rt.isa, image, logit_rows.len(), &mut product, &[]);
        }
        if !hidden_rows.is_empty() {
            out.values.extend_from_slice(&normed(&hidden_rows));
        }
        out.ranges.clear();
        for (output, at, rows) in wanted {
            out.ranges.push(match output {
                Output::Nothing => 0..0,
                Output::AllHidden => hidden_at + at * n_embd..hidden_at + (at + rows) * n_embd,
                _ => pad + at * vocab..pad + (at + rows) * vocab,
            });
        }
        for (s, &p) in seqs.iter_mut().zip(&pos0) {
            s.kv.set_len(p + s.tokens.len());
        }
        Ok(())
    }

    /// Layer `l` for one pass: each segment's rows of `x` are its sequence's tokens at positions
    /// `pos0..`; their keys and values are stored in that sequence's cache (whose earlier
    /// positions of layer `l` must be there). `after`: what each thread reads first in the
    /// pool job after the pass ([`read_ahead`]). Each product's threads prefetch the start of
    /// the next one while they wait at its end.
    #[allow(clippy::too_many_arguments)]
    fn layer_pass(
        &self,
        rt: &Runtime,
        seqs: &mut [BatchSeq<'_>],
        l: usize,
        layer: &crate::model::LayerWeights,
        x: &mut [f32],
        pass: &Pass,
        after: &[crate::pool::ReadAhead],
        s: &mut PassScratch,
    ) {
        let cfg = &self.config;
        let image = self.image().bytes();
        let pool = &rt.pool;
        let n_tokens = pass.rows;
        let (q_len, kv_len, head_dim) = (cfg.q_len(), cfg.kv_len(), cfg.head_dim);
        let group = cfg.heads / cfg.kv_heads;
        let scale = cfg.attention_scale;
        let window = cfg.layer_window(l);
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

        let ahead = |next: Upcoming<'_>| read_ahead(pool, rt.isa, image, n_tokens, &next);
        let after_qkv = ahead(Upcoming::Products(&[&layer.wo]));
        let after_wo = ahead(Upcoming::Gated(&layer.w_gate, &layer.w_up));
        let after_gated = ahead(Upcoming::Products(&[&layer.w_down]));

        layer.attn_norm.decode_vector(image, norm);
        rms_norm(x, norm, cfg.rms_eps, xn);
        acts.reset();
        for w in [&layer.wq, &layer.wk, &layer.wv] {
            acts.encode(pool, w, xn);
        }
        matmuls(
            pool,
            rt.isa,
            image,
            n_tokens,
            vec![
                acts.product(&layer.wq, &mut *q),
                acts.product(&layer.wk, &mut *k),
                acts.product(&layer.wv, &mut *v),
            ],
            &after_qkv,
        );
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
        for (out, w) in [(&mut *q, &layer.q_norm), (&mut *k, &layer.k_norm)] {
            if let Some(w) = w {
                // Per head: the weight has `head_dim` values.
                w.decode_vector(image, norm);
                rms_norm_in_place(out, norm, cfg.rms_eps);
            }
        }
        // RoPE and the K/V store, one job over the pass's segments (one per sequence): a
        // decode step's stores write into blocks last touched a step earlier, long evicted,
        // so each waits on memory; on one thread they took 2-3 % of a 16-sequence step
        // (Qwen2.5-0.5B, timed per phase), about half of it with two.
        {
            let (q_out, k_out) = (DisjointOut::new(&mut *q), DisjointOut::new(&mut *k));
            let seq_out = DisjointOut::new(&mut *seqs);
            let v = &*v;
            pool.for_chunks(pass.segments.len(), 1, &|range| {
                for seg in &pass.segments[range] {
                    let rows = seg.row0..seg.row0 + seg.rope.tokens;
                    // SAFETY: the segments of a pass cover disjoint rows, one sequence each,
                    // and `for_chunks` hands every segment to one call.
                    let (qs, ks, seq) = unsafe {
                        (
                            q_out.slice(rows.start * q_len..rows.end * q_len),
                            k_out.slice(rows.start * kv_len..rows.end * kv_len),
                            &mut seq_out.slice(seg.seq..seg.seq + 1)[0],
                        )
                    };
                    let rope = match &seg.rope_local {
                        Some(local) if cfg.layer_rope_base(l) != cfg.rope_base => local,
                        _ => &seg.rope,
                    };
                    rope.apply(qs, cfg.heads, head_dim, cfg.rope_style);
                    rope.apply(ks, cfg.kv_heads, head_dim, cfg.rope_style);
                    let vs = &v[rows.start * kv_len..rows.end * kv_len];
                    seq.kv.store(l, seg.pos0, ks, vs);
                }
            });
        }

        // Attention, split over (block of rows, KV head, slice of the query heads sharing that
        // KV head): a slice attends all its heads at once, reading each K/V row once, through
        // the cache of the rows' sequence. A block is one row, or up to `QUERY_BLOCK`
        // consecutive rows of one sequence's prompt chunk under full attention, whose queries
        // then share every row read (`KvCache::attend_queries`). Groups are sliced only as far
        // as needed to give every thread work (decode has `kv_heads` items per token).
        {
            let caches: Vec<&dyn KvCache> = seqs.iter().map(|s| &*s.kv).collect();
            // Block → (sequence, first row, rows, position of its last row).
            let mut blocks: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(n_tokens);
            for seg in &pass.segments {
                let (tokens, end) = (seg.rope.tokens, seg.pos0 + seg.rope.tokens);
                // Under a sliding window the rows' positions must all start at 0.
                let size = if window.is_none_or(|w| end <= w) {
                    QUERY_BLOCK
                } else {
                    1
                };
                for b0 in (0..tokens).step_by(size) {
                    let rows = size.min(tokens - b0);
                    let row0 = seg.row0 + b0;
                    blocks.push((seg.seq, row0, rows, seg.pos0 + b0 + rows - 1));
                }
            }
            let writer = DisjointOut::new(attn);
            let q = &*q;
            let pairs = blocks.len() * cfg.kv_heads;
            let per_slice = group.div_ceil(pool.threads().div_ceil(pairs).clamp(1, group));
            let slices = group.div_ceil(per_slice);
            // What the job does: each block reads its K and V rows (2-byte elements or fewer)
            // once, and each of its rows' query heads dots and adds them.
            let kv_row_bytes = 2 * 2 * cfg.kv_heads * head_dim;
            let work = blocks
                .iter()
                .map(|&(_, _, rows, last)| {
                    let positions = last + 1;
                    let f32_macs = rows * positions * cfg.heads * head_dim * 2;
                    crate::par::Work::attention(positions * kv_row_bytes, f32_macs)
                })
                .sum();
            let (items, ahead) = (pairs * slices, &after_qkv);
            for_chunks_of(pool, items, 1, Take::OneByOne, work, ahead, &|range| {
                ATTENTION_SCRATCH.with(|scratch| {
                    let mut scratch = scratch.borrow_mut();
                    let AttentionScratch {
                        scores,
                        queries: qbuf,
                        outs: obuf,
                    } = &mut *scratch;
                    for item in range {
                        let (b, rest) = (
                            item / (cfg.kv_heads * slices),
                            item % (cfg.kv_heads * slices),
                        );
                        let (g, s) = (rest / slices, rest % slices);
                        let h0 = g * group + s * per_slice;
                        let h1 = (h0 + per_slice).min((g + 1) * group);
                        let (seq, row0, rows, last) = blocks[b];
                        let n_ctx = last + 1;
                        // The last row's positions (a block of several starts at 0).
                        let positions = window.map_or(0, |w| n_ctx.saturating_sub(w))..n_ctx;
                        let width = (h1 - h0) * head_dim;
                        let at = |t: usize| t * q_len + h0 * head_dim;
                        let needed = rows * (h1 - h0) * positions.len();
                        if scores.len() < needed {
                            scores.resize(needed, 0.0);
                        }
                        let cache = caches[seq];
                        if rows == 1 {
                            // SAFETY: each (block, KV head, slice) item is visited once and
                            // owns the disjoint output range of its rows' query heads.
                            let out = unsafe { writer.slice(at(row0)..at(row0) + width) };
                            let qh = &q[at(row0)..at(row0) + width];
                            cache.attend(l, g, qh, positions, scale, out, scores);
                            continue;
                        }
                        // Several rows: their queries and outputs made contiguous.
                        qbuf.clear();
                        for t in row0..row0 + rows {
                            qbuf.extend_from_slice(&q[at(t)..at(t) + width]);
                        }
                        obuf.resize(rows * width, 0.0);
                        cache.attend_queries(l, g, qbuf, rows, positions, scale, obuf, scores);
                        for (t, o) in (row0..row0 + rows).zip(obuf.chunks_exact(width)) {
                            // SAFETY: as above; the block's rows are its own.
                            unsafe { writer.slice(at(t)..at(t) + width) }.copy_from_slice(o);
                        }
                    }
                });
            });
        }
        acts.reset();
        acts.encode(pool, &layer.wo, attn);
        let product = &mut acts.product(&layer.wo, proj);
        matmul(pool, rt.isa, image, n_tokens, product, &after_wo);
        if let Some(w) = &layer.post_attn_norm {
            w.decode_vector(image, norm);
            rms_norm_in_place(proj, norm, cfg.rms_eps);
        }
        add_into(x, proj);

        layer.ffn_norm.decode_vector(image, norm);
        rms_norm(x, norm, cfg.rms_eps, xn);
        acts.reset();
        for w in [&layer.w_gate, &layer.w_up] {
            acts.encode(pool, w, xn);
        }
        let activation = cfg.ffn_activation;
        matmul_gated(
            pool,
            rt.isa,
            image,
            n_tokens,
            acts.product(&layer.w_gate, &mut *gate),
            acts.product(&layer.w_up, &mut *up),
            &|g, u| airs_kernels::gated(rt.isa, activation, g, u),
            &after_gated,
        );
        acts.reset();
        acts.encode(pool, &layer.w_down, gate);
        let product = &mut acts.product(&layer.w_down, proj);
        matmul(pool, rt.isa, image, n_tokens, product, after);
        if let Some(w) = &layer.post_ffn_norm {
            w.decode_vector(image, norm);
            rms_norm_in_place(proj, norm, cfg.rms_eps);
        }
        add_into(x, proj);
    }
}

pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (rows, outs) in x.chunks(RMS_ROWS * n).zip(out.chunks_mut(RMS_ROWS * n)) {
        let scales = rms_scales(rows, n, eps);
        for ((row, o), scale) in rows
            .chunks_exact(n)
            .zip(outs.chunks_exact_mut(n))
            .zip(scales)
        {
            for ((o, &v), &w) in o.iter_mut().zip(row).zip(weight) {
                *o = v * scale * w;
            }
        }
    }
}

/// Rows whose sums of squares [`rms_scales`] runs side by side.
const RMS_ROWS: usize = 8;

/// `1/√(mean(row²) + eps)` of each row of `n` values of `rows` (at most [`RMS_ROWS`]). Each
/// row's sum of squares is ggml's `rms_norm` sum, in f64 value after value (the same bits);
/// that makes it one chain of dependent adds, 4 cycles each, so the rows run their chains side
/// by side (16 rows of TinyLlama's 2048 values, one after another, took ~1.5 ms of a batched
/// step).
fn rms_scales(rows: &[f32], n: usize, eps: f32) -> impl Iterator<Item = f32> {
    let count = rows.len() / n;
    debug_assert!(count <= RMS_ROWS);
    let mut sums = [0f64; RMS_ROWS];
    for i in 0..n {
        for (r, sum) in sums.iter_mut().enumerate().take(count) {
            let v = rows[r * n + i];
            *sum += f64::from(v * v);
        }
    }
    sums.into_iter().take(count).map(move |sum| {
        let mean = (sum / n as f64) as f32;
        1.0 / (mean + eps).sqrt()
    })
}

/// [`rms_norm`] of every `weight.len()` values of `x`, in place (the same operations).
fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    for rows in x.chunks_mut(RMS_ROWS * n) {
        let mut scales = [0f32; RMS_ROWS];
        for (s, scale) in scales.iter_mut().zip(rms_scales(rows, n, eps)) {
            *s = scale;
        }
        for (row, scale) in rows.chunks_exact_mut(n).zip(scales) {
            for (v, &w) in row.iter_mut().zip(weight) {
                *v = *v * scale * w;
            }
        }
    }
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

/// What every RoPE table of a model shares: rotated dimensions, frequency factors (`dims/2`
/// values, or none) and the cos/sin magnitude factor.
struct RopeParams<'a> {
    dims: usize,
    factors: Option<&'a [f32]>,
    attn_factor: f32,
}

/// cos/sin of every rotated pair at every position of a batch, with ggml's recurrence
/// `theta_{i+1} = theta_i · base^(-2/dims)` starting from `theta_0 = pos` in f32; pair `i`'s
/// angle divided by its frequency factor and cos/sin scaled by the attention factor, as ggml's
/// `rope_yarn` does without extrapolation mixing.
struct RopeTable {
    dims: usize,
    tokens: usize,
    /// `tokens × dims/2` (cos, sin) pairs.
    cos_sin: Vec<(f32, f32)>,
}

impl RopeTable {
    fn new(p: &RopeParams<'_>, base: f32, pos0: usize, tokens: usize) -> RopeTable {
        let dims = p.dims;
        let theta_scale = base.powf(-2.0 / dims as f32);
        let mut cos_sin = Vec::with_capacity(tokens * dims / 2);
        for t in 0..tokens {
            let mut theta = (pos0 + t) as f32;
            for i in 0..dims / 2 {
                let angle = match p.factors {
                    Some(f) => theta / f[i],
                    None => theta,
                };
                // × 1.0 (every model without LongRoPE) is exact.
                cos_sin.push((angle.cos() * p.attn_factor, angle.sin() * p.attn_factor));
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
    ///
    /// The style is matched once per head, not per pair, so each loop runs over plain slices
    /// and compiles to vector code (the same multiplies and adds per pair, in the same order:
    /// the same bits). With the match inside, it stayed scalar: 16 tokens of Qwen2.5-0.5B took
    /// ~14 µs a layer, about 1 % of a 16-sequence decode step (profiled).
    fn apply(&self, x: &mut [f32], heads: usize, head_dim: usize, style: RopeStyle) {
        let half = self.dims / 2;
        let rotate = |x0: f32, x1: f32, (c, s): (f32, f32)| (x0 * c - x1 * s, x0 * s + x1 * c);
        for t in 0..self.tokens {
            let cs = &self.cos_sin[t * half..(t + 1) * half];
            for h in 0..heads {
                let at = (t * heads + h) * head_dim;
                let head = &mut x[at..at + head_dim];
                match style {
                    RopeStyle::Interleaved => {
                        for (pair, &cs) in head.chunks_exact_mut(2).zip(cs) {
                            (pair[0], pair[1]) = rotate(pair[0], pair[1], cs);
                        }
                    }
                    RopeStyle::Neox => {
                        let (lo, hi) = head[..self.dims].split_at_mut(half);
                        for ((a, b), &cs) in lo.iter_mut().zip(hi.iter_mut()).zip(cs) {
                            (*a, *b) = rotate(*a, *b, cs);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `rms_norm` of one row: the squares summed in f64 value after value.
    fn reference(row: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
        let mut sum = 0f64;
        for &v in row {
            sum += f64::from(v * v);
        }
        let scale = 1.0 / ((sum / row.len() as f64) as f32 + eps).sqrt();
        row.iter()
            .zip(weight)
            .map(|(&v, &w)| v * scale * w)
            .collect()
    }

    #[test]
    fn rows_normalized_side_by_side_equal_each_row_alone_bit_for_bit() {
        let n = 67;
        let weight: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 / 64.0).collect();
        // 19 rows (two full groups and a partial one) of values spread over many exponents,
        // where the order of the f64 additions shows in the last bits.
        let x: Vec<f32> = (0..19 * n)
            .map(|i| {
                let s = (i as f32 * 0.618).sin();
                s * 10f32.powi((i % 9) as i32 - 4)
            })
            .collect();
        let expected: Vec<f32> = x
            .chunks_exact(n)
            .flat_map(|row| reference(row, &weight, 1e-6))
            .collect();
        let mut out = vec![0.0; x.len()];
        rms_norm(&x, &weight, 1e-6, &mut out);
        let mut in_place = x.clone();
        rms_norm_in_place(&mut in_place, &weight, 1e-6);
        for (got, want) in [(&out, &expected), (&in_place, &expected)] {
            let (g, w): (Vec<u32>, Vec<u32>) = (
                got.iter().map(|v| v.to_bits()).collect(),
                want.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(g, w);
        }
    }

    #[test]
    fn rope_rotates_every_pair_as_the_per_pair_formula_bit_for_bit() {
        // Partial rotation (dims < head_dim, as Phi's) and full, both pair styles.
        for (dims, head_dim) in [(64, 64), (32, 80)] {
            let p = RopeParams {
                dims,
                factors: None,
                attn_factor: 1.0,
            };
            let (heads, tokens) = (3, 5);
            let table = RopeTable::new(&p, 10_000.0, 7, tokens);
            let x: Vec<f32> = (0..tokens * heads * head_dim)
                .map(|i| (i as f32 * 0.37).sin() * 3.0)
                .collect();
            for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
                let mut expected = x.clone();
                let half = dims / 2;
                for t in 0..tokens {
                    for h in 0..heads {
                        let head = &mut expected[(t * heads + h) * head_dim..][..head_dim];
                        for i in 0..half {
                            let (c, s) = table.cos_sin[t * half + i];
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
                let mut got = x.clone();
                table.apply(&mut got, heads, head_dim, style);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&got), bits(&expected), "{style:?} dims {dims}");
                assert_ne!(bits(&got), bits(&x), "something rotated");
            }
        }
    }
}
