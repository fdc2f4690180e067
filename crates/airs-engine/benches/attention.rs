//! Decode attention through the paged KV cache the product uses, single thread: one query's
//! heads of one KV group against `context` cached positions of one layer, in ns per position
//! and GB/s of K/V bytes read. Shapes of the real files (head_dim, query heads per KV head):
//! TinyLlama 1.1B (64, 8), Qwen2.5 0.5B (64, 7), Gemma 3 270M (256, 4).
//!
//! The cache holds several layers so that a layer's rows are not in cache from the previous
//! call (each call visits the next layer, as a decode step does).
//!
//! Each case runs on a pool of transparent huge pages (`huge`, the product's default) and of
//! base pages (`base`), one after the other; the last column is how much of the pool the
//! kernel put on huge pages.
//!
//! `AIRS_BENCH_QUERIES=Q` (1..=16, default 1) attends Q consecutive prompt rows at once, as a
//! prefill block does (`KvCache::attend_queries`, the last row at the last cached position,
//! each row causal); the GFLOP/s column counts the scores' and the weighted sum's
//! multiply-adds (4 · head_dim per head and position attended).
//!
//! `cargo bench -p airs-engine --bench attention [-- FILTER...]` (a case runs if its label
//! contains every FILTER word, e.g. `tinyllama f16 2048`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use airs_engine::{KvCache, KvShape, KvType, PagedKv, PagedKvConfig, PagedKvPool};

/// (name, head_dim, query heads per KV head).
const SHAPES: [(&str, usize, usize); 3] =
    [("tinyllama", 64, 8), ("qwen2.5", 64, 7), ("gemma3", 256, 4)];

/// Layers cycled through (the cache far exceeds L2 at long contexts, as in a real step), each
/// of one KV head: 48, so that a block's bytes are those of a real file's block (Qwen2.5-0.5B:
/// 24 layers of 2 KV heads; each call reads one short run of every block, as a layer does).
const LAYERS: usize = 48;

fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

/// MiB read between calls (`AIRS_BENCH_STREAM_MIB`, default 0): a decode step streams a
/// layer's weights between two attention calls (Qwen2.5-0.5B: ~16 MiB), which evicts the KV
/// rows from the caches and their pages from the TLB. With it, each call is timed alone and
/// the median reported (the stream untimed); without it, the fastest round of calls.
fn stream_bytes() -> usize {
    std::env::var("AIRS_BENCH_STREAM_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(0, |m| m << 20)
}

/// Prompt rows attended per call (`AIRS_BENCH_QUERIES`, default 1: decode).
fn queries() -> usize {
    std::env::var("AIRS_BENCH_QUERIES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(1, |q| q.clamp(1, 16))
}

fn main() {
    let queries = queries();
    let stream = vec![1u8; stream_bytes()];
    let isa = airs_kernels::Isa::detect();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |label: &str| filters.iter().all(|f| label.contains(f.as_str()));
    println!(
        "{:<36} {:>10} {:>10} {:>8} {:>8} {:>9}",
        format!("case (single thread, {queries} queries)"),
        "µs/call",
        "ns/pos",
        "GB/s",
        "GFLOP/s",
        "huge MiB"
    );
    for (name, head_dim, group) in SHAPES {
        for ty in [KvType::F16, KvType::F32, KvType::Q8_0] {
            for (context, pages) in [256usize, 1024, 2048, 4096, 8192]
                .into_iter()
                .flat_map(|c| [(c, "huge"), (c, "base")])
            {
                let label = format!("{name} {} {context} {pages}", ty.name());
                if !wanted(&label) {
                    continue;
                }
                let shape = KvShape {
                    layers: LAYERS,
                    kv_heads: 1,
                    head_dim,
                };
                let row_bytes = ty.row_bytes(head_dim).unwrap();
                let pool_bytes = 2 * LAYERS * (context + 16) * row_bytes;
                let config = PagedKvConfig {
                    huge_pages: pages == "huge",
                    ..PagedKvConfig::new(pool_bytes)
                };
                let pool = PagedKvPool::new(shape, ty, &config).unwrap();
                let mut kv = PagedKv::new_sequence(&pool, None);
                kv.reserve(context).unwrap();
                for layer in 0..LAYERS {
                    let k = floats(context * head_dim, 2 * layer as u64);
                    let v = floats(context * head_dim, 2 * layer as u64 + 1);
                    kv.store(layer, 0, &k, &v);
                }
                kv.set_len(context);
                let huge_mib = pool.memory().residency().huge_page_bytes >> 20;
                let q = floats(queries * group * head_dim, 99);
                let mut out = vec![0f32; queries * group * head_dim];
                let mut scores = vec![0f32; queries * group * context];
                let scale = 1.0 / (head_dim as f32).sqrt();
                let mut layer = 0;
                let mut call = || {
                    kv.attend_queries(
                        layer,
                        0,
                        black_box(&q),
                        queries,
                        0..context,
                        scale,
                        &mut out,
                        &mut scores,
                    );
                    layer = (layer + 1) % LAYERS;
                };
                call();
                let mut best = f64::INFINITY;
                let start = Instant::now();
                let mut calls = 0;
                if stream.is_empty() {
                    while start.elapsed() < Duration::from_millis(400) || calls < 3 * LAYERS {
                        let t = Instant::now();
                        for _ in 0..LAYERS {
                            call();
                        }
                        best = best.min(t.elapsed().as_secs_f64() / LAYERS as f64);
                        calls += LAYERS;
                    }
                } else {
                    let mut times = Vec::new();
                    while start.elapsed() < Duration::from_millis(1500) || times.len() < 3 * LAYERS
                    {
                        black_box(airs_kernels::xor_fold(isa, &stream));
                        let t = Instant::now();
                        call();
                        times.push(t.elapsed().as_secs_f64());
                    }
                    times.sort_by(f64::total_cmp);
                    best = times[times.len() / 2];
                }
                black_box(&out);
                let bytes = 2 * context * row_bytes;
                // Row i of the block attends context − queries + 1 + i positions.
                let attended: usize = (0..queries).map(|i| context - queries + 1 + i).sum();
                let flops = 4 * head_dim * group * attended;
                println!(
                    "{label:<36} {:>10.2} {:>10.1} {:>8.2} {:>8.1} {huge_mib:>9}",
                    best * 1e6,
                    best * 1e9 / context as f64,
                    bytes as f64 / best / 1e9,
                    flops as f64 / best / 1e9
                );
            }
        }
    }
}
