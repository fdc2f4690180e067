//! Multi-row matrix products: tiled prefill kernels (many weight rows × several tokens per
//! pass, each weight block unpacked once for all tokens) and multi-row decode kernels (16 or 4
//! rows per pass against one token), for every quant type with a layout here.
//!
//! What: [`kind`] writes each weight type as integer codes with per-block scales, replaying its
//! scalar reference's arithmetic: legacy quants (Q8_0 activations) `sum + sumi·(dx·dy)` per
//! 32-value block (affine: `+ m·(dy·Σy)`); k-quants (Q8_K activations) integer sub-block scales
//! and mins applied to exact integer dots, `sum + ((d·dy)·isum − (dmin·dy)·Σ m·Σy)` per 256.
//! Prefill: weight rows are repacked a tile at a time (16 rows on x86, 8 on NEON) into a
//! per-thread, cache-resident buffer, interleaved so that one register holds 4 consecutive
//! codes of each row; activations are rearranged once per matmul ([`PreparedActs`]: per
//! group of [`GROUP`] tokens and block, the tokens' codes side by side with `dy`, `−128·Σy`,
//! `dy·Σy` or the k-quant sub-block sums). The micro-kernel broadcasts 4 codes of one token and
//! multiply-accumulates them into all rows of the tile (`vpdpbusd` with a broadcast memory
//! operand on AVX-512 VNNI, `sdot` by element on NEON): no horizontal sums, and the float steps
//! run once per (block, token) for all rows. Decode reads rows in place and folds per-row
//! partial sums into one register of row dots (see `x86_decode` and `neon`).
//!
//! Exactness: integer block dots are exact, and every lane then performs the scalar
//! reference's float operations in its order (no FMA contraction), so results are
//! bit-identical to `dot(Isa::Scalar, ..)` — for every number of tokens, chunking of rows and
//! thread count. Batched prefill and token-by-token decode therefore give identical logits,
//! which models with large activation outliers (Qwen2.5) need: there, f32 reordering alone
//! moves logits by ~0.1. Float weights (F32/F16/BF16) are not tiled: [`crate::matmul`] runs
//! their per-row dot for any number of tokens, so a row's result never depends on what it was
//! batched with there either (a tiled f32 kernel gained ~10 % on f16 prefill and broke that).
//!
//! Where the design comes from: the interleaved-row ("_R8/_R16") kernels of ik_llama.cpp's
//! `iqk_mul_mat` and llamafile's `tinyBLAS` (register tiles of rows × tokens, weights unpacked
//! once per tile); the repack is per matmul call, into a per-thread buffer, and costs
//! O(weights) against O(weights × tokens) of arithmetic. (Matrices the loader repacked into
//! [`crate::rows16`] already hold a tile's registers: on x86 the repack reads them as plain
//! loads, without the transposes; on NEON so does a legacy type's, a k-quant's group is
//! unpacked into the file's layout first. Up to 16 tokens they take the rows16 kernels
//! instead, which need no repack.) x86 stores codes biased by +128 (`vpdpbusd` multiplies
//! unsigned by signed bytes) and removes the bias exactly by starting from the activations'
//! `−128·Σy`.
//!
//! Cost: repacking reads each weight byte once per call (≈ 10 GB/s per core on x86, ≈ 2 % of a
//! 512-token prefill; it sets the crossover below which [`worth_tiling`] sends few tokens to
//! the decode kernels instead) and writes ≈ 1.2 bytes per weight; preparing
//! activations reads and writes each activation byte once. The x86 micro-kernel does B/4
//! `vpdpbusd` + ≈ 3 other vector ops per (block of B values, token, 16 rows): ≈ 500 GFLOP/s
//! per Zen 5 core on Qwen2.5-0.5B shapes, against ≈ 70-170 for the per-row dot. The decode
//! kernels stream each weight byte once (≈ 30-60 GB/s per core from cache, DRAM-bound in
//! practice).

use std::cell::RefCell;

use crate::{ActType, GgmlType, QK_K};

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_decode;

#[cfg(test)]
mod tests;

/// Tokens per prepared activation record.
pub(crate) const GROUP: usize = 8;

/// How the tiled kernels see a weight type; each follows its scalar reference's arithmetic.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Legacy quants (Q8_0 activations): per 32-value block `sum += sumi · (dx·dy)` (affine:
    /// `sum += (dx·dy)·sumi + m·(dy·Σy)`).
    Legacy { min: bool },
    /// K-quants (Q8_K activations): integer scales (and mins) per sub-block of `block` values,
    /// f16 `d` (and `dmin`) per 256; per superblock `sum += (d·dy)·Σ sc·sumi` (affine:
    /// `− (dmin·dy)·Σ m·Σy`).
    K { block: usize, min: bool },
}

