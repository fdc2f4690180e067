//! `matmul` and `matmul_prepared` against the scalar per-row `dot`: every supported type,
//! several shapes, 1..=17 (and 33, 40) activation rows, every available instruction set,
//! strided output.

use airs_kernels::{
    GgmlType, Isa, PreparedActs, act_type, dequantize_row, dot, matmul, matmul_matches_scalar,
    matmul_prepared, prepare_acts, quantize_act, quantize_row, row_bytes,
};

const TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), with occasional outliers when `spiky`.
    fn value(&mut self, spiky: bool) -> f32 {
        let x = (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        if spiky && self.next_u64().is_multiple_of(40) {
            x * 50.0
        } else {
            x
        }
    }
}

fn lengths(ty: GgmlType) -> &'static [usize] {
    match ty.block_len() {
        1 => &[1, 7, 33, 96, 896],
        32 => &[32, 96, 896],
        _ => &[256, 768],
    }
}

/// Quantized random rows and their dequantized values.
fn rows_of(rng: &mut Rng, ty: GgmlType, n: usize, rows: usize, spiky: bool) -> (Vec<u8>, Vec<f32>) {
    let rb = row_bytes(ty, n).unwrap();
    let mut w = vec![0u8; rows * rb];
    let mut f = vec![0f32; rows * n];
    for (row, fr) in w.chunks_exact_mut(rb).zip(f.chunks_exact_mut(n)) {
        let x: Vec<f32> = (0..n).map(|_| rng.value(spiky)).collect();
        quantize_row(ty, &x, row).unwrap();
        dequantize_row(ty, row, fr).unwrap();
    }
    (w, f)
}

fn acts_of(rng: &mut Rng, ty: GgmlType, n: usize, tokens: usize) -> (Vec<u8>, Vec<f32>) {
    let act = act_type(ty).unwrap();
    let rb = act.row_bytes(n);
    let mut a = vec![0u8; tokens * rb];
    let mut f = vec![0f32; tokens * n];
    for (t, (row, fr)) in a
        .chunks_exact_mut(rb)
        .zip(f.chunks_exact_mut(n))
        .enumerate()
    {
        let x: Vec<f32> = (0..n).map(|_| rng.value(t % 3 == 1)).collect();
        quantize_act(act, &x, row).unwrap();
        dequantize_row(act.ggml_type(), row, fr).unwrap();
    }
    (a, f)
}

/// Bound on the f32 rounding of any summation order: Σ |a_i| · 2 max |w| over i's 32-block
/// (covers the affine types' min terms, which are at most the block's largest value).
fn magnitude(w: &[f32], a: &[f32]) -> f32 {
    let mut m = 0.0;
    for (wb, ab) in w.chunks(32).zip(a.chunks(32)) {
        let wmax = wb.iter().fold(0f32, |m, v| m.max(v.abs()));
        m += 2.0 * wmax * ab.iter().map(|v| v.abs()).sum::<f32>();
    }
    m
}

/// The `dot` that `matmul` must equal bit for bit: the scalar reference where
/// `matmul_matches_scalar` says so (the multi-row kernels replay its float operations after
/// exact integer block sums), otherwise the per-row dot of the same `isa` (the AVX2 multi-row
/// kernels replay it; float weights always take their per-row dot).
fn exact_reference(ty: GgmlType, isa: Isa) -> Isa {
    if matmul_matches_scalar(isa, ty) {
        Isa::Scalar
    } else {
        isa
    }
}

/// AVX-512 VNNI on x86-64, NEON with `sdot` on aarch64.
fn has_exact_kernels(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(target_arch = "aarch64")]
    {
        isa == Isa::Neon && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        false
    }
}

#[test]
fn exactness_is_reported_for_every_quant_type() {
    for ty in TYPES {
        let quant = ty.block_len() > 1;
        for isa in Isa::all_available() {
            let want = isa == Isa::Scalar || (quant && has_exact_kernels(isa));
            assert_eq!(matmul_matches_scalar(isa, ty), want, "{ty} {isa:?}");
        }
    }
}

