//! Perplexity over a text and KL divergence against a reference engine's next-token
//! distributions: the field's measure of "does this implementation compute the same model"
//! (llama.cpp's `llama-perplexity --kl-divergence`, quoted by its and ik_llama.cpp's users for
//! every quantization).
//!
//! The protocol is llama-perplexity's, which the references in `testdata/reference` follow
//! (made with `shared/tools/dump_topk.cpp`): the text is tokenized without a chat template and
//! without parsing special tokens, with BOS where the model's metadata asks for it
//! ([`tokenize`]); the tokens are cut into consecutive chunks of `ctx`; where the model adds
//! BOS, each chunk's first token is replaced by BOS; every chunk is evaluated from an empty KV
//! cache; positions `ctx/2 .. ctx-2` of each chunk are scored (they predict tokens
//! `ctx/2+1 .. ctx-1`), so every scored prediction sees at least `ctx/2` tokens of context.
//!
//! With a reference ([`KldReference`]: the reference engine's top-K log-probabilities at every
//! scored position), each position's KL(P_ref ‖ P_airs) is taken over the reference's top-K
//! tokens plus one tail bucket: Σ_top p_i (log p_i − log q_i) + p_tail log(p_tail / q_tail),
//! p_tail = 1 − Σ_top p_i, q_tail = 1 − Σ_top q_i, both clamped at 1e-12 (a lower bound of the
//! exact divergence, ≈ 0.8× of it on Qwen). Reported: its mean, median, 99th percentile and
//! maximum, top-1 agreement and the mean |p_airs − p_ref| of the reference's top token.
//!
//! How a chunk runs: the first half (context only) in one forward call that returns nothing,
//! then the scored half in calls of [`SCORED_ROWS_PER_CALL`] rows returning every row's logits.
//! The kernels are batch-invariant (`airs_engine::Model::forward_batch`), so the split gives
//! the bits one pass over the chunk would, while the logits held at once are
//! `SCORED_ROWS_PER_CALL × vocab` floats (78 MB for Qwen's 151,936 tokens) instead of
//! llama-perplexity's `ctx × vocab`.
//!
//! Memory: a paged KV pool of one chunk (`ctx` positions) and the scratch of a call, both
//! charged to the model pool first, as a scheduler's are. Cost: one forward pass over every
//! chunk's `ctx − 1` tokens, and one log-softmax (an `exp` per vocabulary entry) per scored
//! position.

use std::time::{Duration, Instant};

use airs_engine::footprint::Scratch;
use airs_engine::{BatchOutput, BatchSeq, KvType, Output, PagedKv, PagedKvConfig, PagedKvPool};
use airs_memory::PoolUse;
use airs_tokenizer::EncodeOptions;
use serde::Deserialize;

use crate::error::{Result, RuntimeError, RuntimeErrorKind};
use crate::model::LoadedModel;

/// Scored rows per forward call: bounds the logits held at once (see the module docs).
pub const SCORED_ROWS_PER_CALL: usize = 128;
/// The smallest chunk: one context token and two scored positions.
pub const MIN_CTX: usize = 4;
/// Both tails of the KL divergence are clamped at this.
const TAIL_FLOOR: f64 = 1e-12;

/// The token ids of a text as llama-perplexity tokenizes it: BOS as the model's metadata says,
/// special tokens not parsed (a text that contains `<|im_end|>` is text).
pub fn tokenize(model: &LoadedModel, text: &str) -> Vec<u32> {
    let tok = &model.tokenizer;
    let options = EncodeOptions {
        add_bos: tok.add_bos(),
        parse_special: false,
    };
    tok.encode(text, options)
        .into_iter()
        .map(u32::from)
        .collect()
}

/// What to evaluate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerplexityConfig {
    /// Tokens per chunk (llama-perplexity's `--ctx-size`).
    pub ctx: usize,
    /// At most this many chunks (default: every whole chunk of the text, or the reference's).
    pub chunks: Option<usize>,
    pub kv_type: KvType,
}

impl PerplexityConfig {
    pub fn new(ctx: usize, kv_type: KvType) -> PerplexityConfig {
        PerplexityConfig {
            ctx,
            chunks: None,
            kv_type,
        }
    }
}

