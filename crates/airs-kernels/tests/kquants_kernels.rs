//! k-quant kernels through the public API: SIMD vs scalar dot products, scalar dot vs the
//! dequantized rows, Q8_K quantizer golden values, quantizer round-trip error, length errors.

use airs_kernels::{
    ActType, GgmlType, Isa, KernelError, QK_K, act_type, dequantize_row, dot, matmul,
    matmul_matches_scalar, quantize_act, quantize_row, row_bytes,
};

const KQUANTS: [GgmlType; 5] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];
const ROW_LENS: [usize; 4] = [256, 2048, 4864, 5632];

/// splitmix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly gaussian (Irwin–Hall with 4 terms), mean 0, sd ≈ 1.
    fn gauss(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3.0f32.sqrt()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// Random bytes with every f16/f32 super-block factor replaced by a sane positive value.
fn random_weights(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut w = rng.bytes(row_bytes(ty, n).unwrap());
    for b in w.chunks_exact_mut(bb) {
        let d = 0.001 + 0.01 * rng.uniform();
        let dmin = 0.001 + 0.01 * rng.uniform();
        match ty {
            GgmlType::Q2K => {
                b[80..82].copy_from_slice(&f16_bytes(d));
                b[82..84].copy_from_slice(&f16_bytes(dmin));
            }
            GgmlType::Q3K => b[108..110].copy_from_slice(&f16_bytes(d)),
            GgmlType::Q4K | GgmlType::Q5K => {
                b[0..2].copy_from_slice(&f16_bytes(d));
                b[2..4].copy_from_slice(&f16_bytes(dmin));
            }
            GgmlType::Q6K => b[208..210].copy_from_slice(&f16_bytes(d)),
            GgmlType::Q8K => b[0..4].copy_from_slice(&d.to_le_bytes()),
            _ => unreachable!(),
        }
    }
    w
}

fn gauss_row(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gauss() * scale).collect()
}

fn quantized_act(x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; ActType::Q8K.row_bytes(x.len())];
    quantize_act(ActType::Q8K, x, &mut a).unwrap();
    a
}

