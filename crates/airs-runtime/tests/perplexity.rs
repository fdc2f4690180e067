//! `airs_runtime::perplexity` on stories260K: the protocol (chunks, BOS, scored positions)
//! against an independent computation over the contiguous cache in one pass per chunk, the KL
//! divergence against a reference made from airs's own distributions (zero, full agreement),
//! and references that do not fit the run (typed errors).
mod common;

use airs_engine::{ContiguousKv, KvType, Logits};
use airs_runtime::perplexity::{
    KldReference, KldReferenceError, PerplexityConfig, evaluate, tokenize,
};
use airs_runtime::{ErrorClass, RuntimeErrorKind};
use serde_json::json;

const CTX: usize = 64;
const CHUNKS: usize = 3;

fn design_text() -> String {
    std::fs::read_to_string(airs_testdata::repo_path("testdata/text/model-memory.md")).unwrap()
}

/// Each chunk's scored log-softmax rows, computed in one pass over the whole chunk with the
/// contiguous cache.
fn oracle_rows(model: &airs_runtime::LoadedModel, tokens: &[u32]) -> Vec<(u32, Vec<f64>)> {
    let vocab = model.model.config.vocab_len;
    let mut rows = Vec::new();
    for c in 0..CHUNKS {
        let mut chunk = tokens[c * CTX..(c + 1) * CTX].to_vec();
        if model.tokenizer.add_bos() {
            chunk[0] = model.tokenizer.bos_id().unwrap().into();
        }
        let mut kv = ContiguousKv::new(model.kv_shape(), CTX, KvType::F16);
        let logits = model
            .model
            .forward(&model.runtime, &mut kv, &chunk, Logits::All)
            .unwrap();
        for i in CTX / 2..CTX - 1 {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
            let log_z = f64::from(max) + z.ln();
            rows.push((
                chunk[i + 1],
                row.iter().map(|&l| f64::from(l) - log_z).collect(),
            ));
        }
    }
    rows
}

#[test]
fn perplexity_scores_the_second_half_of_every_chunk_like_one_pass_per_chunk() {
    let model = common::model();
    let tokens = tokenize(&model, &design_text());
    assert_eq!(tokens[0], u32::from(model.tokenizer.bos_id().unwrap()));
    let mut config = PerplexityConfig::new(CTX, KvType::F16);
    config.chunks = Some(CHUNKS);
    let mut seen = Vec::new();
    let r = evaluate(&model, &tokens, &config, None, &mut |d, n| {
        seen.push((d, n))
    })
    .unwrap();
    assert_eq!(seen, [(1, 3), (2, 3), (3, 3)]);
    assert_eq!((r.chunks, r.positions, r.ctx), (CHUNKS, CHUNKS * 31, CTX));
    assert!(r.kld.is_none());
    let rows = oracle_rows(&model, &tokens);
    let nll: f64 = rows.iter().map(|(next, lp)| -lp[*next as usize]).sum();
    let expected = (nll / rows.len() as f64).exp();
    assert!(
        (r.perplexity - expected).abs() <= 1e-9 * expected,
        "{} vs one pass per chunk {expected}",
        r.perplexity
    );
    // A model of children's stories on a design chapter: worse than uniform over its 512 tokens.
    assert!(
        r.perplexity.is_finite() && r.perplexity > 1.0,
        "{}",
        r.perplexity
    );
}

/// A reference in the llama.cpp format made from the oracle's own distributions.
fn self_reference(model: &airs_runtime::LoadedModel, tokens: &[u32]) -> serde_json::Value {
    let rows = oracle_rows(model, tokens);
    let chunks: Vec<_> = rows
        .chunks(CTX / 2 - 1)
        .enumerate()
        .map(|(c, rows)| {
            let positions: Vec<_> = rows
                .iter()
                .map(|(next, lp)| {
                    let mut ids: Vec<usize> = (0..lp.len()).collect();
                    ids.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
                    let top: Vec<_> = ids[..32].iter().map(|&i| json!([i, lp[i]])).collect();
                    json!({"next": next, "next_logprob": lp[*next as usize], "entropy": 0.0,
                           "top": top})
                })
                .collect();
            json!({"start": c * CTX, "first_scored": CTX / 2, "positions": positions})
        })
        .collect();
    json!({"model": "stories260K.gguf", "n_vocab": model.model.config.vocab_len, "n_ctx": CTX,
           "kv_type": "f16", "add_bos": true, "top_k": 32, "text_token_ids": tokens,
           "chunks": chunks})
}

