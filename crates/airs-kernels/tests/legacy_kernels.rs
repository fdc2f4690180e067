//! Float and legacy quant kernels (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) through the
//! public API: SIMD vs scalar agreement on every available `Isa`, scalar dot vs the dot of the
//! dequantized rows, quantizer round trips and golden bytes, float conversions, length errors.

use airs_kernels::{
    ActType, GgmlType, Isa, KernelError, act_type, dequantize_row, dot, quantize_act, quantize_row,
    row_bytes,
};
use half::f16;

const LEGACY: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

const QUANTS: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// Row lengths for quant types (multiples of 32) and extra ragged ones for float types.
const QUANT_LENGTHS: [usize; 9] = [32, 64, 96, 160, 192, 224, 896, 4864, 32 * 37];
const FLOAT_EXTRA_LENGTHS: [usize; 8] = [1, 7, 8, 15, 17, 33, 100, 1000];

/// SplitMix64: a small seeded generator so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// Random floats of several flavours: plain, heavy-tailed (outliers), constant, with zeros.
fn random_floats(rng: &mut Rng, n: usize, flavour: u64) -> Vec<f32> {
    (0..n)
        .map(|i| match flavour % 5 {
            0 => rng.unit(),
            1 => {
                let x = rng.unit();
                if rng.below(50) == 0 {
                    x * 300.0
                } else {
                    x * 0.02
                }
            }
            2 => 0.75,
            3 => {
                if i % 3 == 0 {
                    0.0
                } else {
                    rng.unit() * 1e-3
                }
            }
            _ => rng.unit() * 60000.0,
        })
        .collect()
}

/// A weight row of `ty`: either a quantized random float row or raw random bytes with sane
/// (finite) scales.
fn random_weights(rng: &mut Rng, ty: GgmlType, n: usize, flavour: u64) -> Vec<u8> {
    let bytes = row_bytes(ty, n).unwrap();
    if flavour % 3 != 2 {
        let x = random_floats(rng, n, flavour);
        let mut w = vec![0u8; bytes];
        quantize_row(ty, &x, &mut w).unwrap();
        return w;
    }
    let mut w = rng.bytes(bytes);
    match ty {
        GgmlType::F32 => {
            for c in w.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.unit() * 1000.0).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in w.chunks_exact_mut(2) {
                // Any finite f16 (exponent field < 31).
                let bits = u16::from_le_bytes([c[0], c[1]]);
                let bits = if bits & 0x7C00 == 0x7C00 {
                    bits & !0x4000
                } else {
                    bits
                };
                c.copy_from_slice(&bits.to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16_bits(rng.unit() * 1e12).to_le_bytes());
            }
        }
        _ => {
            // Replace each block's f16 scale (and min) with finite values, keep random codes.
            let block = ty.block_bytes();
            for b in w.chunks_exact_mut(block) {
                b[0..2].copy_from_slice(&f16::from_f32(rng.unit() * 4.0).to_le_bytes());
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    b[2..4].copy_from_slice(&f16::from_f32(rng.unit() * 8.0).to_le_bytes());
                }
            }
        }
    }
    w
}