#[test]
fn matmul_matches_scalar_dot_for_every_shape_and_isa() {
    let mut rng = Rng(42);
    for ty in TYPES {
        for &n in lengths(ty) {
            for (rows, spiky) in [(1, false), (5, true), (16, false), (17, true), (40, false)] {
                let (w, wf) = rows_of(&mut rng, ty, n, rows, spiky);
                let wrb = w.len() / rows;
                let (a, af) = acts_of(&mut rng, ty, n, 40);
                let arb = a.len() / 40;
                // 1..=17 covers every group remainder and the decode / tiled switch; 33 and 40
                // are batches of many sequences' rows.
                for tokens in (1..=17).chain([33, 40]) {
                    let acts = &a[..tokens * arb];
                    let stride = rows + 3;
                    for isa in Isa::all_available() {
                        let mut out = vec![f32::NAN; (tokens - 1) * stride + rows + 3];
                        matmul(isa, ty, n, &w, acts, &mut out, stride).unwrap();
                        for t in 0..tokens {
                            for r in 0..rows + 3 {
                                let got = out[t * stride + r];
                                if r >= rows {
                                    assert!(got.is_nan(), "{ty} wrote past row {rows}");
                                    continue;
                                }
                                let want = dot(
                                    Isa::Scalar,
                                    ty,
                                    n,
                                    &w[r * wrb..(r + 1) * wrb],
                                    &acts[t * arb..(t + 1) * arb],
                                )
                                .unwrap();
                                let w_r = &w[r * wrb..(r + 1) * wrb];
                                let a_t = &acts[t * arb..(t + 1) * arb];
                                let exact = match exact_reference(ty, isa) {
                                    Isa::Scalar => want,
                                    i => dot(i, ty, n, w_r, a_t).unwrap(),
                                };
                                assert!(
                                    got.to_bits() == exact.to_bits(),
                                    "{ty} {isa:?} n {n} rows {rows} tokens {tokens} \
                                     (r {r}, t {t}): {got} is not bit-identical to {exact}"
                                );
                                let mag =
                                    magnitude(&wf[r * n..(r + 1) * n], &af[t * n..(t + 1) * n]);
                                assert!(
                                    (got - want).abs() <= 2e-6 * mag + 1e-6,
                                    "{ty} {isa:?} n {n} rows {rows} tokens {tokens} \
                                     (r {r}, t {t}): {got} vs scalar {want} (mag {mag})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn prepared_matmul_over_row_chunks_matches_matmul() {
    let mut rng = Rng(7);
    for ty in TYPES {
        let n = lengths(ty)[lengths(ty).len() - 1];
        let rows = 45;
        let (w, _) = rows_of(&mut rng, ty, n, rows, true);
        let wrb = w.len() / rows;
        for tokens in [1, 2, 3, 4, 9, 17, 33] {
            let (a, _) = acts_of(&mut rng, ty, n, tokens);
            for isa in Isa::all_available() {
                let mut want = vec![0f32; tokens * rows];
                matmul(isa, ty, n, &w, &a, &mut want, rows).unwrap();
                let mut prep = PreparedActs::new();
                if !prepare_acts(isa, ty, n, &a, &mut prep).unwrap() {
                    assert!(
                        tokens == 1
                            || matmul_prepared(isa, ty, n, &w, &prep, &mut want, rows).is_err()
                    );
                    continue;
                }
                assert_eq!(prep.tokens(), tokens);
                // Chunks of 16, 16, 13 rows written into a strided tile each, as the engine does.
                let mut got = vec![0f32; tokens * rows];
                for r0 in (0..rows).step_by(16) {
                    let r1 = (r0 + 16).min(rows);
                    let width = r1 - r0;
                    let mut tile = vec![f32::NAN; tokens * width];
                    matmul_prepared(isa, ty, n, &w[r0 * wrb..r1 * wrb], &prep, &mut tile, width)
                        .unwrap();
                    for t in 0..tokens {
                        got[t * rows + r0..t * rows + r1]
                            .copy_from_slice(&tile[t * width..(t + 1) * width]);
                    }
                }
                assert_eq!(got, want, "{ty} {isa:?} tokens {tokens}");
            }
        }
    }
}

#[test]
fn prepared_activations_must_match_the_weights() {
    let mut rng = Rng(9);
    let n = 256;
    let (a, _) = acts_of(&mut rng, GgmlType::Q8_0, n, 4);
    let (w, _) = rows_of(&mut rng, GgmlType::Q8_0, n, 2, false);
    let mut out = vec![0f32; 8];
    let isa = Isa::detect();
    let mut prep = PreparedActs::new();
    if !prepare_acts(isa, GgmlType::Q8_0, n, &a, &mut prep).unwrap() {
        return;
    }
    // Other n, other layout: refused, not misread.
    assert!(matmul_prepared(isa, GgmlType::Q8_0, 224, &w[..2 * 238], &prep, &mut out, 2).is_err());
    let (w6, _) = rows_of(&mut rng, GgmlType::Q6K, n, 2, false);
    assert!(matmul_prepared(isa, GgmlType::Q6K, n, &w6, &prep, &mut out, 2).is_err());
    assert!(matmul_prepared(isa, GgmlType::Q8_0, n, &w, &prep, &mut out, 2).is_ok());
    // Short output: an error.
    assert!(matmul_prepared(isa, GgmlType::Q8_0, n, &w, &prep, &mut out[..7], 2).is_err());
}

/// What continuous batching relies on: a token's row of a matmul is the same bits whether it is
/// computed alone or among any number of other rows (other sequences' decode rows, prefill
/// chunks), for every weight type and instruction set.
#[test]
fn a_rows_result_never_depends_on_the_rows_batched_with_it() {
    let mut rng = Rng(11);
    for ty in TYPES {
        let n = lengths(ty)[lengths(ty).len() - 1];
        let rows = 37;
        let (w, _) = rows_of(&mut rng, ty, n, rows, true);
        let (a, _) = acts_of(&mut rng, ty, n, 48);
        let arb = a.len() / 48;
        for isa in Isa::all_available() {
            let alone: Vec<Vec<f32>> = (0..48)
                .map(|t| {
                    let mut out = vec![0f32; rows];
                    matmul(isa, ty, n, &w, &a[t * arb..(t + 1) * arb], &mut out, rows).unwrap();
                    out
                })
                .collect();
            for (first, tokens) in [(0, 2), (3, 5), (1, 16), (7, 33), (0, 48)] {
                let mut out = vec![0f32; tokens * rows];
                let acts = &a[first * arb..(first + tokens) * arb];
                matmul(isa, ty, n, &w, acts, &mut out, rows).unwrap();
                for t in 0..tokens {
                    let got = &out[t * rows..(t + 1) * rows];
                    let want = &alone[first + t];
                    assert!(
                        got.iter()
                            .zip(want)
                            .all(|(g, w)| g.to_bits() == w.to_bits()),
                        "{ty} {isa:?}: row {} batched with {tokens} differs from alone",
                        first + t
                    );
                }
            }
        }
    }
}
