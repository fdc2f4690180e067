//! Single-thread matmul throughput on Qwen2.5-0.5B shapes, decode (T = 1) and prefill
//! (T = 64), in GFLOP/s (2·rows·n·T per call) and GB/s of weight bytes.
//!
//! Modes: `matmul` (the public entry, preparing activations itself), `prepared` (activations
//! prepared once outside the timed call, as the engine does), `rowdot` (the per-row `dot`
//! loop that `matmul` used before the tiled kernels, for comparison).
//!
//! `cargo bench -p airs-kernels --bench matmul [-- FILTER...]` (a case runs if its label
//! contains every FILTER word, e.g. `q5_0 T64`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use airs_kernels::{
    GgmlType, Isa, PreparedActs, act_type, dot, matmul, matmul_prepared, prepare_acts,
    quantize_act, quantize_row, row_bytes,
};

/// (type, rows, n): attn_q/o (896×896), ffn_gate/up (4864×896), ffn_down (896×4864).
const CASES: [(GgmlType, usize, usize); 7] = [
    (GgmlType::Q5_0, 896, 896),
    (GgmlType::Q5_0, 4864, 896),
    (GgmlType::Q8_0, 4864, 896),
    (GgmlType::Q4_0, 4864, 896),
    (GgmlType::Q4K, 896, 4864),
    (GgmlType::Q6K, 896, 4864),
    (GgmlType::F32, 896, 896),
];

/// Activation rows per call: 1 and 64, or the list in `AIRS_BENCH_TOKENS` (e.g. `1,2,4,8`).
fn token_counts() -> Vec<usize> {
    std::env::var("AIRS_BENCH_TOKENS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 64])
}

fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

fn fastest_call(mut f: impl FnMut(), budget: Duration) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut calls = 0;
    while start.elapsed() < budget || calls < 3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        calls += 1;
    }
    best
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |label: &str| filters.iter().all(|f| label.contains(f.as_str()));
    println!(
        "{:<44} {:>10} {:>9} {:>8}",
        "case (single thread)", "µs/call", "GFLOP/s", "GB/s"
    );
    for (ty, rows, n) in CASES {
        let wrb = row_bytes(ty, n).unwrap();
        // 16 distinct quantized rows, tiled (the reference quantizers are slow).
        let distinct: Vec<Vec<u8>> = (0..16)
            .map(|r| {
                let mut q = vec![0u8; wrb];
                quantize_row(ty, &floats(n, r), &mut q).unwrap();
                q
            })
            .collect();
        let w: Vec<u8> = (0..rows).flat_map(|r| distinct[r % 16].clone()).collect();
        let act = act_type(ty).unwrap();
        let arb = act.row_bytes(n);
        for tokens in token_counts() {
            let mut a = vec![0u8; tokens * arb];
            for (t, row) in a.chunks_exact_mut(arb).enumerate() {
                quantize_act(act, &floats(n, 1000 + t as u64), row).unwrap();
            }
            let mut out = vec![0f32; tokens * rows];
            for isa in Isa::all_available() {
                let isa_name = format!("{isa:?}").to_lowercase();
                for mode in ["matmul", "prepared", "rowdot"] {
                    let label = format!("{} {rows}x{n} T{tokens} {isa_name} {mode}", ty.name());
                    if !wanted(&label) || (isa == Isa::Scalar && mode != "matmul") {
                        continue;
                    }
                    let mut prep = PreparedActs::new();
                    if mode == "prepared" && !prepare_acts(isa, ty, n, &a, &mut prep).unwrap() {
                        continue;
                    }
                    let budget = Duration::from_millis(if isa == Isa::Scalar { 300 } else { 600 });
                    let seconds = fastest_call(
                        || match mode {
                            "matmul" => {
                                matmul(isa, ty, n, black_box(&w), black_box(&a), &mut out, rows)
                                    .unwrap()
                            }
                            "prepared" => {
                                matmul_prepared(isa, ty, n, black_box(&w), &prep, &mut out, rows)
                                    .unwrap()
                            }
                            _ => {
                                let tile = (256 * 1024 / wrb).clamp(1, 64);
                                for r0 in (0..rows).step_by(tile) {
                                    for t in 0..tokens {
                                        let at = &a[t * arb..(t + 1) * arb];
                                        for r in r0..(r0 + tile).min(rows) {
                                            out[t * rows + r] =
                                                dot(isa, ty, n, &w[r * wrb..(r + 1) * wrb], at)
                                                    .unwrap();
                                        }
                                    }
                                }
                            }
                        },
                        budget,
                    );
                    black_box(&out);
                    let gflops = 2.0 * (rows * n * tokens) as f64 / seconds / 1e9;
                    let gbps = w.len() as f64 / seconds / 1e9;
                    println!(
                        "{label:<44} {:>10.1} {gflops:>9.1} {gbps:>8.2}",
                        seconds * 1e6
                    );
                }
            }
        }
    }
}