/// The tiled layout of `ty` and the activation encoding it multiplies, if supported.
pub(crate) fn kind(ty: GgmlType) -> Option<(Kind, ActType)> {
    use GgmlType as G;
    Some(match ty {
        G::Q8_0 | G::Q4_0 | G::Q5_0 => (Kind::Legacy { min: false }, ActType::Q8_0),
        G::Q4_1 | G::Q5_1 => (Kind::Legacy { min: true }, ActType::Q8_0),
        G::Q4K | G::Q5K => (
            Kind::K {
                block: 32,
                min: true,
            },
            ActType::Q8K,
        ),
        G::Q2K => (
            Kind::K {
                block: 16,
                min: true,
            },
            ActType::Q8K,
        ),
        G::Q3K | G::Q6K => (
            Kind::K {
                block: 16,
                min: false,
            },
            ActType::Q8K,
        ),
        // Float weights (F32/F16/BF16) have no tiled layout: their per-row dot is used for every
        // number of tokens, so a row's result never depends on the batch it was computed in.
        _ => return None,
    })
}

/// Sub-blocks per 256-value superblock of a K kind.
pub(crate) const fn subs(block: usize) -> usize {
    QK_K / block
}

/// Bytes of one prepared record of a token group: a 32-value block (legacy), a 256-value
/// superblock (K).
///
/// Legacy: `qs[GROUP][32]`, `dy[GROUP]` f32, `noff[GROUP]` i32 (−128·Σy), `ms[GROUP]` f32
/// (dy·Σy). K: `dy[GROUP]` f32, `sy[GROUP][subs/2]` (Σy of sub-blocks 2i, 2i+1 as an i16
/// pair), then per sub-block `qs[GROUP][block]`, `noff[GROUP]` i32.
pub(crate) fn act_record_bytes(kind: Kind) -> usize {
    match kind {
        Kind::Legacy { .. } => GROUP * 32 + 3 * GROUP * 4,
        Kind::K { block, .. } => {
            GROUP * 4 + GROUP * 2 * subs(block) + subs(block) * k_act_sub_bytes(block)
        }
    }
}

/// Bytes of one sub-block inside a prepared K record.
pub(crate) const fn k_act_sub_bytes(block: usize) -> usize {
    GROUP * block + GROUP * 4
}

/// Records per token group (and per tile): blocks or superblocks of a row.
pub(crate) fn records(kind: Kind, n: usize) -> usize {
    match kind {
        Kind::Legacy { .. } => n / 32,
        Kind::K { .. } => n / QK_K,
    }
}

/// Bytes of one repacked record for a tile of `r` rows (one lane per row):
///
/// Legacy: codes `[8][r][4]` (`code ^ bias`), `d[r]` f32, (min) `m[r]` f32.
/// K: `d[r]` f32, `dmin[r]` f32, (min) `mpairs[subs/2][r]` (i16 pairs of the integer mins of
/// sub-blocks 2i, 2i+1), then per sub-block codes `[block/4][r][4]`, `sc[r]` i32.
pub(crate) fn tile_record_bytes(kind: Kind, r: usize) -> usize {
    match kind {
        Kind::Legacy { min } => r * (32 + 4 + if min { 4 } else { 0 }),
        Kind::K { block, min } => {
            r * 8
                + if min { r * 4 * subs(block) / 2 } else { 0 }
                + subs(block) * k_tile_sub_bytes(block, r)
        }
    }
}

/// Bytes of the per-superblock header of a repacked K record (before the sub-blocks).
pub(crate) const fn k_tile_head_bytes(block: usize, min: bool, r: usize) -> usize {
    r * 8 + if min { r * 4 * subs(block) / 2 } else { 0 }
}

/// Bytes of one sub-block inside a repacked K record.
pub(crate) const fn k_tile_sub_bytes(block: usize, r: usize) -> usize {
    r * block + r * 4
}

/// Activation rows rearranged once per matmul for [`crate::matmul_prepared`]: in groups of
/// [`PreparedActs::GROUP`] tokens, each block's codes for the group's tokens side by side with
/// their scales and sums.
///
/// Built by [`crate::prepare_acts`] (or [`crate::layout_prepared_acts`] and
/// [`crate::prepare_act_groups`]); reusable (the buffer is kept between calls).
#[derive(Default, Debug, Clone)]
pub struct PreparedActs {
    /// The layout the bytes were built for: (kind, act encoding, n, tokens).
    pub(crate) key: Option<(Kind, ActType, usize, usize)>,
    pub(crate) bytes: Vec<u8>,
}

