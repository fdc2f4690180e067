//! Sharing in the paged cache: prefix reuse, copy-on-write forks, pool exhaustion, tenant
//! scoping and least-recently-used reclaim, on the real models.
mod paged_common;

use airs_engine::{EngineErrorKind, KvCache, KvType, Logits, PagedKv, Runtime};
use airs_testdata::{Reference, qwen_path, stories_path};
use paged_common::*;

/// Prefill `first` then `rest` (two batches) and decode `steps` greedy tokens.
fn two_batch_run(
    model: &airs_engine::Model,
    rt: &Runtime,
    kv: &mut dyn KvCache,
    first: &[u32],
    rest: &[u32],
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut rows = Vec::new();
    if !first.is_empty() {
        let vocab = model.config.vocab_len;
        let logits = model.forward(rt, kv, first, Logits::All).unwrap();
        rows.extend(logits.chunks_exact(vocab).map(<[f32]>::to_vec));
    }
    let (more, ids) = greedy_run(model, rt, kv, rest, rest.len(), steps);
    rows.extend(more);
    (rows, ids)
}

fn reuse_equals_solo(model_path: &std::path::Path, prompt: &[u32], shared: usize, ty: KvType) {
    let model = load(model_path);
    let rt = Runtime::new(2);
    let tpb = 4;
    let a: Vec<u32> = prompt.to_vec();
    let mut b: Vec<u32> = prompt[..shared].to_vec();
    b.extend(prompt[shared..].iter().rev()); // same prefix, different continuation
    let (prefix, a_rest, b_rest) = (&a[..shared], &a[shared..], &b[shared..]);

    // B alone, in a pool of its own, with the prefix as its first batch.
    let solo_pool = pool(&model, ty, tpb, 64);
    let mut solo = PagedKv::new_sequence(&solo_pool, None);
    let (solo_rows, solo_ids) = two_batch_run(&model, &rt, &mut solo, prefix, b_rest, 12);

    // A then B in one pool: B finds the prefix and computes only its own tokens.
    let kv_pool = pool(&model, ty, tpb, 64);
    let (mut seq_a, cached_a) = PagedKv::new_sequence_with_prefix(&kv_pool, None, &a);
    assert_eq!(cached_a, 0);
    two_batch_run(&model, &rt, &mut seq_a, prefix, a_rest, 4);
    let (mut seq_b, cached_b) = PagedKv::new_sequence_with_prefix(&kv_pool, None, &b);
    assert_eq!(cached_b, shared, "the whole shared prefix is reused");
    let (rows, ids) = two_batch_run(&model, &rt, &mut seq_b, &[], b_rest, 12);
    assert_eq!(ids, solo_ids, "reusing the prefix changes no token");
    assert_same_bits(
        &rows,
        &solo_rows[shared..],
        "logits after the reused prefix",
    );

    let stats = kv_pool.memory().audit().unwrap();
    assert_eq!(stats.shared_blocks as usize, shared / tpb as usize);
    assert_eq!(stats.counters.prefix_hit_tokens as usize, shared);
    assert_eq!(
        stats.counters.prefix_copied_tokens as usize,
        shared % tpb as usize
    );
}

#[test]
fn stories260k_sequence_reusing_a_prefix_produces_its_solo_output() {
    let prompt = Reference::load("stories260K.prompt.kvf32").prompt_token_ids;
    // 14 shared positions: three whole blocks of 4 shared, two rows copied from the fourth.
    reuse_equals_solo(&stories_path(), &prompt, 14, KvType::F32);
    reuse_equals_solo(&stories_path(), &prompt, 12, KvType::F16);
}

#[test]
fn qwen_sequence_reusing_a_prefix_produces_its_solo_output() {
    let prompt = Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf16").prompt_token_ids;
    reuse_equals_solo(&qwen_path(), &prompt[..28], 22, KvType::F16);
}

