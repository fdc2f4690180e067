//! Decode-case throughput of the float / legacy-quant dot products: one activation row against
//! a weight matrix (Qwen2.5-0.5B FFN shapes, 896 × 4864 and 4864 × 896), single-threaded,
//! reported as GB/s of weight bytes streamed.
//!
//! Three cache regimes: "l2" reuses the first rows of the matrix (≤ 512 KiB, L2-resident: the
//! kernel's compute speed), "l3" reuses the whole matrix (it fits in L3), "dram" walks a ring
//! of copies larger than L3, as decode does over a whole model.
//!
//! `cargo bench -p airs-kernels --bench legacy_dot [-- FILTER...]` (a row runs if its label
//! contains every FILTER word, e.g. `q8_0 avx512`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use airs_kernels::{GgmlType, Isa, act_type, matmul, quantize_act, quantize_row, row_bytes};

const TYPES: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// (rows, n): ffn_down (n = 4864) and ffn_gate/up (n = 896) of Qwen2.5-0.5B.
const SHAPES: [(usize, usize); 2] = [(896, 4864), (4864, 896)];

/// Bytes of the L2-resident slice of rows in "l2" mode.
const L2_BYTES: usize = 512 << 10;

/// Total bytes of the ring of weight copies in "dram" mode (well above a 32 MiB L3).
const DRAM_RING_BYTES: usize = 256 << 20;

fn pseudo_random_floats(n: usize, seed: u64) -> Vec<f32> {
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

/// The fastest single call of `f` seen within `budget` (the minimum filters out preemption on
/// a shared machine; every call is a full matrix-vector product, so "dram" calls still stream).
fn fastest_call(mut f: impl FnMut(), budget: Duration) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    while start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
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
        "{:<40} {:>10} {:>10}",
        "case (single thread)", "µs/matvec", "GB/s"
    );
    for (rows, n) in SHAPES {
        for ty in TYPES {
            let w_row = row_bytes(ty, n).unwrap();
            let matrix_bytes = rows * w_row;
            let act = act_type(ty).unwrap();
            let mut a = vec![0u8; act.row_bytes(n)];
            quantize_act(act, &pseudo_random_floats(n, 7), &mut a).unwrap();
            let mut w = vec![0u8; matrix_bytes];
            for (r, row) in w.chunks_exact_mut(w_row).enumerate() {
                quantize_row(ty, &pseudo_random_floats(n, r as u64), row).unwrap();
            }
            for regime in ["l2", "l3", "dram"] {
                let (rows, matrix_bytes) = match regime {
                    "l2" => {
                        let r = (L2_BYTES / w_row).clamp(1, rows);
                        (r, r * w_row)
                    }
                    _ => (rows, matrix_bytes),
                };
                let copies = if regime == "dram" {
                    DRAM_RING_BYTES.div_ceil(matrix_bytes)
                } else {
                    1
                };
                let labels: Vec<(Isa, String)> = Isa::all_available()
                    .into_iter()
                    .map(|isa| {
                        let name = format!("{isa:?}").to_lowercase();
                        (isa, format!("{} {rows}x{n} {regime} {name}", ty.name()))
                    })
                    .filter(|(_, l)| wanted(l))
                    .collect();
                if labels.is_empty() {
                    continue;
                }
                let ring: Vec<Vec<u8>> = (0..copies).map(|_| w[..matrix_bytes].to_vec()).collect();
                let mut out = vec![0f32; rows];
                for (isa, label) in labels {
                    let mut next = 0;
                    let seconds = fastest_call(
                        || {
                            let m = &ring[next];
                            next = (next + 1) % ring.len();
                            matmul(isa, ty, n, black_box(m), black_box(&a), &mut out, rows)
                                .unwrap();
                            black_box(&out);
                        },
                        Duration::from_millis(400),
                    );
                    let gbps = matrix_bytes as f64 / seconds / 1e9;
                    println!("{label:<40} {:>10.1} {gbps:>10.2}", seconds * 1e6);
                }
            }
        }
    }
}