/// A reference engine's next-token distributions over a text (the format of
/// `testdata/reference/*.kld-*.json`; see its README).
#[derive(Clone, Debug, Deserialize)]
pub struct KldReference {
    /// The model file the reference was made with.
    pub model: String,
    pub n_vocab: usize,
    pub n_ctx: usize,
    /// The reference engine's KV cache type (`f16`, `f32`).
    pub kv_type: String,
    pub add_bos: bool,
    pub top_k: usize,
    /// The whole text as the reference engine tokenized it.
    pub text_token_ids: Vec<u32>,
    pub chunks: Vec<ReferenceChunk>,
}

/// One evaluated chunk of a reference.
#[derive(Clone, Debug, Deserialize)]
pub struct ReferenceChunk {
    /// Index of the chunk's first token in `text_token_ids`.
    pub start: usize,
    /// The first scored position inside the chunk (`n_ctx / 2`).
    pub first_scored: usize,
    pub positions: Vec<ReferencePosition>,
}

/// The reference's distribution at one scored position.
#[derive(Clone, Debug, Deserialize)]
pub struct ReferencePosition {
    /// The token that actually follows.
    pub next: u32,
    pub next_logprob: f64,
    pub entropy: f64,
    /// The `top_k` most likely tokens, most likely first: `[id, logprob]`.
    pub top: Vec<(u32, f64)>,
}

/// Why a reference cannot be used for a run: malformed, or made under another protocol,
/// tokenization or model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KldReferenceError {
    #[error("the reference is not a KLD reference file: {0}")]
    Parse(serde_json::Error),
    #[error("the reference is inconsistent: {0}")]
    Malformed(String),
    #[error("the reference was made for a vocabulary of {reference} tokens; the model has {model}")]
    Vocabulary { reference: usize, model: usize },
    #[error("the reference was made with chunks of {reference} tokens; this run uses {run}")]
    Context { reference: usize, run: usize },
    #[error(
        "the reference tokenized the text differently: {reference_len} tokens there, \
         {our_len} here, first difference at token {index} ({reference_id:?} there, \
         {our_id:?} here)"
    )]
    Tokens {
        index: usize,
        reference_id: Option<u32>,
        our_id: Option<u32>,
        reference_len: usize,
        our_len: usize,
    },
}

impl From<KldReferenceError> for RuntimeError {
    fn from(e: KldReferenceError) -> RuntimeError {
        RuntimeError::new(RuntimeErrorKind::KldReference(e))
    }
}

impl KldReference {
    /// Parses a reference file and checks that it adds up: chunks of `n_ctx` tokens at
    /// consecutive starts inside the text, scored positions `n_ctx/2 .. n_ctx-2` whose `next`
    /// is the text's token, `top_k` entries of vocabulary ids at each.
    pub fn parse(bytes: &[u8]) -> Result<KldReference, KldReferenceError> {
        let r: KldReference = serde_json::from_slice(bytes).map_err(KldReferenceError::Parse)?;
        let bad = |m: String| Err(KldReferenceError::Malformed(m));
        if r.n_ctx < MIN_CTX {
            return bad(format!("n_ctx {} is below {MIN_CTX}", r.n_ctx));
        }
        if r.top_k == 0 || r.top_k > r.n_vocab {
            return bad(format!(
                "top_k {} of a {}-token vocabulary",
                r.top_k, r.n_vocab
            ));
        }
        let scored = scored_positions(r.n_ctx);
        for (c, chunk) in r.chunks.iter().enumerate() {
            let expected = c.checked_mul(r.n_ctx);
            let end = chunk.start.checked_add(r.n_ctx);
            if Some(chunk.start) != expected || end.is_none_or(|e| e > r.text_token_ids.len()) {
                return bad(format!(
                    "chunk {c} starts at {} (expected {c} × {}) in a text of {} tokens",
                    chunk.start,
                    r.n_ctx,
                    r.text_token_ids.len()
                ));
            }
            if chunk.first_scored != r.n_ctx / 2 || chunk.positions.len() != scored.len() {
                return bad(format!(
                    "chunk {c} scores {} positions from {} (expected {} from {})",
                    chunk.positions.len(),
                    chunk.first_scored,
                    scored.len(),
                    r.n_ctx / 2
                ));
            }
            for (p, i) in chunk.positions.iter().zip(scored.clone()) {
                let next = r.text_token_ids[chunk.start + i + 1];
                if p.next != next {
                    return bad(format!(
                        "chunk {c} position {i}: next {} but the text has {next}",
                        p.next
                    ));
                }
                let logprob = |lp: f64| lp.is_finite() && lp <= 1e-6;
                if p.top.len() != r.top_k
                    || !logprob(p.next_logprob)
                    || p.top
                        .iter()
                        .any(|&(id, lp)| id as usize >= r.n_vocab || !logprob(lp))
                {
                    return bad(format!(
                        "chunk {c} position {i}: not log-probabilities (finite, at most 0) of \
                         {} vocabulary ids",
                        r.top_k
                    ));
                }
            }
        }
        Ok(r)
    }