impl PreparedActs {
    /// Tokens per group.
    pub const GROUP: usize = GROUP;

    /// An empty buffer.
    pub fn new() -> PreparedActs {
        PreparedActs::default()
    }

    /// Whether the buffer is laid out as [`crate::layout_prepared_acts`] lays it out for `tokens`
    /// rows of `n` values against weights of type `ty`: activations prepared for one weight type
    /// then serve every type of the same tiled kind (Q8_0, Q4_0 and Q5_0 share one).
    pub fn fits(&self, ty: GgmlType, n: usize, tokens: usize) -> bool {
        match (kind(ty), self.key) {
            (Some((kind, act)), Some(key)) => key == (kind, act, n, tokens),
            _ => false,
        }
    }

    /// Number of activation rows (tokens) prepared, 0 if none.
    pub fn tokens(&self) -> usize {
        self.key.map_or(0, |k| k.3)
    }

    /// Bytes of one group of [`Self::GROUP`] tokens (0 before a layout).
    pub fn group_bytes(&self) -> usize {
        self.key.map_or(0, |(kind, _, n, _)| {
            records(kind, n) * act_record_bytes(kind)
        })
    }

    /// Number of token groups.
    pub fn groups(&self) -> usize {
        self.tokens().div_ceil(GROUP)
    }

    /// The prepared bytes, for filling with [`crate::prepare_act_groups`].
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// The prepared bytes of token group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let gb = self.group_bytes();
        &self.bytes[g * gb..(g + 1) * gb]
    }
}

// ---------------------------------------------------------------------------------------------
// Activation preparation (portable; O(tokens · n)).

/// Lay `prep` out for `tokens` activation rows of `n` values (contents unspecified until the
/// groups are filled with [`prepare_groups`]).
pub(crate) fn layout(kind: Kind, act: ActType, n: usize, tokens: usize, prep: &mut PreparedActs) {
    prep.key = Some((kind, act, n, tokens));
    let total = tokens.div_ceil(GROUP) * prep.group_bytes();
    prep.bytes.resize(total, 0);
}

/// Fill `prep` from `tokens` activation rows of `n` values (`acts`, encoded as `act`).
pub(crate) fn prepare(
    kind: Kind,
    act: ActType,
    n: usize,
    acts: &[u8],
    tokens: usize,
    prep: &mut PreparedActs,
) {
    layout(kind, act, n, tokens, prep);
    prepare_groups(
        kind,
        act,
        n,
        &acts[..tokens * act.row_bytes(n)],
        0,
        &mut prep.bytes,
    );
}