#[test]
fn n_sequences_compute_and_store_a_shared_prefix_once() {
    let model = load(&stories_path());
    let rt = Runtime::new(2);
    let (tpb, n, p, s) = (4usize, 4usize, 24usize, 6usize);
    let kv_pool = pool(&model, KvType::F32, tpb as u32, 64);
    let mut seqs = Vec::new();
    let mut computed = 0;
    for i in 0..n {
        let mut prompt: Vec<u32> = (0..p as u32).map(|t| 300 + t).collect();
        prompt.extend((0..s as u32).map(|t| 100 + 10 * i as u32 + t));
        let (mut kv, cached) = PagedKv::new_sequence_with_prefix(&kv_pool, None, &prompt);
        model
            .forward(&rt, &mut kv, &prompt[cached..], Logits::Last)
            .unwrap();
        computed += prompt.len() - cached;
        seqs.push(kv);
    }
    assert_eq!(computed, p + n * s, "the prefix is computed once");
    let stats = kv_pool.memory().audit().unwrap();
    let blocks = p / tpb + n * s.div_ceil(tpb);
    assert_eq!(stats.blocks_used as usize, blocks);
    assert_eq!(stats.tokens_stored as usize, p + n * s);
    assert_eq!(stats.shared_refcounts, vec![(n as u32, (p / tpb) as u32)]);
    assert_eq!(
        stats.shared_savings_bytes,
        (n - 1) * (p / tpb) * kv_pool.block_bytes()
    );
    assert!(
        stats.waste_bytes < n * kv_pool.block_bytes(),
        "< one block per sequence"
    );
}

/// Greedy decoding of `steps` tokens after logits `last`: the logits computed and the ids.
fn decode(
    model: &airs_engine::Model,
    rt: &Runtime,
    kv: &mut dyn KvCache,
    mut last: Vec<f32>,
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let (mut rows, mut ids) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let next = airs_engine::sampler::argmax(&last);
        ids.push(next);
        last = model.forward(rt, kv, &[next], Logits::Last).unwrap();
        rows.push(last.clone());
    }
    (rows, ids)
}

#[test]
fn copy_on_write_leaves_the_other_sequence_unchanged() {
    let model = load(&stories_path());
    let rt = Runtime::new(2);
    let prompt = &Reference::load("stories260K.prompt.kvf32").prompt_token_ids[..10];
    let other = 123u32;
    // Solo runs: the prompt continued greedily; the prompt, `other`, then greedily.
    let solo_pool = pool(&model, KvType::F32, 4, 64);
    let mut kv = PagedKv::new_sequence(&solo_pool, None);
    let logits = model.forward(&rt, &mut kv, prompt, Logits::Last).unwrap();
    let want_a = decode(&model, &rt, &mut kv, logits, 20);
    let mut kv = PagedKv::new_sequence(&solo_pool, None);
    model.forward(&rt, &mut kv, prompt, Logits::Last).unwrap();
    let logits = model.forward(&rt, &mut kv, &[other], Logits::Last).unwrap();
    let want_b = decode(&model, &rt, &mut kv, logits, 20);

    for a_first in [true, false] {
        let kv_pool = pool(&model, KvType::F32, 4, 64);
        let mut a = PagedKv::new_sequence(&kv_pool, None);
        let after_prompt = model.forward(&rt, &mut a, prompt, Logits::Last).unwrap();
        // Fork mid-block: 10 positions = two full blocks and half of a third, all shared.
        let mut b = a.fork();
        assert_eq!(kv_pool.stats().shared_blocks, 3);
        let run_b = |b: &mut PagedKv| {
            let logits = model.forward(&rt, b, &[other], Logits::Last).unwrap();
            decode(&model, &rt, b, logits, 20)
        };
        let (got_a, got_b) = if a_first {
            let got_a = decode(&model, &rt, &mut a, after_prompt, 20);
            (got_a, run_b(&mut b))
        } else {
            let got_b = run_b(&mut b);
            (decode(&model, &rt, &mut a, after_prompt, 20), got_b)
        };
        assert_eq!(got_a.1, want_a.1, "the forked-from sequence is unchanged");
        assert_same_bits(&got_a.0, &want_a.0, "forked-from sequence");
        assert_eq!(got_b.1, want_b.1, "the fork continues on its own");
        assert_same_bits(&got_b.0, &want_b.0, "fork");
        let stats = kv_pool.memory().audit().unwrap();
        // The first writer copies the shared partial block; the second then owns the original.
        assert_eq!(stats.counters.cow_copies, 1);
        assert_eq!(stats.shared_blocks, 2);
    }
}