    /// The reference's perplexity over the scored positions of its first `chunks` chunks.
    pub fn perplexity(&self, chunks: usize) -> f64 {
        let (sum, count) = self.chunks[..chunks.min(self.chunks.len())]
            .iter()
            .flat_map(|c| &c.positions)
            .fold((0.0, 0usize), |(s, n), p| (s - p.next_logprob, n + 1));
        (sum / count.max(1) as f64).exp()
    }
}

/// The scored positions of a chunk of `ctx` tokens (each predicts the token after it).
fn scored_positions(ctx: usize) -> std::ops::Range<usize> {
    ctx / 2..ctx - 1
}

/// Statistics of the per-position KL divergences, top-1 agreement and probability error.
#[derive(Clone, Debug, PartialEq)]
pub struct KldStats {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
    /// Fraction of positions (0..1) where airs's most likely token is the reference's.
    pub top1_agreement: f64,
    /// Mean |p_airs − p_ref| of the reference's most likely token.
    pub mean_abs_dp: f64,
    /// The reference's perplexity over the same positions.
    pub reference_perplexity: f64,
    /// Every position where airs's most likely token is not the reference's, in text order.
    pub disagreements: Vec<Disagreement>,
}

/// A scored position where airs's most likely next token is not the reference's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Disagreement {
    /// Index in the text of the token whose successor is predicted.
    pub position: usize,
    pub reference_top: u32,
    pub airs_top: u32,
    /// How much likelier the reference found its top token than airs's, in nats
    /// (`log p_ref(reference_top) − log p_ref(airs_top)`): a near-tie when small. A lower
    /// bound when airs's token is outside the reference's top K (then measured against the
    /// K-th).
    pub reference_margin: f64,
}

impl KldStats {
    /// The largest reference margin among the disagreements (0 when there are none): how
    /// confident the reference was where airs chose differently.
    pub fn max_disagreement_margin(&self) -> f64 {
        self.disagreements
            .iter()
            .map(|d| d.reference_margin)
            .fold(0.0, f64::max)
    }
}

/// The outcome of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct PerplexityReport {
    pub perplexity: f64,
    /// Scored positions.
    pub positions: usize,
    pub chunks: usize,
    pub ctx: usize,
    /// Tokens of the text (all chunks' and the remainder's).
    pub text_tokens: usize,
    /// Tokens run through the model (`ctx − 1` per chunk) per second of forward passes.
    pub tokens_per_s: f64,
    pub elapsed: Duration,
    pub kld: Option<KldStats>,
}

/// What one scored position contributes.
struct Scored {
    /// −log q(next).
    nll: f64,
    kld: Option<Divergence>,
}

/// One scored position against the reference.
#[derive(Clone, Copy, Debug)]
struct Divergence {
    /// KL(P_ref ‖ P_airs) over the reference's top tokens and the tail.
    kl: f64,
    /// |p_airs − p_ref| of the reference's most likely token.
    top_abs_dp: f64,
    /// Where airs's most likely token is not the reference's.
    disagreement: Option<Disagreement>,
}

impl Divergence {
    /// airs's most likely token is the reference's.
    fn top1_agrees(&self) -> bool {
        self.disagreement.is_none()
    }
}