#[test]
fn a_reference_of_the_same_distributions_diverges_by_nothing() {
    let model = common::model();
    let tokens = tokenize(&model, &design_text());
    let v = self_reference(&model, &tokens);
    let reference = KldReference::parse(v.to_string().as_bytes()).unwrap();
    let config = PerplexityConfig::new(CTX, KvType::F16);
    let r = evaluate(&model, &tokens, &config, Some(&reference), &mut |_, _| {}).unwrap();
    assert_eq!(r.chunks, CHUNKS, "a reference's chunks bound the run");
    let k = r.kld.unwrap();
    assert!(k.max < 1e-9 && k.mean_abs_dp < 1e-9, "{k:?}");
    assert_eq!(k.top1_agreement, 1.0);
    assert!(k.disagreements.is_empty() && k.max_disagreement_margin() == 0.0);
    assert!((k.reference_perplexity - r.perplexity).abs() < 1e-9 * r.perplexity);
    // An f32 cache rounds nothing: it diverges from the f16 distributions, by a little.
    let f32_kv = evaluate(
        &model,
        &tokens,
        &PerplexityConfig::new(CTX, KvType::F32),
        Some(&reference),
        &mut |_, _| {},
    )
    .unwrap()
    .kld
    .unwrap();
    assert!(f32_kv.mean > 0.0 && f32_kv.mean < 0.01, "{f32_kv:?}");
}

#[test]
fn references_that_do_not_fit_the_run_are_refused_with_what_differs() {
    let model = common::model();
    let tokens = tokenize(&model, &design_text());
    let mut v = self_reference(&model, &tokens);
    let config = PerplexityConfig::new(CTX, KvType::F16);
    let refuse = |v: &serde_json::Value, config: &PerplexityConfig| {
        let reference = KldReference::parse(v.to_string().as_bytes()).unwrap();
        let e = evaluate(&model, &tokens, config, Some(&reference), &mut |_, _| {}).unwrap_err();
        assert_eq!(e.class(), ErrorClass::BadRequest, "{e}");
        match e.into_kind() {
            RuntimeErrorKind::KldReference(k) => k,
            other => panic!("{other}"),
        }
    };
    let e = refuse(&v, &PerplexityConfig::new(2 * CTX, KvType::F16));
    assert!(
        matches!(
            e,
            KldReferenceError::Context {
                reference: 64,
                run: 128
            }
        ),
        "{e}"
    );
    // A text tokenized otherwise: the first difference is named. (The scored `next` ids stay
    // consistent because the changed token is not scored: position 1 of chunk 0.)
    v["text_token_ids"][1] = json!(tokens[1] + 1);
    let e = refuse(&v, &config);
    assert!(
        matches!(e, KldReferenceError::Tokens { index: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("first difference at token 1"), "{e}");
    v["text_token_ids"][1] = json!(tokens[1]);
    v["n_vocab"] = json!(151_936);
    let e = refuse(&v, &config);
    assert!(matches!(e, KldReferenceError::Vocabulary { .. }), "{e}");
    // Malformed: a scored `next` that is not the text's token.
    v["n_vocab"] = json!(model.model.config.vocab_len);
    v["chunks"][0]["positions"][0]["next"] = json!(tokens[CTX / 2 + 1] + 1);
    let e = KldReference::parse(v.to_string().as_bytes()).unwrap_err();
    assert!(matches!(e, KldReferenceError::Malformed(_)), "{e}");
}