#[test]
fn pool_exhaustion_is_typed_and_leaves_other_sequences_intact() {
    let model = load(&stories_path());
    let rt = Runtime::new(2);
    let prompt = Reference::load("stories260K.prompt.kvf32").prompt_token_ids;
    let solo_pool = pool(&model, KvType::F32, 4, 64);
    let mut kv = PagedKv::new_sequence(&solo_pool, None);
    let want = greedy_run(&model, &rt, &mut kv, &prompt, prompt.len(), 20);

    let kv_pool = pool(&model, KvType::F32, 4, 10);
    let mut a = PagedKv::new_sequence(&kv_pool, None);
    let first = greedy_run(&model, &rt, &mut a, &prompt, prompt.len(), 5); // 20 positions
    assert_eq!(kv_pool.stats().blocks_used, 5);

    let mut b = PagedKv::new_sequence(&kv_pool, None);
    let long: Vec<u32> = (0..30).map(|t| 200 + t).collect();
    let e = model.forward(&rt, &mut b, &long, Logits::Last).unwrap_err();
    assert!(matches!(e.kind(), EngineErrorKind::KvExhausted(_)), "{e}");
    let typed = b.try_reserve(30).unwrap_err();
    assert_eq!(
        (
            typed.needed_blocks,
            typed.available_blocks,
            typed.blocks_total
        ),
        (8, 5, 10)
    );
    assert_eq!(typed.block_bytes, kv_pool.block_bytes());
    assert_eq!((b.len(), b.table().blocks().len()), (0, 0));
    kv_pool.memory().audit().unwrap();

    // A continues to 36 positions (9 blocks) as if B had never tried: the fifth greedy id
    // of `first` was chosen but not yet fed.
    let (_, more) = decode(&model, &rt, &mut a, first.0.last().unwrap().clone(), 16);
    assert_eq!([&first.1[..4], &more[..]].concat(), want.1);
    assert_eq!(kv_pool.memory().audit().unwrap().blocks_used, 9);
}

#[test]
fn prefix_lookups_are_scoped_by_cache_salt() {
    let model = load(&stories_path());
    let rt = Runtime::new(1);
    let kv_pool = pool(&model, KvType::F32, 4, 32);
    let prompt: Vec<u32> = (0..13).map(|t| 300 + t).collect();
    let (mut a, _) = PagedKv::new_sequence_with_prefix(&kv_pool, Some(b"tenant-a"), &prompt);
    model.forward(&rt, &mut a, &prompt, Logits::Last).unwrap();
    for (salt, want) in [
        (Some(&b"tenant-b"[..]), 0),
        (None, 0),
        (Some(&b""[..]), 0),
        (Some(&b"tenant-a"[..]), 12),
    ] {
        let (kv, cached) = PagedKv::new_sequence_with_prefix(&kv_pool, salt, &prompt);
        assert_eq!(cached, want, "salt {salt:?}");
        assert_eq!(kv.len(), want);
    }
}

#[test]
fn unreferenced_prefix_blocks_stay_cached_and_are_reclaimed_lru() {
    let model = load(&stories_path());
    let rt = Runtime::new(1);
    let kv_pool = pool(&model, KvType::F32, 4, 8);
    let old: Vec<u32> = (0..20).map(|t| 300 + t).collect();
    let (mut a, _) = PagedKv::new_sequence_with_prefix(&kv_pool, None, &old);
    model.forward(&rt, &mut a, &old, Logits::Last).unwrap();
    drop(a);
    let s = kv_pool.memory().audit().unwrap();
    assert_eq!((s.blocks_used, s.blocks_cached, s.blocks_free), (0, 5, 3));
    assert_eq!(s.cached_tokens_stored, 20);

    // Still reusable while cached.
    let (kv, cached) = PagedKv::new_sequence_with_prefix(&kv_pool, None, &old);
    assert_eq!(cached, 19);
    drop(kv);

    // A sequence needing 7 blocks takes the 3 free ones and reclaims 4 cached, deepest first.
    let new: Vec<u32> = (0..28).map(|t| 100 + t).collect();
    let mut b = PagedKv::new_sequence(&kv_pool, None);
    model.forward(&rt, &mut b, &new, Logits::Last).unwrap();
    let s = kv_pool.memory().audit().unwrap();
    assert_eq!((s.blocks_used, s.blocks_cached, s.blocks_free), (7, 1, 0));
    assert_eq!(s.counters.reclaimed_blocks, 4);
    let (_kv, cached) = PagedKv::new_sequence_with_prefix(&kv_pool, None, &old);
    assert_eq!(cached, 4, "the root-most block of the old prompt survived");
}
