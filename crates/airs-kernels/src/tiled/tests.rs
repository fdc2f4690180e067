//! Unit tests of the tiled layout: the scalar block decoder against the dequantizers, the
//! SIMD repackers byte for byte against the scalar repacker.

use super::*;
#[cfg(target_arch = "x86_64")]
use crate::Isa;

fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(super) const TYPES: [GgmlType; 10] = [
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

/// `rows` quantized rows of `n` random values.
pub(super) fn random_rows(ty: GgmlType, n: usize, rows: usize, seed: &mut u64) -> Vec<u8> {
    let rb = crate::row_bytes(ty, n).unwrap();
    let mut w = vec![0u8; rows * rb];
    for row in w.chunks_exact_mut(rb) {
        let x: Vec<f32> = (0..n)
            .map(|_| ((rng(seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0)
            .collect();
        crate::quantize_row(ty, &x, row).unwrap();
    }
    w
}

#[test]
fn decoded_blocks_equal_dequantized_rows() {
    let mut seed = 1;
    for ty in TYPES {
        let n = 512;
        let w = random_rows(ty, n, 1, &mut seed);
        let mut want = vec![0f32; n];
        crate::dequantize_row(ty, &w, &mut want).unwrap();
        match kind(ty).unwrap().0 {
            Kind::Legacy { .. } => {
                let mut codes = [0i8; 32];
                for b in 0..n / 32 {
                    let (d, m) = decode_legacy(ty, &w, b, &mut codes);
                    for j in 0..32 {
                        assert_eq!(
                            d * f32::from(codes[j]) + m,
                            want[32 * b + j],
                            "{ty} {b} {j}"
                        );
                    }
                }
            }
            Kind::K { block, .. } => {
                let mut codes = [0i8; 32];
                for s in 0..n / 256 {
                    let (d, dmin) = k_factors(ty, &w, s);
                    for j in 0..subs(block) {
                        let (sc, m) = decode_k(ty, &w, s, j, &mut codes[..block]);
                        for (l, &c) in codes[..block].iter().enumerate() {
                            // ggml's dequantizers: (d·sc)·q − dmin·m.
                            let got = (d * sc as f32) * f32::from(c) - dmin * m as f32;
                            let i = 256 * s + block * j + l;
                            assert_eq!(got, want[i], "{ty} superblock {s} sub-block {j} value {l}");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_repack_matches_scalar_repack() {
    if !available(Isa::Avx512) {
        return;
    }
    let mut seed = 2;
    for ty in TYPES {
        let (kind, _) = kind(ty).unwrap();
        for rows in [1, 5, 16] {
            let n = 512;
            let rb = crate::row_bytes(ty, n).unwrap();
            let w = random_rows(ty, n, rows, &mut seed);
            let tb = tile_bytes(kind, n, x86::TILE);
            let (mut a, mut b) = (vec![0xAAu8; tb], vec![0x55u8; tb]);
            repack_scalar(ty, kind, n, &w, rb, x86::TILE, 0x80, &mut a);
            // SAFETY: `available` checked the CPU features.
            unsafe { x86::repack(ty, kind, n, &w, rb, &mut b) };
            assert!(a == b, "{ty} rows {rows}: SIMD repack differs from scalar");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_tiles_from_rows16_groups_equal_tiles_from_the_files_rows() {
    if !available(Isa::Avx512) {
        return;
    }
    let mut seed = 3;
    for ty in crate::rows16::TYPES {
        assert!(crate::rows16::has_layout(ty));
        let (kind, _) = kind(ty).unwrap();
        let n = 512;
        let rb = crate::row_bytes(ty, n).unwrap();
        let w = random_rows(ty, n, x86::TILE, &mut seed);
        let mut packed = vec![0u8; w.len()];
        crate::rows16::repack_group(ty, n, &w, &mut packed).unwrap();
        let tb = tile_bytes(kind, n, x86::TILE);
        let (mut a, mut b) = (vec![0xAAu8; tb], vec![0x55u8; tb]);
        // SAFETY: `available` checked the CPU features.
        unsafe {
            x86::repack(ty, kind, n, &w, rb, &mut a);
            x86::repack_rows16(ty, n, &packed, &mut b);
        }
        assert!(a == b, "{ty}: the tile from the rows16 group differs");
    }
}

/// Every rows16 type and instruction set with tiled kernels: products over repacked groups
/// equal those over the file's rows, bit for bit, for several token counts (a partial token
/// group included) and an output stride wider than the rows.
#[test]
fn prepared_products_of_rows16_groups_equal_those_of_the_files_rows() {
    let mut seed = 4;
    let mut compared = 0;
    for isa in [crate::Isa::detect(), crate::Isa::Scalar] {
        for ty in crate::rows16::TYPES {
            let n = 512;
            let rows = 3 * crate::rows16::GROUP_ROWS;
            let w = random_rows(ty, n, rows, &mut seed);
            let group_bytes = w.len() / 3;
            let mut packed = vec![0u8; w.len()];
            for (natural, group) in w
                .chunks_exact(group_bytes)
                .zip(packed.chunks_exact_mut(group_bytes))
            {
                crate::rows16::repack_group(ty, n, natural, group).unwrap();
            }
            let act = crate::act_type(ty).unwrap();
            for tokens in [19, 40] {
                let acts = random_acts(act, n, tokens, &mut seed);
                let mut prep = PreparedActs::new();
                if !crate::prepare_acts(isa, ty, n, &acts, &mut prep).unwrap() {
                    continue;
                }
                let stride = rows + 5;
                let mut want = vec![f32::NAN; tokens * stride];
                let mut got = vec![f32::NAN; tokens * stride];
                crate::matmul_prepared(isa, ty, n, &w, &prep, &mut want, stride).unwrap();
                crate::matmul_prepared_rows16(isa, ty, n, &packed, &prep, &mut got, stride)
                    .unwrap();
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{isa:?} {ty} {tokens} tokens"
                );
                compared += 1;
            }
            assert!(
                crate::matmul_prepared_rows16(
                    isa,
                    ty,
                    n,
                    &packed[..group_bytes / 2],
                    &PreparedActs::new(),
                    &mut [0.0; 64],
                    64
                )
                .is_err()
            );
        }
    }
    assert_eq!(compared > 0, available(crate::Isa::detect()));
}

/// `tokens` activation rows of `n` random values in encoding `act`.
fn random_acts(act: ActType, n: usize, tokens: usize, seed: &mut u64) -> Vec<u8> {
    let row_bytes = act.row_bytes(n);
    let mut acts = vec![0u8; tokens * row_bytes];
    for row in acts.chunks_exact_mut(row_bytes) {
        let x: Vec<f32> = (0..n)
            .map(|_| ((rng(seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0)
            .collect();
        crate::quantize_act(act, &x, row).unwrap();
    }
    acts
}

#[test]
fn block_sums_of_i8_codes_equal_the_scalar_sum() {
    let mut seed = 5;
    let mut cases: Vec<[u8; 32]> = vec![[0x80; 32], [0x7F; 32], [0; 32], [0xFF; 32]];
    cases.extend((0..2000).map(|_| std::array::from_fn(|_| rng(&mut seed) as u8)));
    for codes in &cases {
        assert_eq!(sum_i8(codes), sum_i8_scalar(codes), "{codes:?}");
    }
    assert_eq!(sum_i8(&[0x80; 32]), -128 * 32);
    assert_eq!(sum_i8(&[0x7F; 32]), 127 * 32);
}