fn dequantized(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// (Σ w·a in f64, Σ |w·a|) of the dequantized rows: the exact value the kernels approximate and
/// the magnitude that bounds their f32 rounding error.
fn reference_dot(ty: GgmlType, w: &[u8], act: &[u8], n: usize) -> (f64, f64) {
    let wd = dequantized(ty, w, n);
    let ad = dequantized(GgmlType::Q8K, act, n);
    let dot = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum();
    let mag = wd
        .iter()
        .zip(&ad)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum();
    (dot, mag)
}

/// Weight rows to try: random bytes (every bit pattern of quants and scales) and quantized data.
fn weight_rows(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<Vec<u8>> {
    let mut rows = vec![random_weights(rng, ty, n), random_weights(rng, ty, n)];
    let x = gauss_row(rng, n, 0.05);
    let mut q = vec![0u8; row_bytes(ty, n).unwrap()];
    quantize_row(ty, &x, &mut q).unwrap();
    rows.push(q);
    rows
}

#[test]
fn kquants_are_supported_with_q8k_activations() {
    for ty in KQUANTS.into_iter().chain([GgmlType::Q8K]) {
        assert!(airs_kernels::is_supported(ty), "{ty:?}");
        assert_eq!(act_type(ty).unwrap(), ActType::Q8K, "{ty:?}");
    }
}

#[test]
fn simd_dot_matches_scalar() {
    let mut rng = Rng(0x5eed_0001);
    let isas = Isa::all_available();
    eprintln!("ISAs under test: {isas:?}");
    for ty in KQUANTS.into_iter().chain([GgmlType::Q8K]) {
        for n in ROW_LENS {
            let acts = [
                quantized_act(&gauss_row(&mut rng, n, 1.0)),
                // Outliers: one large value per block makes most activation quants small.
                quantized_act(
                    &(0..n)
                        .map(|i| if i % 97 == 0 { 40.0 } else { rng.gauss() })
                        .collect::<Vec<_>>(),
                ),
            ];
            for w in weight_rows(&mut rng, ty, n) {
                for act in &acts {
                    let scalar = dot(Isa::Scalar, ty, n, &w, act).unwrap();
                    let (_, mag) = reference_dot(ty, &w, act, n);
                    for &isa in &isas {
                        let got = dot(isa, ty, n, &w, act).unwrap();
                        let tol = 1e-5 * mag + 1e-6;
                        assert!(
                            ((got - scalar) as f64).abs() <= tol,
                            "{ty:?} n={n} {isa:?}: {got} vs scalar {scalar} (tol {tol})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn scalar_dot_matches_dequantized_rows() {
    let mut rng = Rng(0x5eed_0002);
    for ty in KQUANTS.into_iter().chain([GgmlType::Q8K]) {
        for n in ROW_LENS {
            let act = quantized_act(&gauss_row(&mut rng, n, 1.0));
            for w in weight_rows(&mut rng, ty, n) {
                let got = dot(Isa::Scalar, ty, n, &w, &act).unwrap() as f64;
                let (want, mag) = reference_dot(ty, &w, &act, n);
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-6,
                    "{ty:?} n={n}: scalar {got} vs dequantized {want} (Σ|w·a| = {mag})"
                );
            }
        }
    }
}

#[test]
fn matmul_matches_dot_for_kquants() {
    let mut rng = Rng(0x5eed_0003);
    let n = 512;
    let rows = 5;
    for ty in KQUANTS {
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_weights(&mut rng, ty, n))
            .collect();
        let acts: Vec<u8> = (0..3)
            .flat_map(|_| quantized_act(&gauss_row(&mut rng, n, 1.0)))
            .collect();
        let rb = row_bytes(ty, n).unwrap();
        let ab = ActType::Q8K.row_bytes(n);
        for isa in Isa::all_available() {
            let mut out = vec![0f32; 3 * rows];
            matmul(isa, ty, n, &w, &acts, &mut out, rows).unwrap();
            // Where the multi-row kernels exist, matmul replays the scalar reference's
            // arithmetic bit for bit; elsewhere it runs the per-row dot of `isa`.
            let dot_isa = if matmul_matches_scalar(isa, ty) {
                Isa::Scalar
            } else {
                isa
            };
            for t in 0..3 {
                for r in 0..rows {
                    let want = dot(
                        dot_isa,
                        ty,
                        n,
                        &w[r * rb..(r + 1) * rb],
                        &acts[t * ab..(t + 1) * ab],
                    )
                    .unwrap();
                    assert_eq!(out[t * rows + r], want, "{ty:?} {isa:?} t={t} r={r}");
                }
            }
        }
    }
}

/// Decoded Q8_K block: (d, qs, bsums).
fn q8k_block(b: &[u8]) -> (f32, Vec<i8>, Vec<i16>) {
    let d = f32::from_le_bytes(b[0..4].try_into().unwrap());
    let qs = b[4..260].iter().map(|&v| v as i8).collect();
    let bsums = b[260..292]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    (d, qs, bsums)
}

/// Golden values derived by hand from ggml's `quantize_row_q8_K_ref`:
/// iscale = −127/max (max = signed value of largest magnitude, first one wins ties),
/// q = min(127, nearest_int(iscale·x)) with round-half-to-even, d = 1/iscale, bsums over 16.
#[test]
fn q8k_quantizer_golden() {
    let mut x = vec![0f32; 3 * QK_K];
    // Block 0: max = −127 → iscale = 1, d = 1; values k − 7.5 hit every rounding tie.
    for (i, v) in x[..QK_K].iter_mut().enumerate() {
        *v = (i % 16) as f32 - 7.5;
    }
    x[100] = -127.0;
    // Block 1: max = +254 → iscale = −0.5 exactly, d = −2; −254 later does not win the tie.
    for (i, v) in x[QK_K..2 * QK_K].iter_mut().enumerate() {
        *v = (i % 8) as f32 + 1.0;
    }
    x[QK_K + 3] = 254.0;
    x[QK_K + 20] = -254.0;
    // Block 2: all zero → d = 0, all quants and sums 0.

    let a = quantized_act(&x);
    let (d0, q0, s0) = q8k_block(&a[0..292]);
    let (d1, q1, s1) = q8k_block(&a[292..584]);
    let (d2, q2, s2) = q8k_block(&a[584..876]);

    // nearest_int(k − 7.5) for k = 0..15, ties to even.
    let pattern0: [i8; 16] = [-8, -6, -6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6, 6, 8];
    assert_eq!(d0, 1.0);
    for (i, &q) in q0.iter().enumerate() {
        let want = if i == 100 { -127 } else { pattern0[i % 16] };
        assert_eq!(q, want, "block 0, index {i}");
    }
    let mut want_s0 = [0i16; 16];
    want_s0[6] = -127 - (-4); // index 100 is in group 6 and replaced a −4
    assert_eq!(s0, want_s0);

    // nearest_int(−0.5 · x) for x = 1..8: −0.5→0, −1, −1.5→−2, −2, −2.5→−2, −3, −3.5→−4, −4.
    let pattern1: [i8; 8] = [0, -1, -2, -2, -2, -3, -4, -4];
    assert_eq!(d1, -2.0);
    for (i, &q) in q1.iter().enumerate() {
        let want = match i {
            3 => -127,
            20 => 127,
            _ => pattern1[i % 8],
        };
        assert_eq!(q, want, "block 1, index {i}");
    }
    let mut want_s1 = [-36i16; 16];
    want_s1[0] = -36 - (-2) + (-127);
    want_s1[1] = -36 - (-2) + 127;
    assert_eq!(s1, want_s1);

    assert_eq!(d2, 0.0);
    assert!(q2.iter().all(|&q| q == 0));
    assert!(s2.iter().all(|&s| s == 0));
}

#[test]
fn q8k_quantizer_properties() {
    let mut rng = Rng(0x5eed_0004);
    let x = gauss_row(&mut rng, 16 * QK_K, 3.0);
    let a = quantized_act(&x);
    for (blk, xs) in a.chunks_exact(292).zip(x.chunks_exact(QK_K)) {
        let (d, qs, bsums) = q8k_block(blk);
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!((d.abs() - amax / 127.0).abs() <= 1e-6 * amax);
        for (&q, &v) in qs.iter().zip(xs) {
            assert!((-127..=127).contains(&q));
            assert!((d * q as f32 - v).abs() <= d.abs() * 0.5001);
        }
        for (g, &s) in qs.chunks_exact(16).zip(&bsums) {
            assert_eq!(g.iter().map(|&q| q as i32).sum::<i32>(), s as i32);
        }
    }
}

#[test]
fn quantize_dequantize_round_trip_error() {
    // Relative RMS error bounds on gaussian data (ggml's reference quantizers without
    // importance weights reach roughly: Q2_K 0.27, Q3_K 0.15, Q4_K 0.08, Q5_K 0.04, Q6_K 0.02).
    let bounds = [
        (GgmlType::Q2K, 0.35),
        (GgmlType::Q3K, 0.2),
        (GgmlType::Q4K, 0.1),
        (GgmlType::Q5K, 0.05),
        (GgmlType::Q6K, 0.03),
        (GgmlType::Q8K, 0.01),
    ];
    let mut rng = Rng(0x5eed_0005);
    let n = 64 * QK_K;
    let x = gauss_row(&mut rng, n, 0.02);
    for (ty, bound) in bounds {
        let mut q = vec![0u8; row_bytes(ty, n).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let y = dequantized(ty, &q, n);
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum();
        let sig: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
        let rel = (err / sig).sqrt();
        eprintln!("{ty:?}: relative RMS error {rel:.4}");
        assert!(rel < bound, "{ty:?}: relative RMS error {rel} ≥ {bound}");
    }
}

#[test]
fn quantizers_handle_zero_and_constant_blocks() {
    for ty in KQUANTS.into_iter().chain([GgmlType::Q8K]) {
        for v in [0.0f32, 1.0, -3.0] {
            let x = vec![v; QK_K];
            let mut q = vec![0u8; row_bytes(ty, QK_K).unwrap()];
            quantize_row(ty, &x, &mut q).unwrap();
            let y = dequantized(ty, &q, QK_K);
            for &b in &y {
                assert!(b.is_finite(), "{ty:?} constant {v}");
                assert!(
                    (b - v).abs() <= 0.2 * v.abs() + 1e-6,
                    "{ty:?} constant {v}: got {b}"
                );
            }
        }
    }
}

#[test]
fn wrong_lengths_are_errors() {
    for ty in KQUANTS.into_iter().chain([GgmlType::Q8K]) {
        let n = 512;
        let rb = row_bytes(ty, n).unwrap();
        let ab = ActType::Q8K.row_bytes(n);
        let w = vec![0u8; rb];
        let a = vec![0u8; ab];
        assert!(dot(Isa::Scalar, ty, n, &w, &a).is_ok());
        for isa in Isa::all_available() {
            assert!(matches!(
                dot(isa, ty, n, &w[..rb - 1], &a),
                Err(KernelError::LengthMismatch { .. })
            ));
            assert!(matches!(
                dot(isa, ty, n, &w, &a[..ab - 1]),
                Err(KernelError::LengthMismatch { .. })
            ));
            assert!(matches!(
                dot(isa, ty, n + 32, &w, &a),
                Err(KernelError::RaggedRow { .. } | KernelError::LengthMismatch { .. })
            ));
            assert!(matches!(
                dot(isa, ty, 300, &w, &a),
                Err(KernelError::RaggedRow { .. })
            ));
        }
        let mut out = vec![0f32; n];
        assert!(matches!(
            dequantize_row(ty, &w[..rb - 1], &mut out),
            Err(KernelError::LengthMismatch { .. })
        ));
        assert!(matches!(
            dequantize_row(ty, &w, &mut out[..300]),
            Err(KernelError::RaggedRow { .. })
        ));
        let x = vec![0.5f32; n];
        let mut q = vec![0u8; rb + 1];
        assert!(matches!(
            quantize_row(ty, &x, &mut q),
            Err(KernelError::LengthMismatch { .. })
        ));
        assert!(matches!(
            quantize_row(ty, &x[..100], &mut q),
            Err(KernelError::RaggedRow { .. })
        ));
    }
    let x = vec![0.5f32; 300];
    let mut q = vec![0u8; 292];
    assert!(matches!(
        quantize_act(ActType::Q8K, &x, &mut q),
        Err(KernelError::RaggedRow { .. })
    ));
}
