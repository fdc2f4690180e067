//! A sequence's results do not depend on what it was batched with: one `forward_batch` step
//! over several sequences — decode rows of some, prefill chunks of others, each through its own
//! paged block table at its own positions — gives every sequence exactly the bits of running it
//! alone (whole prompt in one pass, then one token per pass), on both real models and every KV
//! type, with one output buffer reused from step to step. What continuous batching relies on.
mod paged_common;

use airs_engine::{
    BatchOutput, BatchSeq, KvCache, KvType, Logits, Model, Output, PagedKv, PagedKvPool, Runtime,
};
use paged_common::{load, pool};

/// Three sequences: prompts of `lens` tokens, then `decode` forced tokens each.
fn sequences(vocab: usize, lens: [usize; 3], decode: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..3)
        .map(|s| {
            let tok = |i: usize| (1 + (i * 37 + s * 101) % (vocab - 1)) as u32;
            let prompt = (0..lens[s]).map(tok).collect();
            let forced = (0..decode).map(|i| tok(1000 + i)).collect();
            (prompt, forced)
        })
        .collect()
}

/// Every last-position logits row a sequence produces alone: after its prompt (one pass), then
/// after each forced token.
fn alone(
    model: &Model,
    rt: &Runtime,
    p: &PagedKvPool,
    prompt: &[u32],
    forced: &[u32],
) -> Vec<Vec<f32>> {
    let mut kv = PagedKv::new_sequence(p, None);
    let mut out = vec![model.forward(rt, &mut kv, prompt, Logits::Last).unwrap()];
    for &t in forced {
        out.push(model.forward(rt, &mut kv, &[t], Logits::Last).unwrap());
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(model: &Model, ty: KvType, lens: [usize; 3], chunk: usize) {
    let rt = Runtime::new(2);
    let p = pool(model, ty, 16, 64);
    let seqs = sequences(model.config.vocab_len, lens, 6);
    let want: Vec<Vec<Vec<f32>>> = seqs
        .iter()
        .map(|(prompt, forced)| alone(model, &rt, &p, prompt, forced))
        .collect();

    // Batched: sequence 0 prefills in chunks of `chunk` from step 0, sequence 1 from step 1,
    // sequence 2 from step 2; each decodes its forced tokens once its prompt is in — so most
    // steps mix decode rows of some sequences with prefill chunks of others.
    let mut kvs: Vec<PagedKv> = (0..3).map(|_| PagedKv::new_sequence(&p, None)).collect();
    let mut fed = [0usize; 3];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
    // One output buffer for every step, as the scheduler keeps one: the steps want 0 to 3
    // logits rows, so it shrinks and grows and each step writes over the last one's values.
    let mut out = BatchOutput::default();
    for step in 0.. {
        let mut rows: Vec<(usize, Vec<u32>, Output)> = Vec::new();
        for s in 0..3 {
            if step < s {
                continue;
            }
            let (prompt, forced) = &seqs[s];
            let all: Vec<u32> = prompt.iter().chain(forced).copied().collect();
            if fed[s] >= all.len() {
                continue;
            }
            let n = if fed[s] < prompt.len() {
                chunk.min(prompt.len() - fed[s])
            } else {
                1
            };
            let end = fed[s] + n;
            let output = if end >= prompt.len() {
                Output::LastLogits
            } else {
                Output::Nothing
            };
            rows.push((s, all[fed[s]..end].to_vec(), output));
        }
        if rows.is_empty() {
            break;
        }
        let mut taken: Vec<(usize, PagedKv)> = rows
            .iter()
            .map(|(s, _, _)| {
                (
                    *s,
                    std::mem::replace(&mut kvs[*s], PagedKv::new_sequence(&p, None)),
                )
            })
            .collect();
        {
            let mut batch: Vec<BatchSeq<'_>> = taken
                .iter_mut()
                .zip(&rows)
                .map(|((_, kv), (_, tokens, output))| BatchSeq {
                    kv,
                    tokens,
                    output: *output,
                })
                .collect();
            model
                .forward_batch_into(&rt, &mut batch, 512, &mut out)
                .unwrap();
        }
        for (i, (s, kv)) in taken.into_iter().enumerate() {
            kvs[s] = kv;
            fed[s] += rows[i].1.len();
            assert_eq!(kvs[s].len(), fed[s]);
            if rows[i].2 == Output::LastLogits {
                got[s].push(out.get(i).to_vec());
            }
        }
    }
    for s in 0..3 {
        assert_eq!(got[s].len(), want[s].len(), "sequence {s}");
        for (step, (g, w)) in got[s].iter().zip(&want[s]).enumerate() {
            assert!(
                bits(g) == bits(w),
                "{ty:?}, chunks of {chunk}: sequence {s} differs from running alone at output \
                 {step}"
            );
        }
    }
}

#[test]
fn stories_sequences_batched_with_others_equal_themselves_alone() {
    let model = load(&airs_testdata::stories_path());
    for ty in [KvType::F32, KvType::F16] {
        check(&model, ty, [37, 20, 5], 16);
        check(&model, ty, [40, 3, 18], 7);
    }
}

#[test]
fn qwen_sequences_batched_with_others_equal_themselves_alone() {
    let model = load(&airs_testdata::qwen_path());
    for ty in [KvType::F16, KvType::Q8_0] {
        check(&model, ty, [45, 20, 9], 16);
    }
}

#[test]
fn gemma_sequences_batched_with_others_equal_themselves_alone() {
    let model = load(&airs_testdata::gemma_path());
    check(&model, KvType::F16, [45, 20, 9], 16);
}

/// Layer-major passes inside a batch (several sequences' rows split into passes of `pass_rows`)
/// give the same bits as one pass.
#[test]
fn a_batch_split_into_layer_major_passes_equals_one_pass() {
    let model = load(&airs_testdata::stories_path());
    let rt = Runtime::new(2);
    let p = pool(&model, KvType::F16, 16, 64);
    let seqs = sequences(model.config.vocab_len, [30, 12, 25], 0);
    let run = |pass_rows: usize| {
        let mut kvs: Vec<PagedKv> = (0..3).map(|_| PagedKv::new_sequence(&p, None)).collect();
        let mut batch: Vec<BatchSeq<'_>> = kvs
            .iter_mut()
            .zip(&seqs)
            .map(|(kv, (prompt, _))| BatchSeq {
                kv,
                tokens: prompt,
                output: Output::AllLogits,
            })
            .collect();
        model.forward_batch(&rt, &mut batch, pass_rows).unwrap()
    };
    let one = run(512);
    for pass_rows in [1, 7, 16, 40] {
        let split = run(pass_rows);
        assert_eq!(split.ranges.len(), one.ranges.len());
        for i in 0..one.ranges.len() {
            assert!(
                bits(split.get(i)) == bits(one.get(i)),
                "passes of {pass_rows}, sequence {i}"
            );
        }
    }
}