fn bf16_bits(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

/// An activation row for weights of `ty`, encoded with the public quantizer.
fn random_act(rng: &mut Rng, ty: GgmlType, n: usize, flavour: u64) -> Vec<u8> {
    let act = act_type(ty).unwrap();
    let x: Vec<f32> = match flavour % 4 {
        // All codes at ±127 (Q8_0) / extremes.
        3 => (0..n)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect(),
        f => random_floats(rng, n, f),
    };
    let mut a = vec![0u8; act.row_bytes(n)];
    quantize_act(act, &x, &mut a).unwrap();
    a
}

fn dequant(ty: GgmlType, n: usize, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// The f16 min `m` of each block of an affine quant row, or zeros.
fn block_mins(ty: GgmlType, n: usize, w: &[u8]) -> Vec<f32> {
    let per_block = |b: &[u8]| match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => f16::from_le_bytes([b[2], b[3]]).to_f32(),
        _ => 0.0,
    };
    let block_len = ty.block_len();
    (0..n)
        .map(|i| per_block(&w[i / block_len * ty.block_bytes()..]))
        .collect()
}

/// `(Σ w·a, Σ (|w| + |m|)·|a|)` in f64 over the dequantized rows: the exact dot and the
/// magnitude that bounds float rounding in any summation order.
fn reference_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> (f64, f64) {
    let wf = dequant(ty, n, w);
    let af = dequant(act_type(ty).unwrap().ggml_type(), n, a);
    let mins = block_mins(ty, n, w);
    let mut exact = 0.0f64;
    let mut magnitude = 0.0f64;
    for i in 0..n {
        exact += f64::from(wf[i]) * f64::from(af[i]);
        magnitude += (f64::from(wf[i].abs()) + f64::from(mins[i].abs())) * f64::from(af[i].abs());
    }
    (exact, magnitude)
}

fn lengths(ty: GgmlType) -> Vec<usize> {
    let mut l = QUANT_LENGTHS.to_vec();
    if ty.block_len() == 1 {
        l.extend(FLOAT_EXTRA_LENGTHS);
    }
    l
}

#[test]
fn act_types_follow_ggml_vec_dot_type() {
    assert_eq!(act_type(GgmlType::F32).unwrap(), ActType::F32);
    assert_eq!(act_type(GgmlType::F16).unwrap(), ActType::F16);
    assert_eq!(act_type(GgmlType::BF16).unwrap(), ActType::BF16);
    for ty in QUANTS {
        assert_eq!(act_type(ty).unwrap(), ActType::Q8_0, "{ty:?}");
    }
}

#[test]
fn simd_dot_matches_scalar_on_every_available_isa() {
    let isas = Isa::all_available();
    eprintln!("testing ISAs {isas:?}");
    let mut rng = Rng(0x5EED_0001);
    for ty in LEGACY {
        for n in lengths(ty) {
            for flavour in 0..6u64 {
                let w = random_weights(&mut rng, ty, n, flavour);
                let a = random_act(&mut rng, ty, n, flavour / 2 + flavour);
                let scalar = dot(Isa::Scalar, ty, n, &w, &a).unwrap();
                let (_, magnitude) = reference_dot(ty, n, &w, &a);
                let tolerance = 2e-6 * magnitude + 1e-30;
                for &isa in &isas {
                    let got = dot(isa, ty, n, &w, &a).unwrap();
                    assert!(
                        (f64::from(got) - f64::from(scalar)).abs() <= tolerance,
                        "{ty:?} {isa:?} n={n} flavour={flavour}: {got} vs scalar {scalar} \
                         (tolerance {tolerance})"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_dot_handles_extreme_codes() {
    // Every code at its extremes, the largest f16 scales, activations at ±127.
    let mut rng = Rng(0x5EED_0002);
    for ty in QUANTS {
        for n in [32, 64, 96, 4864] {
            let block = ty.block_bytes();
            for pattern in [0x00u8, 0xFF, 0x80, 0x7F, 0x0F, 0xF0] {
                let mut w = vec![pattern; row_bytes(ty, n).unwrap()];
                for b in w.chunks_exact_mut(block) {
                    b[0..2].copy_from_slice(&f16::from_f32(-65504.0).to_le_bytes());
                    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                        b[2..4].copy_from_slice(&f16::from_f32(65504.0).to_le_bytes());
                    }
                }
                let a = random_act(&mut rng, ty, n, 3);
                let scalar = dot(Isa::Scalar, ty, n, &w, &a).unwrap();
                let (exact, magnitude) = reference_dot(ty, n, &w, &a);
                assert!(
                    (exact - f64::from(scalar)).abs() <= 1e-5 * magnitude,
                    "{ty:?} n={n} pattern={pattern:#x}: scalar {scalar} vs exact {exact}"
                );
                for isa in Isa::all_available() {
                    let got = dot(isa, ty, n, &w, &a).unwrap();
                    assert!(
                        (f64::from(got) - f64::from(scalar)).abs() <= 2e-6 * magnitude,
                        "{ty:?} {isa:?} n={n} pattern={pattern:#x}: {got} vs scalar {scalar}"
                    );
                }
            }
        }
    }
}

#[test]
fn scalar_dot_equals_dot_of_dequantized_rows() {
    let mut rng = Rng(0x5EED_0003);
    for ty in LEGACY {
        for n in lengths(ty) {
            for flavour in 0..6u64 {
                let w = random_weights(&mut rng, ty, n, flavour);
                let a = random_act(&mut rng, ty, n, flavour);
                let got = dot(Isa::Scalar, ty, n, &w, &a).unwrap();
                let (exact, magnitude) = reference_dot(ty, n, &w, &a);
                assert!(
                    (f64::from(got) - exact).abs() <= 1e-5 * magnitude + 1e-30,
                    "{ty:?} n={n} flavour={flavour}: scalar {got} vs dequantized {exact}"
                );
            }
        }
    }
}

#[test]
fn empty_rows_dot_to_zero() {
    for ty in LEGACY {
        for isa in Isa::all_available() {
            assert_eq!(dot(isa, ty, 0, &[], &[]).unwrap(), 0.0, "{ty:?} {isa:?}");
        }
    }
}

#[test]
fn unavailable_isa_runs_the_scalar_reference() {
    let mut rng = Rng(0x5EED_0004);
    let missing: Vec<Isa> = [Isa::Avx2, Isa::Avx512, Isa::Neon]
        .into_iter()
        .filter(|i| !i.is_available())
        .collect();
    for ty in LEGACY {
        let n = 256;
        let w = random_weights(&mut rng, ty, n, 0);
        let a = random_act(&mut rng, ty, n, 0);
        let scalar = dot(Isa::Scalar, ty, n, &w, &a).unwrap();
        for &isa in &missing {
            assert_eq!(dot(isa, ty, n, &w, &a).unwrap(), scalar, "{ty:?} {isa:?}");
        }
    }
}

/// Worst-case |x − dequant(quant(x))| for one block of `x`, from ggml's formulas plus the
/// f16 rounding of the stored scale (and min): relative 2^-11 for normal f16, absolute 2^-25
/// (half the subnormal spacing) for tiny scales, each times the largest code.
fn round_trip_bound(ty: GgmlType, x: &[f32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let min = x.iter().fold(f32::MAX, |m, &v| m.min(v));
    let max = x.iter().fold(-f32::MAX, |m, &v| m.max(v));
    let f16_rel = 1.0 / 1024.0; // > relative rounding of f16 (2^-11), with slack
    let f16_abs = 2f32.powi(-24); // > half the subnormal spacing, with slack
    let scale_rounding = |steps: f32, d: f32| steps * (d * f16_rel + f16_abs);
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => amax * f16_rel + f16_abs,
        GgmlType::BF16 => amax / 128.0,
        // Symmetric: one full step at the clamped end (q = +8 → 7), plus scale rounding.
        GgmlType::Q4_0 => amax / 8.0 + scale_rounding(8.0, amax / 8.0),
        GgmlType::Q5_0 => amax / 16.0 + scale_rounding(16.0, amax / 16.0),
        GgmlType::Q8_0 => amax / 127.0 * 0.5 + scale_rounding(127.0, amax / 127.0),
        // Affine: half a step, plus rounding of d (times ≤ 15 or 31 steps) and of m.
        GgmlType::Q4_1 => {
            let d = (max - min) / 15.0;
            d * 0.5 + scale_rounding(15.0, d) + scale_rounding(1.0, min.abs())
        }
        GgmlType::Q5_1 => {
            let d = (max - min) / 31.0;
            d * 0.5 + scale_rounding(31.0, d) + scale_rounding(1.0, min.abs())
        }
        _ => unreachable!(),
    }
}

#[test]
fn quantize_dequantize_round_trip_within_bounds() {
    let mut rng = Rng(0x5EED_0005);
    for ty in LEGACY {
        for flavour in 0..5u64 {
            let n = 32 * 64;
            let x = random_floats(&mut rng, n, flavour);
            let mut q = vec![0u8; row_bytes(ty, n).unwrap()];
            quantize_row(ty, &x, &mut q).unwrap();
            let y = dequant(ty, n, &q);
            for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
                let bound = round_trip_bound(ty, bx) * 1.0001 + 1e-30;
                for (a, b) in bx.iter().zip(by) {
                    assert!(
                        (a - b).abs() <= bound,
                        "{ty:?} flavour={flavour}: {a} → {b}, bound {bound}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_0_quantizer_matches_ggml_golden_bytes() {
    // x = 0..32: amax = 31, d = 31/127 = 0.244094… → f16 0x33D0, q[j] = roundf(j · 127/31).
    let x: Vec<f32> = (0..32).map(|j| j as f32).collect();
    let mut q = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &x, &mut q).unwrap();
    let expected_codes: [i8; 32] = [
        0, 4, 8, 12, 16, 20, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 66, 70, 74, 78, 82, 86, 90,
        94, 98, 102, 107, 111, 115, 119, 123, 127,
    ];
    assert_eq!(q[..2], [0xD0, 0x33]);
    assert_eq!(
        q[2..].iter().map(|&b| b as i8).collect::<Vec<_>>(),
        expected_codes
    );

    // amax = 127 gives d = 1 (f16 0x3C00); roundf rounds halves away from zero (2.5 → 3,
    // -2.5 → -3, 0.5 → 1), unlike round-to-even.
    let mut x = [0f32; 32];
    x[..8].copy_from_slice(&[127.0, -2.5, 2.5, 0.5, -0.5, 1.5, -1.49, 100.4]);
    quantize_row(GgmlType::Q8_0, &x, &mut q).unwrap();
    assert_eq!(q[..2], [0x00, 0x3C]);
    let codes: Vec<i8> = q[2..10].iter().map(|&b| b as i8).collect();
    assert_eq!(codes, [127, -3, 3, 1, -1, 2, -1, 100]);
    assert!(q[10..].iter().all(|&b| b == 0));

    // An all-zero block: d = 0, id = 0, every code 0.
    quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut q).unwrap();
    assert_eq!(q, [0u8; 34]);

    // quantize_act(Q8_0) is the same quantizer.
    let x: Vec<f32> = (0..32).map(|j| j as f32).collect();
    let mut a = [0u8; 34];
    quantize_act(ActType::Q8_0, &x, &mut a).unwrap();
    quantize_row(GgmlType::Q8_0, &x, &mut q).unwrap();
    assert_eq!(a, q);
}

#[test]
fn q4_and_q5_quantizers_match_ggml_formulas() {
    // x = 0..32: max = 31 → d = 31 / -8 = -3.875 (f16 0xC3C0), id = -8/31;
    // q = min(15, (int8)(x·id + 8.5)).
    let x: Vec<f32> = (0..32).map(|j| j as f32).collect();
    let mut q = [0u8; 18];
    quantize_row(GgmlType::Q4_0, &x, &mut q).unwrap();
    assert_eq!(q[..2], [0xC0, 0xC3]);
    let id = 1.0f32 / (31.0f32 / -8.0);
    for j in 0..16 {
        let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        assert_eq!(q[2 + j], lo | (hi << 4), "byte {j}");
    }
    assert_eq!(q[2] & 0x0F, 8); // x = 0 → 8
    assert_eq!(q[17] >> 4, 0); // x = 31 = max → 0 (value -8·d = 31)

    // Q5_0 of the same: d = -31/16, q = min(31, (int8)(x·id + 16.5)); x = 31 → 0, x = 0 → 16.
    let mut q5 = [0u8; 22];
    quantize_row(GgmlType::Q5_0, &x, &mut q5).unwrap();
    let y = dequant(GgmlType::Q5_0, 32, &q5);
    assert_eq!(y[0], 0.0);
    assert_eq!(y[31], 31.0);

    // Q4_1/Q5_1 of 0..32: m = 0, d = 31/15 or 31/31 = 1 → Q5_1 reproduces 0..32 exactly.
    let mut q51 = [0u8; 24];
    quantize_row(GgmlType::Q5_1, &x, &mut q51).unwrap();
    assert_eq!(q51[..4], [0x00, 0x3C, 0x00, 0x00]);
    assert_eq!(dequant(GgmlType::Q5_1, 32, &q51), x);
}

#[test]
fn dequantizers_follow_ggml_layouts() {
    // Q4_0: d = 1, byte j = low nibble j, high nibble 15 - j.
    let mut b = vec![0x00, 0x3C];
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = dequant(GgmlType::Q4_0, 32, &b);
    for j in 0..16 {
        assert_eq!(y[j], j as f32 - 8.0);
        assert_eq!(y[j + 16], (15 - j) as f32 - 8.0);
    }
    // Q5_0: qh bit j set only for j = 3 and j = 20 (element 20 = high nibble of byte 4).
    let qh: u32 = (1 << 3) | (1 << 20);
    let mut b = vec![0x00, 0x40]; // d = 2
    b.extend(qh.to_le_bytes());
    b.extend([0u8; 16]);
    let y = dequant(GgmlType::Q5_0, 32, &b);
    for (j, &v) in y.iter().enumerate() {
        let expected = if j == 3 || j == 20 { 0.0 } else { -32.0 };
        assert_eq!(v, expected, "element {j}");
    }
    // Q5_1: d = 1, m = -1, all nibbles 0xF, all high bits set → 31 - 1 = 30.
    let mut b = vec![0x00, 0x3C, 0x00, 0xBC, 0xFF, 0xFF, 0xFF, 0xFF];
    b.extend([0xFFu8; 16]);
    assert!(dequant(GgmlType::Q5_1, 32, &b).iter().all(|&v| v == 30.0));
    // Q4_1: d = 0.5, m = 10, nibble 3 low / 4 high.
    let mut b = vec![0x00, 0x38, 0x00, 0x49];
    b.extend([0x43u8; 16]);
    let y = dequant(GgmlType::Q4_1, 32, &b);
    assert!(y[..16].iter().all(|&v| v == 11.5) && y[16..].iter().all(|&v| v == 12.0));
    // Q8_0: d = -1, codes -128..=-97.
    let mut b = vec![0x00, 0xBC];
    b.extend((0..32i32).map(|j| (j - 128) as i8 as u8));
    let y = dequant(GgmlType::Q8_0, 32, &b);
    for (j, &v) in y.iter().enumerate() {
        assert_eq!(v, -f32::from(b[2 + j] as i8));
    }
}

fn f16_of(x: f32) -> u16 {
    let mut out = [0u8; 2];
    quantize_row(GgmlType::F16, &[x], &mut out).unwrap();
    u16::from_le_bytes(out)
}

fn f32_of_f16(bits: u16) -> f32 {
    dequant(GgmlType::F16, 1, &bits.to_le_bytes())[0]
}

fn bf16_of(x: f32) -> u16 {
    let mut out = [0u8; 2];
    quantize_row(GgmlType::BF16, &[x], &mut out).unwrap();
    u16::from_le_bytes(out)
}

#[test]
fn f16_conversion_known_values() {
    assert_eq!(f16_of(1.0), 0x3C00);
    assert_eq!(f16_of(-2.0), 0xC000);
    assert_eq!(f16_of(65504.0), 0x7BFF);
    assert_eq!(f16_of(65519.0), 0x7BFF); // below the midpoint to 65536
    assert_eq!(f16_of(65520.0), 0x7C00); // the midpoint rounds to even: overflow to inf
    assert_eq!(f16_of(f32::INFINITY), 0x7C00);
    assert_eq!(f16_of(f32::NEG_INFINITY), 0xFC00);
    assert_eq!(f16_of(f32::NAN), 0x7E00);
    assert_eq!(f16_of(0.0), 0x0000);
    assert_eq!(f16_of(-0.0), 0x8000);
    assert_eq!(f16_of(2f32.powi(-14)), 0x0400); // smallest normal
    assert_eq!(f16_of(2f32.powi(-24)), 0x0001); // smallest subnormal
    assert_eq!(f16_of(2f32.powi(-25)), 0x0000); // tie → even (0)
    assert_eq!(f16_of(3.0 * 2f32.powi(-25)), 0x0002); // tie between 1 and 2 → even (2)
    assert_eq!(f16_of(1.0 + 2f32.powi(-11)), 0x3C00); // tie → even
    assert_eq!(f16_of(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02); // tie → even
    assert_eq!(f16_of(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3C01); // above the tie

    assert_eq!(f32_of_f16(0x3C00), 1.0);
    assert_eq!(f32_of_f16(0x7BFF), 65504.0);
    assert_eq!(f32_of_f16(0x0001), 2f32.powi(-24));
    assert_eq!(f32_of_f16(0x03FF), 1023.0 * 2f32.powi(-24));
    assert_eq!(f32_of_f16(0x8000).to_bits(), (-0.0f32).to_bits());
    assert_eq!(f32_of_f16(0x7C00), f32::INFINITY);
    assert!(f32_of_f16(0x7E00).is_nan());
    // Every finite f16 converts exactly (agrees with the `half` crate) and round-trips.
    for bits in 0..=u16::MAX {
        let v = f32_of_f16(bits);
        if v.is_nan() {
            assert!(f16::from_bits(bits).is_nan());
            continue;
        }
        assert_eq!(
            v.to_bits(),
            f16::from_bits(bits).to_f32().to_bits(),
            "{bits:#x}"
        );
        assert_eq!(f16_of(v), bits, "{bits:#x}");
    }
}

#[test]
fn f16_rounding_agrees_with_round_to_nearest_even() {
    let mut rng = Rng(0x5EED_0006);
    for _ in 0..200_000 {
        let x = f32::from_bits(rng.next_u64() as u32);
        if x.is_nan() {
            continue;
        }
        assert_eq!(f16_of(x), f16::from_f32(x).to_bits(), "{x:e}");
    }
}

#[test]
fn bf16_conversion_known_values() {
    assert_eq!(bf16_of(1.0), 0x3F80);
    assert_eq!(bf16_of(-2.0), 0xC000);
    assert_eq!(bf16_of(1.0 + 2f32.powi(-8)), 0x3F80); // tie → even
    assert_eq!(bf16_of(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82); // tie → even
    assert_eq!(bf16_of(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3F81);
    assert_eq!(bf16_of(f32::MAX), 0x7F80); // rounds up to inf, as ggml
    assert_eq!(bf16_of(f32::INFINITY), 0x7F80);
    assert_eq!(bf16_of(f32::from_bits(0x0001_16C2)), 0x0001); // subnormals are kept
    // NaN stays NaN and is forced quiet: (bits >> 16) | 64.
    assert_eq!(bf16_of(f32::from_bits(0x7F80_0001)), 0x7FC0);
    assert_eq!(bf16_of(f32::from_bits(0xFF81_2345)), 0xFFC1);
    let back = dequant(GgmlType::BF16, 2, &[0x80, 0x3F, 0x49, 0x40]);
    assert_eq!(back, [1.0, f32::from_bits(0x4049_0000)]);
}

#[test]
fn wrong_lengths_are_errors_not_panics() {
    for ty in LEGACY {
        let n = 64;
        let w = vec![0u8; row_bytes(ty, n).unwrap()];
        let act = act_type(ty).unwrap();
        let a = vec![0u8; act.row_bytes(n)];
        for isa in Isa::all_available() {
            assert!(dot(isa, ty, n, &w, &a).is_ok());
            assert!(matches!(
                dot(isa, ty, n, &w[..w.len() - 1], &a),
                Err(KernelError::LengthMismatch { .. })
            ));
            assert!(matches!(
                dot(isa, ty, n, &w, &a[..a.len() - 1]),
                Err(KernelError::LengthMismatch { .. })
            ));
            let mut longer = a.clone();
            longer.push(0);
            assert!(matches!(
                dot(isa, ty, n, &w, &longer),
                Err(KernelError::LengthMismatch { .. })
            ));
        }
        let x = vec![0.5f32; n];
        let mut out = vec![0u8; w.len() + 1];
        assert!(matches!(
            quantize_row(ty, &x, &mut out),
            Err(KernelError::LengthMismatch { .. })
        ));
        let mut deq = vec![0f32; n];
        assert!(matches!(
            dequantize_row(ty, &w[1..], &mut deq),
            Err(KernelError::LengthMismatch { .. })
        ));
        if ty.block_len() > 1 {
            assert!(matches!(
                dot(Isa::Scalar, ty, 40, &w, &a),
                Err(KernelError::RaggedRow { .. })
            ));
            assert!(matches!(
                quantize_row(ty, &x[..40], &mut out),
                Err(KernelError::RaggedRow { .. })
            ));
        }
    }
    assert!(matches!(
        dot(Isa::Scalar, GgmlType::Q8_1, 32, &[0; 36], &[0; 34]),
        Err(KernelError::UnsupportedType(GgmlType::Q8_1))
    ));
}