/// Σ of 32 codes as i8: on x86-64, `psadbw` (SSE2, always there) of the codes biased to u8;
/// on aarch64, NEON's widening add across lanes (always there); elsewhere one by one. The
/// byte-at-a-time loop this replaces took over half of `prepare_groups`, itself ~5 % of a
/// Qwen2.5 prefill. The rows16 kernels' activation terms use it too.
#[inline]
pub(crate) fn sum_i8(codes: &[u8; 32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the loads read the 32 bytes of `codes` (unaligned).
        unsafe {
            let bias = _mm_set1_epi8(0x80u8 as i8);
            let lo = _mm_xor_si128(_mm_loadu_si128(codes.as_ptr().cast()), bias);
            let hi = _mm_xor_si128(_mm_loadu_si128(codes[16..].as_ptr().cast()), bias);
            let zero = _mm_setzero_si128();
            let s = _mm_add_epi64(_mm_sad_epu8(lo, zero), _mm_sad_epu8(hi, zero));
            let total = _mm_cvtsi128_si64(s) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
            total as i32 - 128 * 32
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::aarch64::*;
        // SAFETY: NEON is part of aarch64; the loads read the 32 bytes of `codes`.
        unsafe {
            let lo = vld1q_s8(codes.as_ptr().cast());
            let hi = vld1q_s8(codes[16..].as_ptr().cast());
            i32::from(vaddlvq_s8(lo)) + i32::from(vaddlvq_s8(hi))
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        sum_i8_scalar(codes)
    }
}

/// [`sum_i8`]'s reference.
#[cfg_attr(any(target_arch = "x86_64", target_arch = "aarch64"), allow(dead_code))]
fn sum_i8_scalar(codes: &[u8; 32]) -> i32 {
    codes.iter().map(|&q| i32::from(q as i8)).sum()
}

fn put<const N: usize>(dst: &mut [u8], off: usize, v: [u8; N]) {
    dst[off..off + N].copy_from_slice(&v);
}

/// Write the prepared groups `first..` (as many as `dst` holds whole groups) from `acts`, all
/// the activation rows (`act.row_bytes(n)` each); tokens past the last row are zero.
pub(crate) fn prepare_groups(
    kind: Kind,
    act: ActType,
    n: usize,
    acts: &[u8],
    first: usize,
    dst: &mut [u8],
) {
    let row_bytes = act.row_bytes(n);
    let tokens = acts.len() / row_bytes;
    let rec = act_record_bytes(kind);
    let group_bytes = records(kind, n) * rec;
    if group_bytes == 0 {
        return;
    }
    for (g, dst) in dst.chunks_exact_mut(group_bytes).enumerate() {
        let t0 = (first + g) * GROUP;
        let count = tokens.saturating_sub(t0).min(GROUP);
        if count < GROUP {
            dst.fill(0);
        }
        let rows = &acts[t0 * row_bytes..(t0 + count) * row_bytes];
        for (t, row) in rows.chunks_exact(row_bytes).enumerate() {
            match (kind, act) {
                (Kind::Legacy { .. }, ActType::Q8_0) => {
                    for (blk, r) in row
                        .as_chunks::<34>()
                        .0
                        .iter()
                        .zip(dst.chunks_exact_mut(rec))
                    {
                        let qs: &[u8; 32] = blk[2..].try_into().unwrap();
                        let dy = crate::legacy::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                        let sum = sum_i8(qs);
                        r[32 * t..32 * t + 32].copy_from_slice(qs);
                        put(r, 256 + 4 * t, dy.to_le_bytes());
                        put(r, 288 + 4 * t, (-128 * sum).to_le_bytes());
                        put(r, 320 + 4 * t, (dy * sum as f32).to_le_bytes());
                    }
                }
                (Kind::K { block, .. }, ActType::Q8K) => {
                    let subs = subs(block);
                    let sub_bytes = k_act_sub_bytes(block);
                    let head = GROUP * 4 + GROUP * 2 * subs;
                    for (sb, r) in row
                        .as_chunks::<292>()
                        .0
                        .iter()
                        .zip(dst.chunks_exact_mut(rec))
                    {
                        put(r, 4 * t, [sb[0], sb[1], sb[2], sb[3]]);
                        for j in 0..subs {
                            // Σ codes of sub-block j from ggml's exact 16-value block sums.
                            let per = block / 16;
                            let sum: i32 = (0..per)
                                .map(|k| {
                                    let o = 260 + 2 * (j * per + k);
                                    i32::from(i16::from_le_bytes([sb[o], sb[o + 1]]))
                                })
                                .sum();
                            // |Σ| ≤ 32 · 127 fits i16.
                            put(
                                r,
                                GROUP * 4 + (t * subs + j) * 2,
                                (sum as i16).to_le_bytes(),
                            );
                            let sub = head + j * sub_bytes;
                            r[sub + t * block..sub + (t + 1) * block]
                                .copy_from_slice(&sb[4 + j * block..4 + (j + 1) * block]);
                            put(r, sub + GROUP * block + 4 * t, (-128 * sum).to_le_bytes());
                        }
                    }
                }
                _ => unreachable!("tiled kinds pair with Q8_0 or Q8_K activations"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Weight decoding (scalar reference for the SIMD repackers).

fn f16_at(b: &[u8], off: usize) -> f32 {
    crate::legacy::f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit sub-block scales of a Q3_K block (ggml's `kmask1/kmask2` unpacking).
fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let (a0, a1, tmp) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let words = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        for (ob, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *ob = b as i8 - 32;
        }
    }
    out
}

/// Decode legacy block `b` of a weight row into integer codes; returns `(d, m)` with value
/// `i` = `d · codes[i] + m`.
pub(crate) fn decode_legacy(
    ty: GgmlType,
    row: &[u8],
    b: usize,
    codes: &mut [i8; 32],
) -> (f32, f32) {
    use GgmlType as G;
    let nib = |qs: &[u8], codes: &mut [i8; 32], off: i8| {
        for j in 0..16 {
            codes[j] = (qs[j] & 0xF) as i8 - off;
            codes[j + 16] = (qs[j] >> 4) as i8 - off;
        }
    };
    let five = |qh: u32, qs: &[u8], codes: &mut [i8; 32], off: i8| {
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            codes[j] = ((qs[j] & 0xF) | (h0 << 4)) as i8 - off;
            codes[j + 16] = ((qs[j] >> 4) | (h1 << 4)) as i8 - off;
        }
    };
    match ty {
        G::Q8_0 => {
            let blk = &row[34 * b..34 * b + 34];
            for (c, &q) in codes.iter_mut().zip(&blk[2..34]) {
                *c = q as i8;
            }
            (f16_at(blk, 0), 0.0)
        }
        G::Q4_0 => {
            let blk = &row[18 * b..18 * b + 18];
            nib(&blk[2..18], codes, 8);
            (f16_at(blk, 0), 0.0)
        }
        G::Q5_0 => {
            let blk = &row[22 * b..22 * b + 22];
            five(u32_at(blk, 2), &blk[6..22], codes, 16);
            (f16_at(blk, 0), 0.0)
        }
        G::Q4_1 => {
            let blk = &row[20 * b..20 * b + 20];
            nib(&blk[4..20], codes, 0);
            (f16_at(blk, 0), f16_at(blk, 2))
        }
        G::Q5_1 => {
            let blk = &row[24 * b..24 * b + 24];
            five(u32_at(blk, 4), &blk[8..24], codes, 0);
            (f16_at(blk, 0), f16_at(blk, 2))
        }
        _ => unreachable!("decode_legacy on {ty}"),
    }
}

/// The f16 factors `(d, dmin)` of superblock `s` of a k-quant row (`dmin` 0 if none).
pub(crate) fn k_factors(ty: GgmlType, row: &[u8], s: usize) -> (f32, f32) {
    use GgmlType as G;
    let bytes = ty.block_bytes();
    let sb = &row[bytes * s..bytes * (s + 1)];
    match ty {
        G::Q2K => (f16_at(sb, 80), f16_at(sb, 82)),
        G::Q3K => (f16_at(sb, 108), 0.0),
        G::Q4K | G::Q5K => (f16_at(sb, 0), f16_at(sb, 2)),
        G::Q6K => (f16_at(sb, 208), 0.0),
        _ => unreachable!("k_factors on {ty}"),
    }
}

/// Decode sub-block `j` of superblock `s` of a k-quant row into integer codes; returns the
/// integer `(scale, min)`: value `i` = `d · scale · codes[i] − dmin · min`.
pub(crate) fn decode_k(
    ty: GgmlType,
    row: &[u8],
    s: usize,
    j: usize,
    codes: &mut [i8],
) -> (i32, i32) {
    use GgmlType as G;
    let bytes = ty.block_bytes();
    let sb = &row[bytes * s..bytes * (s + 1)];
    match ty {
        G::Q4K | G::Q5K => {
            let five_bit = ty == G::Q5K;
            let (sc, m) = scale_min_k4(j, &sb[4..16]);
            let qs_off = if five_bit { 48 } else { 16 };
            let qs = &sb[qs_off + 32 * (j / 2)..qs_off + 32 * (j / 2) + 32];
            for l in 0..32 {
                let mut q = if j.is_multiple_of(2) {
                    qs[l] & 0xF
                } else {
                    qs[l] >> 4
                };
                if five_bit && (sb[16 + l] >> j) & 1 != 0 {
                    q += 16;
                }
                codes[l] = q as i8;
            }
            (i32::from(sc), i32::from(m))
        }
        G::Q6K => {
            // Sub-block j = 8·half + 2·quarter + (second 16 of the quarter's 32).
            let (h, k, lhalf) = (j / 8, (j % 8) / 2, j % 2);
            let ql = &sb[64 * h + 32 * (k % 2)..];
            let qh = &sb[128 + 32 * h..];
            for (c, l) in codes.iter_mut().zip(16 * lhalf..16 * lhalf + 16) {
                let lo = if k < 2 { ql[l] & 0xF } else { ql[l] >> 4 };
                let hi = (qh[l] >> (2 * k)) & 3;
                *c = (lo | (hi << 4)) as i8 - 32;
            }
            (i32::from(sb[192 + j] as i8), 0)
        }
        G::Q2K => {
            // Sub-block j = 8·half + 2·shift + part.
            let (h, k, part) = (j / 8, (j % 8) / 2, j % 2);
            let q = &sb[16 + 32 * h + 16 * part..];
            for (c, &b) in codes.iter_mut().zip(&q[..16]) {
                *c = ((b >> (2 * k)) & 3) as i8;
            }
            (i32::from(sb[j] & 0xF), i32::from(sb[j] >> 4))
        }
        G::Q3K => {
            let (h, k, part) = (j / 8, (j % 8) / 2, j % 2);
            let q = &sb[32 + 32 * h..];
            let hm = &sb[..32];
            let m = 1u8 << (4 * h + k);
            for (c, i) in codes.iter_mut().zip(16 * part..16 * part + 16) {
                let low = ((q[i] >> (2 * k)) & 3) as i8;
                *c = low - if hm[i] & m != 0 { 0 } else { 4 };
            }
            (i32::from(q3k_scales(&sb[96..108])[j]), 0)
        }
        _ => unreachable!("decode_k on {ty}"),
    }
}

/// Repack up to `r` weight rows (`w`, whole rows of `row_bytes`) into one tile of the layout
/// of [`tile_record_bytes`]; codes are stored as `code ^ bias`; rows past the end are zero
/// (code 0, scales 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn repack_scalar(
    ty: GgmlType,
    kind: Kind,
    n: usize,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    bias: u8,
    dst: &mut [u8],
) {
    let rows = w.len() / row_bytes;
    debug_assert!(rows <= r);
    let rec = tile_record_bytes(kind, r);
    let dst = &mut dst[..records(kind, n) * rec];
    dst.fill(0);
    let put_codes = |dst: &mut [u8], codes: &[i8], row_i: usize| {
        for (j, &c) in codes.iter().enumerate() {
            dst[(j / 4) * 4 * r + row_i * 4 + j % 4] = c as u8 ^ bias;
        }
    };
    match kind {
        Kind::Legacy { min } => {
            let mut codes = [0i8; 32];
            for (b, rec) in dst.chunks_exact_mut(rec).enumerate() {
                rec[..32 * r].fill(bias);
                for (row_i, row) in w.chunks_exact(row_bytes).enumerate() {
                    let (d, m) = decode_legacy(ty, row, b, &mut codes);
                    put_codes(rec, &codes, row_i);
                    put(rec, 32 * r + 4 * row_i, d.to_le_bytes());
                    if min {
                        put(rec, 36 * r + 4 * row_i, m.to_le_bytes());
                    }
                }
            }
        }
        Kind::K { block, min } => {
            let head = k_tile_head_bytes(block, min, r);
            let sub_bytes = k_tile_sub_bytes(block, r);
            let mut codes = [0i8; 32];
            for (s, rec) in dst.chunks_exact_mut(rec).enumerate() {
                for j in 0..subs(block) {
                    rec[head + j * sub_bytes..head + j * sub_bytes + block * r].fill(bias);
                }
                for (row_i, row) in w.chunks_exact(row_bytes).enumerate() {
                    let (d, dmin) = k_factors(ty, row, s);
                    put(rec, 4 * row_i, d.to_le_bytes());
                    put(rec, 4 * r + 4 * row_i, dmin.to_le_bytes());
                    for j in 0..subs(block) {
                        let (sc, m) = decode_k(ty, row, s, j, &mut codes[..block]);
                        let sub = head + j * sub_bytes;
                        put_codes(&mut rec[sub..], &codes[..block], row_i);
                        put(rec, sub + block * r + 4 * row_i, sc.to_le_bytes());
                        if min {
                            // i16 pair (m_{2i}, m_{2i+1}) in lane row_i of pair vector i.
                            put(
                                rec,
                                8 * r + (j / 2) * 4 * r + 4 * row_i + 2 * (j % 2),
                                (m as i16).to_le_bytes(),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Per-block activation values shared by all rows of a decode call: legacy `dy` (and for the
/// affine types `dy·Σy`) per block; k-quants `dy` per superblock and the 32-value sub-block
/// sums `Σy_j` (also as i16 pairs `(Σy_{2i}, Σy_{2i+1})`).
pub(crate) struct ActSide {
    pub(crate) dy: Vec<f32>,
    pub(crate) ms: Vec<f32>,
    pub(crate) sy_pairs: Vec<i32>,
    pub(crate) sy: Vec<i32>,
}

impl ActSide {
    pub(crate) fn new(ty: GgmlType, n: usize, act: &[u8]) -> ActSide {
        let mut s = ActSide {
            dy: Vec::new(),
            ms: Vec::new(),
            sy_pairs: Vec::new(),
            sy: Vec::new(),
        };
        match kind(ty) {
            Some((Kind::Legacy { min }, _)) => {
                for blk in act.as_chunks::<34>().0.iter().take(n / 32) {
                    let dy = crate::legacy::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                    s.dy.push(dy);
                    if min {
                        let sum = sum_i8(blk[2..].try_into().expect("34-byte Q8_0 block"));
                        s.ms.push(dy * sum as f32);
                    }
                }
            }
            Some((Kind::K { block: 32, .. }, _)) => {
                for sb in act.as_chunks::<292>().0.iter().take(n / 256) {
                    s.dy.push(f32::from_le_bytes([sb[0], sb[1], sb[2], sb[3]]));
                    let bsum = |k: usize| {
                        i32::from(i16::from_le_bytes([sb[260 + 2 * k], sb[261 + 2 * k]]))
                    };
                    for i in 0..4 {
                        let lo = bsum(4 * i) + bsum(4 * i + 1);
                        let hi = bsum(4 * i + 2) + bsum(4 * i + 3);
                        s.sy_pairs.push((lo & 0xFFFF) | (hi << 16));
                        s.sy.extend([lo, hi]);
                    }
                }
            }
            _ => {
                for sb in act.as_chunks::<292>().0.iter().take(n / 256) {
                    s.dy.push(f32::from_le_bytes([sb[0], sb[1], sb[2], sb[3]]));
                }
            }
        }
        s
    }
}

/// Bytes of one repacked tile of `r` rows of `n` values.
pub(crate) fn tile_bytes(kind: Kind, n: usize, r: usize) -> usize {
    records(kind, n) * tile_record_bytes(kind, r)
}

thread_local! {
    /// Per-thread scratch for repacked weight tiles.
    static REPACK: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Per-thread rows16 groups unpacked into the file's layout for `run_rows16` (NEON).
    #[cfg(not(target_arch = "x86_64"))]
    static NATURAL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Per-thread prepared activations for callers of plain `matmul`.
    static PREP: RefCell<PreparedActs> = const {
        RefCell::new(PreparedActs { key: None, bytes: Vec::new() })
    };
}

/// Repacked weights kept per pass (rows are processed in passes whose repack fits in L2).
const REPACK_BUDGET: usize = 384 << 10;

/// Run `f` with this thread's scratch buffer for repacked tiles.
pub(crate) fn with_repack_buffer<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    REPACK.with(|b| f(&mut b.borrow_mut()))
}

/// Run `f` with this thread's prepared-activation buffer.
pub(crate) fn with_prep_buffer<R>(f: impl FnOnce(&mut PreparedActs) -> R) -> R {
    PREP.with(|b| f(&mut b.borrow_mut()))
}

/// Rows per repack pass for rows of `n` values: a multiple of `tile_rows`.
pub(crate) fn rows_per_pass(kind: Kind, n: usize, tile_rows: usize) -> usize {
    let tile = tile_bytes(kind, n, tile_rows).max(1);
    (REPACK_BUDGET / tile).max(1) * tile_rows
}

/// Whether `tokens` activation rows pay for repacking the weights of a `kind`: measured
/// against the decode kernels, which read weights in place — on x86 for up to
/// `x86_decode::MAX_TOKENS` tokens at once (a small batch streams the weights once without a
/// repack), on NEON one token at a time.
pub(crate) fn worth_tiling(kind: Kind, tokens: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    let (legacy, k) = (DECODE_BATCH_LEGACY, DECODE_BATCH_K);
    #[cfg(not(target_arch = "x86_64"))]
    let (legacy, k) = (2, 3);
    tokens
        >= match kind {
            Kind::Legacy { .. } => legacy,
            Kind::K { .. } => k,
        }
}

/// Fewest tokens the x86 tiled kernels take for legacy and k-quant weights (below, the
/// multi-token decode kernels run).
#[cfg(target_arch = "x86_64")]
const DECODE_BATCH_LEGACY: usize = 4;
#[cfg(target_arch = "x86_64")]
const DECODE_BATCH_K: usize = 4;

/// Whether `isa` has tiled kernels on this CPU.
pub(crate) fn available(isa: crate::Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::legacy::has_avx512_vnni(isa)
    }
    #[cfg(target_arch = "aarch64")]
    {
        crate::legacy::has_neon_dotprod(isa)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        false
    }
}

/// Tiled matmul of `w_rows` (whole rows of `row_bytes`) with the prepared activations, for an
/// `isa` where [`available`] holds; `out` holds `(tokens − 1) · out_stride + rows` values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    isa: crate::Isa,
    ty: GgmlType,
    kind: Kind,
    n: usize,
    w_rows: &[u8],
    row_bytes: usize,
    prep: &PreparedActs,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(
        available(isa),
        "tiled::run without a tiled kernel for {isa:?}"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available` verified AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the geometry
    // contract is the caller's (lib.rs checks it).
    unsafe {
        x86::run(ty, kind, n, w_rows, row_bytes, prep, out, out_stride, false)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `available` verified NEON and the dot-product extension; the geometry contract
    // is the caller's (lib.rs checks it).
    unsafe {
        neon::run(ty, kind, n, w_rows, row_bytes, prep, out, out_stride, false)
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (ty, kind, n, w_rows, row_bytes, prep, out, out_stride);
}

/// [`run`] on whole groups in the rows16 layout (`groups`, see [`crate::rows16`]; rows of
/// `row_bytes` in the file's layout): on x86 each group turned straight into a tile
/// ([`x86::repack_rows16`]), on NEON each half group of a legacy type too
/// ([`crate::rows16::legacy_tile_half`]) and a k-quant's groups unpacked into the file's layout
/// first, one group at a time in a per-thread buffer. The same tiles either way, so the same
/// results.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_rows16(
    isa: crate::Isa,
    ty: GgmlType,
    kind: Kind,
    n: usize,
    groups: &[u8],
    row_bytes: usize,
    prep: &PreparedActs,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(
        available(isa),
        "tiled::run_rows16 without a tiled kernel for {isa:?}"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available` verified AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the geometry
    // contract is the caller's (lib.rs checks it, whole groups of a rows16 type included).
    unsafe {
        x86::run(ty, kind, n, groups, row_bytes, prep, out, out_stride, true)
    };
    #[cfg(target_arch = "aarch64")]
    if matches!(kind, Kind::Legacy { .. }) {
        // SAFETY: `available` verified NEON with the dot product; the geometry contract is the
        // caller's (whole groups of a legacy rows16 type).
        unsafe { neon::run(ty, kind, n, groups, row_bytes, prep, out, out_stride, true) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let group_bytes = crate::rows16::GROUP_ROWS * row_bytes;
        NATURAL.with(|natural| {
            let mut natural = natural.borrow_mut();
            natural.resize(group_bytes, 0);
            for (g, group) in groups.chunks_exact(group_bytes).enumerate() {
                crate::rows16::unpack_group(ty, n, group, &mut natural)
                    .expect("whole groups of a rows16 type, checked by the caller");
                let out = &mut out[g * crate::rows16::GROUP_ROWS..];
                run(isa, ty, kind, n, &natural, row_bytes, prep, out, out_stride);
            }
        });
    }
}

/// One-activation-row matmul for a quant `ty` with a tiled layout on an `isa` where
/// [`available`] holds: the decode kernel if `ty` has one, else the tiled kernel on one token;
/// bit-identical to the scalar reference either way. `act` is one activation row and `out`
/// holds the rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode(
    isa: crate::Isa,
    ty: GgmlType,
    kind: Kind,
    act_type: ActType,
    n: usize,
    w_rows: &[u8],
    row_bytes: usize,
    acts: &[u8],
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(
        available(isa),
        "tiled::decode without a tiled kernel for {isa:?}"
    );
    let act_bytes = act_type.row_bytes(n);
    let tokens = acts.len() / act_bytes.max(1);
    #[cfg(target_arch = "x86_64")]
    if x86_decode::supported(ty) {
        for (g, group) in acts.chunks(x86_decode::MAX_TOKENS * act_bytes).enumerate() {
            let first = g * x86_decode::MAX_TOKENS;
            // SAFETY: `available` verified AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the
            // geometry is the caller's (lib.rs checks it) and `run` re-asserts it.
            unsafe {
                x86_decode::run(
                    ty,
                    n,
                    w_rows,
                    row_bytes,
                    group,
                    &mut out[first * out_stride..],
                    out_stride,
                )
            };
        }
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if neon::decode_supported(ty) {
        for (t, a) in acts.chunks_exact(act_bytes).enumerate() {
            let rows = w_rows.len() / row_bytes;
            let o = &mut out[t * out_stride..t * out_stride + rows];
            // SAFETY: `available` verified NEON and the dot-product extension; the geometry is
            // the caller's (lib.rs checks it) and `decode` re-asserts it.
            unsafe { neon::decode(ty, n, w_rows, row_bytes, a, o) };
        }
        return;
    }
    with_prep_buffer(|prep| {
        prepare(kind, act_type, n, acts, tokens, prep);
        run(isa, ty, kind, n, w_rows, row_bytes, prep, out, out_stride);
    });
}
