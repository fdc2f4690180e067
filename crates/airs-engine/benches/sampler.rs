//! Drawing one token from a vocabulary's logits, single thread, in µs per draw: greedy, the
//! defaults a chat client gets (temperature 0.8 with top-k 40, top-p 0.95, min-p 0.05), the
//! same with a repetition penalty over 64 tokens of history, top-k off (top-p over the
//! whole vocabulary), and every filter off (the draw walks the whole sorted vocabulary); and the log-probabilities a client may ask for with each token (the
//! chosen token's and the top 5). Vocabularies of the real files: Llama 2 (32,000), Qwen2.5 (151,936) and
//! Gemma 3 (262,144).
//!
//! The scheduler draws every sequence's token between two forward steps, so with 16 sequences
//! a draw's cost counts sixteen times in every decode step (a step of 16 Qwen2.5-0.5B decode
//! rows takes ~33 ms on two threads).
//!
//! `cargo bench -p airs-engine --bench sampler [-- FILTER...]` (a case runs if its label
//! contains every FILTER word, e.g. `151936 top-k`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use airs_engine::sampler::{Sampler, SamplerConfig, logprobs};

/// Logits shaped like a language model's: most of the vocabulary in a broad band, a few
/// hundred tokens well above it, one or two near the top.
fn logits(vocab: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..vocab)
        .map(|_| {
            let u = next();
            let base = (next() + next() + next() - 1.5) * 6.0;
            if u < 0.002 {
                base + 12.0 + 6.0 * next()
            } else {
                base
            }
        })
        .collect()
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |label: &str| filters.iter().all(|f| label.contains(f.as_str()));
    let chat = SamplerConfig {
        temperature: 0.8,
        ..SamplerConfig::default()
    };
    let cases = [
        ("greedy", SamplerConfig::default()),
        ("top-k 40", chat.clone()),
        (
            "top-k 40 penalty",
            SamplerConfig {
                repeat_penalty: 1.1,
                ..chat.clone()
            },
        ),
        (
            "top-p only",
            SamplerConfig {
                top_k: 0,
                min_p: 0.0,
                ..chat.clone()
            },
        ),
        (
            "temperature only",
            SamplerConfig {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..chat.clone()
            },
        ),
    ];
    println!("{:<36} {:>10}", "case (single thread)", "µs/draw");
    for vocab in [32_000usize, 151_936, 262_144] {
        // Several distinct rows, so that one draw does not find the last one's logits in L1.
        let rows: Vec<Vec<f32>> = (0..8).map(|i| logits(vocab, 7 + i)).collect();
        let history: Vec<u32> = (0..64)
            .map(|i| (i * 2_654_435_761u64 % vocab as u64) as u32)
            .collect();
        for (name, config) in &cases {
            let label = format!("{vocab} {name}");
            if !wanted(&label) {
                continue;
            }
            let mut sampler = Sampler::new(config.clone());
            let mut row = 0;
            let mut draw = || {
                black_box(sampler.sample(black_box(&rows[row]), &history));
                row = (row + 1) % rows.len();
            };
            draw();
            let mut best = f64::INFINITY;
            let start = Instant::now();
            let mut draws = 0;
            while start.elapsed() < Duration::from_millis(400) || draws < 24 {
                let t = Instant::now();
                for _ in 0..rows.len() {
                    draw();
                }
                best = best.min(t.elapsed().as_secs_f64() / rows.len() as f64);
                draws += rows.len();
            }
            println!("{label:<36} {:>10.1}", best * 1e6);
        }
        let label = format!("{vocab} logprobs top 5");
        if wanted(&label) {
            let start = Instant::now();
            let mut best = f64::INFINITY;
            let mut draws = 0;
            while start.elapsed() < Duration::from_millis(400) || draws < 24 {
                let t = Instant::now();
                for row in &rows {
                    black_box(logprobs(black_box(row), 7, 5));
                }
                best = best.min(t.elapsed().as_secs_f64() / rows.len() as f64);
                draws += rows.len();
            }
            println!("{label:<36} {:>10.1}", best * 1e6);
        }
    }
}