/// Evaluates `tokens` (from [`tokenize`]) under `config`, against `reference` when given, and
/// calls `progress(chunks_done, chunks)` after every chunk.
pub fn evaluate(
    model: &LoadedModel,
    tokens: &[u32],
    config: &PerplexityConfig,
    reference: Option<&KldReference>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport> {
    let ctx = config.ctx;
    if ctx < MIN_CTX {
        return Err(RuntimeError::invalid(format!(
            "chunks of {ctx} tokens score nothing (at least {MIN_CTX})"
        )));
    }
    if ctx > model.context_len() {
        return Err(RuntimeError::invalid(format!(
            "chunks of {ctx} tokens exceed the model's context of {}",
            model.context_len()
        )));
    }
    let vocab = model.model.config.vocab_len;
    if let Some(r) = reference {
        check_reference(r, tokens, ctx, vocab)?;
    }
    let available = reference.map_or(tokens.len() / ctx, |r| r.chunks.len());
    let chunks = config.chunks.map_or(available, |c| c.min(available));
    if chunks == 0 {
        return Err(RuntimeError::invalid(format!(
            "the text has {} tokens: not one chunk of {ctx}",
            tokens.len()
        )));
    }

    let threads = model.runtime.pool.threads() as u64;
    let scratch = Scratch::for_batch(
        &model.shape,
        ctx as u64,
        threads,
        (ctx / 2) as u64,
        SCORED_ROWS_PER_CALL as u64,
    );
    let _scratch = model
        .pool()
        .charge(
            PoolUse::Scratch,
            scratch.total(),
            format!("perplexity passes of {}", model.name),
        )
        .map_err(|e| RuntimeError::new(RuntimeErrorKind::PoolFull(e)))?;
    let per_token = crate::fit::kv_bytes_per_token(&model.shape, config.kv_type)?;
    let kv_config = PagedKvConfig::new(
        ctx.next_multiple_of(airs_memory::DEFAULT_TOKENS_PER_BLOCK as usize) * per_token,
    );
    let kv_pool =
        PagedKvPool::new_charged(model.kv_shape(), config.kv_type, &kv_config, model.pool())?;

    let bos = model
        .tokenizer
        .bos_id()
        .filter(|_| model.tokenizer.add_bos());
    let scored_range = scored_positions(ctx);
    let mut scored = Vec::with_capacity(chunks * scored_range.len());
    let mut compute = Duration::ZERO;
    // One output buffer for every call: each call's logits are written over the last one's.
    let mut out = BatchOutput::default();
    for c in 0..chunks {
        let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(bos) = bos {
            chunk[0] = bos.into();
        }
        let started = Instant::now();
        // No salt: nothing is indexed, so every chunk starts from an empty cache.
        let mut kv = PagedKv::new_sequence(&kv_pool, None);
        let rt = &model.runtime;
        let pass = |kv: &mut PagedKv, rows: &[u32], output: Output, out: &mut BatchOutput| {
            let mut seqs = [BatchSeq {
                kv,
                tokens: rows,
                output,
            }];
            model
                .model
                .forward_batch_into(rt, &mut seqs, rows.len(), out)
        };
        pass(
            &mut kv,
            &chunk[..scored_range.start],
            Output::Nothing,
            &mut out,
        )?;
        for call_start in scored_range.clone().step_by(SCORED_ROWS_PER_CALL) {
            let call_end = (call_start + SCORED_ROWS_PER_CALL).min(scored_range.end);
            pass(
                &mut kv,
                &chunk[call_start..call_end],
                Output::AllLogits,
                &mut out,
            )?;
            for (row, i) in (call_start..call_end).enumerate() {
                let logits = &out.get(0)[row * vocab..(row + 1) * vocab];
                let position = reference.map(|r| &r.chunks[c].positions[i - scored_range.start]);
                scored.push(score(logits, chunk[i + 1], position, c * ctx + i));
            }
        }
        compute += started.elapsed();
        progress(c + 1, chunks);
    }

    let positions = scored.len();
    let nll: f64 = scored.iter().map(|s| s.nll).sum();
    let kld = reference.map(|r| {
        let terms: Vec<Divergence> = scored.iter().filter_map(|s| s.kld).collect();
        let disagreements = terms.iter().filter_map(|d| d.disagreement).collect();
        let mut divergences: Vec<f64> = terms.iter().map(|d| d.kl).collect();
        let agree = terms.iter().filter(|d| d.top1_agrees()).count();
        let dp: f64 = terms.iter().map(|d| d.top_abs_dp).sum();
        let n = divergences.len().max(1) as f64;
        let mean = divergences.iter().sum::<f64>() / n;
        divergences.sort_by(f64::total_cmp);
        KldStats {
            mean,
            median: quantile(&divergences, 0.5),
            p99: quantile(&divergences, 0.99),
            max: divergences.last().copied().unwrap_or(0.0),
            top1_agreement: agree as f64 / n,
            mean_abs_dp: dp / n,
            reference_perplexity: r.perplexity(chunks),
            disagreements,
        }
    });
    Ok(PerplexityReport {
        perplexity: (nll / positions as f64).exp(),
        positions,
        chunks,
        ctx,
        text_tokens: tokens.len(),
        tokens_per_s: (chunks * (ctx - 1)) as f64 / compute.as_secs_f64().max(1e-9),
        elapsed: compute,
        kld,
    })
}

fn check_reference(
    r: &KldReference,
    tokens: &[u32],
    ctx: usize,
    vocab: usize,
) -> Result<(), KldReferenceError> {
    if r.n_vocab != vocab {
        return Err(KldReferenceError::Vocabulary {
            reference: r.n_vocab,
            model: vocab,
        });
    }
    if r.n_ctx != ctx {
        return Err(KldReferenceError::Context {
            reference: r.n_ctx,
            run: ctx,
        });
    }
    if r.text_token_ids != tokens {
        let index = r
            .text_token_ids
            .iter()
            .zip(tokens)
            .position(|(a, b)| a != b)
            .unwrap_or(r.text_token_ids.len().min(tokens.len()));
        return Err(KldReferenceError::Tokens {
            index,
            reference_id: r.text_token_ids.get(index).copied(),
            our_id: tokens.get(index).copied(),
            reference_len: r.text_token_ids.len(),
            our_len: tokens.len(),
        });
    }
    Ok(())
}

/// One scored position: −log q(next) and, against `reference`, its divergence terms.
/// What the logits predicting the token after text position `at` (`next`) contribute.
fn score(logits: &[f32], next: u32, reference: Option<&ReferencePosition>, at: usize) -> Scored {
    let log_z = airs_engine::sampler::log_partition(logits);
    let logq = |id: u32| f64::from(logits[id as usize]) - log_z;
    let nll = -logq(next);
    let kld = reference.map(|r| {
        let (mut p_top, mut q_top, mut kl) = (0.0, 0.0, 0.0);
        for &(id, lp) in &r.top {
            let (p, lq) = (lp.exp(), logq(id));
            p_top += p;
            q_top += lq.exp();
            kl += p * (lp - lq);
        }
        let p_tail = (1.0 - p_top).max(TAIL_FLOOR);
        let q_tail = (1.0 - q_top).max(TAIL_FLOOR);
        kl += p_tail * (p_tail / q_tail).ln();
        let (ref_top, ref_top_lp) = r.top[0];
        let airs_top = airs_engine::sampler::argmax(logits);
        let disagreement = (airs_top != ref_top).then(|| {
            let ref_lp = r.top.iter().find(|t| t.0 == airs_top).or(r.top.last());
            Disagreement {
                position: at,
                reference_top: ref_top,
                airs_top,
                reference_margin: ref_top_lp - ref_lp.map_or(ref_top_lp, |t| t.1),
            }
        });
        Divergence {
            kl,
            top_abs_dp: (logq(ref_top).exp() - ref_top_lp.exp()).abs(),
            disagreement,
        }
    });
    Scored { nll, kld }
}

/// The `q`-quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(top: &[(u32, f64)]) -> ReferencePosition {
        ReferencePosition {
            next: top[0].0,
            next_logprob: top[0].1,
            entropy: 0.0,
            top: top.to_vec(),
        }
    }

    #[test]
    fn identical_distributions_diverge_by_nothing() {
        let logits = [2.0f32, 1.0, 0.5, -1.0];
        let log_z = airs_engine::sampler::log_partition(&logits);
        let lp = |i: usize| f64::from(logits[i]) - log_z;
        let r = position(&[(0, lp(0)), (1, lp(1))]);
        let s = score(&logits, 0, Some(&r), 0);
        let d = s.kld.unwrap();
        assert!(d.kl.abs() < 1e-9, "{d:?}");
        assert!(d.top1_agrees() && d.top_abs_dp < 1e-9);
        assert!((s.nll + lp(0)).abs() < 1e-12);
    }

    #[test]
    fn divergence_counts_the_top_and_the_tail() {
        // Reference: p = (0.5, 0.3) on tokens 0, 1, tail 0.2. Ours: uniform over 4 tokens.
        let logits = [0.0f32; 4];
        let r = position(&[(0, 0.5f64.ln()), (1, 0.3f64.ln())]);
        let d = score(&logits, 0, Some(&r), 0).kld.unwrap();
        let expected =
            0.5 * (0.5f64 / 0.25).ln() + 0.3 * (0.3f64 / 0.25).ln() + 0.2 * (0.2f64 / 0.5).ln();
        assert!((d.kl - expected).abs() < 1e-9, "{d:?} vs {expected}");
        assert!(
            d.top1_agrees(),
            "ties go to the lowest id, as the reference's"
        );
        assert!((d.top_abs_dp - 0.25).abs() < 1e-9);
    }

    #[test]
    fn a_disagreement_records_how_sure_the_reference_was() {
        // The reference prefers token 0 (−0.5) to token 1 (−0.7) to token 2 (−2.0); airs
        // prefers token 1, then token 3, outside the reference's top 3.
        let r = position(&[(0, -0.5), (1, -0.7), (2, -2.0)]);
        let d = score(&[0.0f32, 1.0, -1.0, 0.5], 0, Some(&r), 0)
            .kld
            .unwrap();
        assert!(!d.top1_agrees());
        let x = d.disagreement.unwrap();
        assert_eq!((x.reference_top, x.airs_top), (0, 1));
        let margin = x.reference_margin;
        assert!((margin - 0.2).abs() < 1e-12, "{margin}");
        // Outside the reference's top K: a lower bound, against the K-th.
        let d = score(&[0.0f32, -1.0, -1.0, 3.0], 0, Some(&r), 0)
            .kld
            .unwrap();
        let x = d.disagreement.unwrap();
        let (airs_top, margin) = (x.airs_top, x.reference_margin);
        assert_eq!(airs_top, 3);
        assert!((margin - 1.5).abs() < 1e-12, "{margin}");
        // Agreement records nothing.
        assert!(
            score(&[1.0f32, 0.0, 0.0, 0.0], 0, Some(&r), 0)
                .kld
                .unwrap()
                .disagreement
                .is_none()
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v[..1], 0.99), 1.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn malformed_references_get_typed_errors() {
        let cases: [&[u8]; 4] = [
            b"not json",
            br#"{"model":"m","n_vocab":4,"n_ctx":2,"kv_type":"f16","add_bos":false,"top_k":1,
                "text_token_ids":[],"chunks":[]}"#,
            br#"{"model":"m","n_vocab":4,"n_ctx":4,"kv_type":"f16","add_bos":false,"top_k":9,
                "text_token_ids":[],"chunks":[]}"#,
            br#"{"model":"m","n_vocab":4,"n_ctx":4,"kv_type":"f16","add_bos":false,"top_k":1,
                "text_token_ids":[1,2,3],"chunks":[{"start":0,"first_scored":2,"positions":[]}]}"#,
        ];
        for bytes in cases {
            let e = KldReference::parse(bytes).unwrap_err();
            assert!(
                matches!(
                    e,
                    KldReferenceError::Parse(_) | KldReferenceError::Malformed(_)
                ),
                "{e}"
            );
        }
        let ok = br#"{"model":"m","n_vocab":4,"n_ctx":4,"kv_type":"f16","add_bos":false,
            "top_k":1,"text_token_ids":[1,2,3,0],
            "chunks":[{"start":0,"first_scored":2,"positions":[
                {"next":0,"next_logprob":-0.1,"entropy":0.3,"top":[[0,-0.1]]}]}]}"#;
        let r = KldReference::parse(ok).unwrap();
        assert!((r.perplexity(1) - 0.1f64.exp()).abs() < 1e-12);
    }
}
