//! AVX-512 VNNI decode kernels (one activation row): 16 weight rows per pass, one row per
//! 32-bit lane of the result, bit-identical to the scalar reference (and so to the tiled
//! prefill kernels).
//!
//! Per block, two rows' codes share one 512-bit register in their natural layout (row A in
//! the low 256 bits, row B in the high), and one `vpdpbusd` against the activation block
//! (broadcast to both halves) leaves 8 partial sums per row. Eight such registers (16 rows) are
//! folded into one register of 16 exact row dots by a 3-stage add/shuffle tree (21 ops); the
//! rows are assigned to registers so that the tree's output is in row order. Unsigned codes
//! carry their type's offset (Q4_0: 8, Q5_0: 16, Q6_K: 32, Q8_0: 128 after `^ 0x80`), removed
//! exactly by starting each register at `−offset · Σy` per lane. The float steps per block (or
//! superblock) then run once for all 16 rows, exactly as in the scalar reference.
//!
//! Compared with the per-row dot (`legacy::x86`), the activation block, its scale and offset
//! sum are loaded once per 16 rows, the scale arithmetic is vectorized across rows, and there
//! is no per-row call, horizontal sum or tail: ≈ 100 vector ops per 16 rows × 32 Q5_0 weights.

use std::arch::x86_64::*;

use super::ActSide;
use crate::GgmlType;

/// Rows per pass.
const ROWS: usize = 16;

/// Row (A, B) of register p: the reduction tree below returns lane r = row r for this order.
const PAIR_ROWS: [(usize, usize); 8] = [
    (0, 4),
    (1, 5),
    (2, 6),
    (3, 7),
    (8, 12),
    (9, 13),
    (10, 14),
    (11, 15),
];

/// Whether `ty` has a decode kernel here.
pub(super) fn supported(ty: GgmlType) -> bool {
    use GgmlType as G;
    matches!(
        ty,
        G::Q8_0 | G::Q4_0 | G::Q5_0 | G::Q4_1 | G::Q5_1 | G::Q4K | G::Q5K | G::Q6K
    )
}

/// Folds 8 registers of per-row partial sums (register p: row `PAIR_ROWS[p].0` in 128-bit lanes
/// 0-1, row `.1` in lanes 2-3) to two registers whose 128-bit lane l holds, for rows
/// `[4·(l/2)·2 ..]`… see [`fold32`] / [`split16`]: stages 1-2 of the tree.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_stages(z: &[__m512i; 8]) -> (__m512i, __m512i) {
    let s = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    };
    let t = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    };
    let (s01, s23, s45, s67) = (s(z[0], z[1]), s(z[2], z[3]), s(z[4], z[5]), s(z[6], z[7]));
    // Lane l of t0: rows 0-3 (l = 0, 1) or 4-7 (l = 2, 3), each over half of its 8 partials;
    // t1 likewise for rows 8-15.
    (t(s01, s23), t(s45, s67))
}

/// The 16 row sums (lane r = row r) of 8 registers of 32-value blocks.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold32(z: &[__m512i; 8]) -> __m512i {
    let (t0, t1) = fold_stages(z);
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(t0, t1),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(t0, t1),
    )
}

/// For registers holding two 16-value sub-blocks per row (row A: lanes 0 and 1, row B: lanes 2
/// and 3), the 16 row sums of the first and of the second sub-block.
#[inline]
#[target_feature(enable = "avx512f")]
fn split16(z: &[__m512i; 8]) -> (__m512i, __m512i) {
    let (t0, t1) = fold_stages(z);
    (
        _mm512_shuffle_i32x4::<0b10_00_10_00>(t0, t1),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(t0, t1),
    )
}

#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 32 readable bytes; no alignment is required.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Nibbles of two 16-byte `qs` (rows A, B) as 64 codes 0..=15: A's 32 then B's 32, each low
/// nibbles (elements 0..16) then high nibbles (16..32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn nibble_pair(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: the caller passes 16 readable bytes at `a` and at `b`.
    let (qa, qb) = unsafe { (_mm_loadu_si128(a.cast()), _mm_loadu_si128(b.cast())) };
    let packed = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(qa), 0xFF00, qb);
    let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    _mm512_and_si512(_mm512_srlv_epi64(packed, shifts), _mm512_set1_epi8(0x0F))
}

#[inline]
unsafe fn read_u32(p: *const u8) -> u32 {
    // SAFETY: the caller passes 4 readable bytes.
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// 16 lanes of `−off · (Σ of the 4 activation codes of the lane)` for activation bytes `y`.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn neg_offset(off: u8, y: __m512i) -> __m512i {
    let pos = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(off as i8), y);
    _mm512_sub_epi32(_mm512_setzero_si512(), pos)
}

/// 32-bit gathers of one offset from each of 16 rows (rows past the end repeat the last).
struct Rows {
    base: *const u8,
    row_bytes: usize,
    /// Row index per register slot, clamped to the valid rows.
    index: __m512i,
    clamp: [usize; ROWS],
}

impl Rows {
    #[target_feature(enable = "avx512f")]
    fn new(base: *const u8, row_bytes: usize, rows: usize) -> Rows {
        let clamp = std::array::from_fn(|r| r.min(rows - 1));
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let lanes = _mm512_min_epi32(lanes, _mm512_set1_epi32(rows as i32 - 1));
        Rows {
            base,
            row_bytes,
            index: _mm512_mullo_epi32(lanes, _mm512_set1_epi32(row_bytes as i32)),
            clamp,
        }
    }

    /// Pointer to byte `off` of (clamped) row `r`.
    ///
    /// # Safety
    /// `off < row_bytes`.
    #[inline]
    unsafe fn at(&self, r: usize, off: usize) -> *const u8 {
        // SAFETY: clamped rows exist, and `off` is inside the row (caller).
        unsafe { self.base.add(self.clamp[r] * self.row_bytes + off) }
    }

    /// Prefetch (into L2) part `part` of `parts` of a later group of 16 rows (the first one at
    /// least 16 KiB ahead): the rows are contiguous, and a pass reads its 16 rows as 16
    /// interleaved streams, which the hardware prefetchers do not follow well.
    #[inline]
    fn prefetch_next(&self, part: usize, parts: usize) {
        let group = ROWS * self.row_bytes;
        let lines = group.div_ceil(64).div_ceil(parts);
        // At least ≈ 16 KiB ahead (several DRAM latencies at the bandwidth of one core).
        let ahead = group * (16usize << 10).div_ceil(group);
        let start = self.base.wrapping_add(ahead + 64 * lines * part);
        for l in 0..lines {
            // SAFETY: `prefetcht1` is a hint: it never faults and has no visible effect,
            // whatever the address (`wrapping_add` keeps the pointer arithmetic defined).
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(64 * l).cast()) };
        }
    }

    /// The 4 bytes at `off` of every row (lane r = row r).
    ///
    /// # Safety
    /// `off + 4 <= row_bytes`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn gather(&self, off: usize) -> __m512i {
        // SAFETY: every lane reads 4 bytes at a clamped (existing) row's offset `off`, inside
        // the row (caller).
        unsafe { _mm512_i32gather_epi32::<1>(self.index, self.base.add(off).cast()) }
    }
}

/// f16 values in the low 16 bits of each lane, as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_lo(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// `out[r] = row r · act` for the rows of `w` (whole rows of `row_bytes`, type `ty` with `n`
/// values) and one activation row `act` in `ty`'s activation encoding.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `supported(ty)`;
/// `row_bytes` is `ty`'s row size for `n`, `act` its activation row size, and `out` holds the
/// rows (the caller checks the geometry).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn run(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    row_bytes: usize,
    act: &[u8],
    out: &mut [f32],
) {
    use GgmlType as G;
    let rows = w.len() / row_bytes;
    assert!(
        out.len() >= rows
            && w.len() == rows * row_bytes
            && row_bytes == crate::check_row(ty, n).unwrap_or(usize::MAX)
            && act.len() == crate::act_type(ty).map_or(usize::MAX, |a| a.row_bytes(n))
            && row_bytes * ROWS < i32::MAX as usize,
        "decode geometry"
    );
    let side = ActSide::new(ty, n, act);
    for r0 in (0..rows).step_by(ROWS) {
        let nrows = (rows - r0).min(ROWS);
        let g = Rows::new(w[r0 * row_bytes..].as_ptr(), row_bytes, nrows);
        // SAFETY: `g` addresses rows r0..r0+nrows of `w` (clamped), `act` and `side` are the
        // activation row of this geometry (asserted), and every kernel reads only inside the
        // blocks its layout names; CPU features are this fn's.
        let f = unsafe {
            match ty {
                G::Q8_0 => legacy::<0>(&g, n / 32, act, &side),
                G::Q4_0 => legacy::<1>(&g, n / 32, act, &side),
                G::Q5_0 => legacy::<2>(&g, n / 32, act, &side),
                G::Q4_1 => legacy::<3>(&g, n / 32, act, &side),
                G::Q5_1 => legacy::<4>(&g, n / 32, act, &side),
                G::Q4K => k4::<false>(&g, n / 256, act, &side),
                G::Q5K => k4::<true>(&g, n / 256, act, &side),
                G::Q6K => q6k(&g, n / 256, act, &side),
                _ => unreachable!("decode kernel for {ty}"),
            }
        };
        let mask = ((1u32 << nrows) - 1) as __mmask16;
        // SAFETY: lanes < nrows are out[r0..r0 + nrows], inside `out` (asserted).
        unsafe { _mm512_mask_storeu_ps(out[r0..].as_mut_ptr(), mask, f) };
    }
}

/// Legacy types: `TY` 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = Q4_1, 4 = Q5_1.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `g` addresses ≥ 1 rows of `nb` blocks of the type; `act` holds `nb`
/// Q8_0 blocks and `side` was built from it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy<const TY: u8>(g: &Rows, nb: usize, act: &[u8], side: &ActSide) -> __m512 {
    let (bytes, qs_off, qh_off, off): (usize, usize, usize, u8) = match TY {
        0 => (34, 2, 0, 128),
        1 => (18, 2, 0, 8),
        2 => (22, 6, 2, 16),
        3 => (20, 4, 0, 0),
        _ => (24, 8, 4, 0),
    };
    let affine = TY >= 3;
    let blocks = act.as_chunks::<34>().0;
    assert!(blocks.len() >= nb && side.dy.len() >= nb);
    let mut f = _mm512_setzero_ps();
    for (b, y) in blocks.iter().take(nb).enumerate() {
        g.prefetch_next(b, nb);
        // SAFETY: every row pointer is `g.at(r, bytes·b + k)` with
        // k + length ≤ `bytes` (qs at `qs_off`, 16 or 32 bytes; qh at `qh_off`, 4 bytes; d at
        // 0, 4 bytes incl. the next field), inside block b of an existing row.
        unsafe {
            let qy = _mm512_broadcast_i64x4(load256(y[2..].as_ptr()));
            let init = if off == 0 {
                _mm512_setzero_si512()
            } else {
                neg_offset(off, qy)
            };
            let base = bytes * b;
            let mut z = [_mm512_setzero_si512(); 8];
            for (p, &(ra, rb)) in PAIR_ROWS.iter().enumerate() {
                let codes = match TY {
                    0 => {
                        let v = join(load256(g.at(ra, base + 2)), load256(g.at(rb, base + 2)));
                        _mm512_xor_si512(v, _mm512_set1_epi8(0x80u8 as i8))
                    }
                    1 | 3 => nibble_pair(g.at(ra, base + qs_off), g.at(rb, base + qs_off)),
                    _ => {
                        let q = nibble_pair(g.at(ra, base + qs_off), g.at(rb, base + qs_off));
                        let qh = u64::from(read_u32(g.at(ra, base + qh_off)))
                            | (u64::from(read_u32(g.at(rb, base + qh_off))) << 32);
                        _mm512_mask_add_epi8(q, _cvtu64_mask64(qh), q, _mm512_set1_epi8(0x10))
                    }
                };
                z[p] = _mm512_dpbusd_epi32(init, codes, qy);
            }
            let idot = fold32(&z);
            let dm = g.gather(base);
            let d = f16_lo(dm);
            let dy = _mm512_set1_ps(side.dy[b]);
            let mut p = _mm512_mul_ps(_mm512_cvtepi32_ps(idot), _mm512_mul_ps(d, dy));
            if affine {
                let m = f16_lo(_mm512_srli_epi32::<16>(dm));
                p = _mm512_add_ps(p, _mm512_mul_ps(m, _mm512_set1_ps(side.ms[b])));
            }
            f = _mm512_add_ps(f, p);
        }
    }
    f
}

/// Q4_K (`FIVE` = false) and Q5_K.
///
/// # Safety
/// As [`legacy`], with `nsb` superblocks and Q8_K activations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn k4<const FIVE: bool>(g: &Rows, nsb: usize, act: &[u8], side: &ActSide) -> __m512 {
    let (bytes, qs_off) = if FIVE { (176, 48) } else { (144, 16) };
    let sbs = act.as_chunks::<292>().0;
    assert!(sbs.len() >= nsb && side.dy.len() >= nsb && side.sy_pairs.len() >= 4 * nsb);
    let m4 = _mm512_set1_epi8(0x0F);
    let m6 = _mm512_set1_epi32(0x3f3f_3f3f);
    let m4w = _mm512_set1_epi32(0x0f0f_0f0f);
    let m30 = _mm512_set1_epi32(0x3030_3030);
    let byte0 = _mm512_set1_epi32(0xFF);
    let byte2 = _mm512_set1_epi32(0xFF_0000);
    let mut f = _mm512_setzero_ps();
    for (s, y) in sbs.iter().take(nsb).enumerate() {
        let base = bytes * s;
        g.prefetch_next(s, nsb);
        // SAFETY: row reads are inside superblock s of existing rows: header at
        // +0..16, qh at +16..48 (Q5_K), qs at `qs_off`..+128; activation reads inside `y`.
        unsafe {
            let dd = g.gather(base);
            let (a0, a1, a2) = (g.gather(base + 4), g.gather(base + 8), g.gather(base + 12));
            let sc_lo = _mm512_and_si512(a0, m6);
            let m_lo = _mm512_and_si512(a1, m6);
            let sc_hi = _mm512_or_si512(
                _mm512_and_si512(a2, m4w),
                _mm512_and_si512(_mm512_srli_epi32::<2>(a0), m30),
            );
            let m_hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(a2), m4w),
                _mm512_and_si512(_mm512_srli_epi32::<2>(a1), m30),
            );
            let mut qh = [_mm512_setzero_si512(); 8];
            if FIVE {
                for (p, &(ra, rb)) in PAIR_ROWS.iter().enumerate() {
                    qh[p] = join(load256(g.at(ra, base + 16)), load256(g.at(rb, base + 16)));
                }
            }
            let mut isum = _mm512_setzero_si512();
            for pair in 0..4 {
                let y_lo = _mm512_broadcast_i64x4(load256(y[4 + 64 * pair..].as_ptr()));
                let y_hi = _mm512_broadcast_i64x4(load256(y[36 + 64 * pair..].as_ptr()));
                let (mut zl, mut zh) = ([_mm512_setzero_si512(); 8], [_mm512_setzero_si512(); 8]);
                for (p, &(ra, rb)) in PAIR_ROWS.iter().enumerate() {
                    let o = base + qs_off + 32 * pair;
                    let v = join(load256(g.at(ra, o)), load256(g.at(rb, o)));
                    let mut lo = _mm512_and_si512(v, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    if FIVE {
                        let bit_lo = _mm512_set1_epi8((1u8 << (2 * pair)) as i8);
                        let bit_hi = _mm512_set1_epi8((2u8 << (2 * pair)) as i8);
                        let sixteen = _mm512_set1_epi8(16);
                        lo = _mm512_mask_add_epi8(
                            lo,
                            _mm512_test_epi8_mask(qh[p], bit_lo),
                            lo,
                            sixteen,
                        );
                        hi = _mm512_mask_add_epi8(
                            hi,
                            _mm512_test_epi8_mask(qh[p], bit_hi),
                            hi,
                            sixteen,
                        );
                    }
                    zl[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, y_lo);
                    zh[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, y_hi);
                }
                let (j_lo, j_hi) = (2 * pair as u32, 2 * pair as u32 + 1);
                let sc = |j: u32| {
                    let w = if j < 4 { sc_lo } else { sc_hi };
                    _mm512_and_si512(
                        _mm512_srl_epi32(w, _mm_cvtsi32_si128(8 * (j % 4) as i32)),
                        byte0,
                    )
                };
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(fold32(&zl), sc(j_lo)));
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(fold32(&zh), sc(j_hi)));
            }
            let mut summ = _mm512_setzero_si512();
            for (i, m) in [m_lo, m_hi].into_iter().enumerate() {
                let p01 = _mm512_or_si512(
                    _mm512_and_si512(m, byte0),
                    _mm512_and_si512(_mm512_slli_epi32::<8>(m), byte2),
                );
                let p23 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<16>(m), byte0),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(m), byte2),
                );
                let sy01 = _mm512_set1_epi32(side.sy_pairs[4 * s + 2 * i]);
                let sy23 = _mm512_set1_epi32(side.sy_pairs[4 * s + 2 * i + 1]);
                summ = _mm512_dpwssd_epi32(summ, p01, sy01);
                summ = _mm512_dpwssd_epi32(summ, p23, sy23);
            }
            let dy = _mm512_set1_ps(side.dy[s]);
            let d = f16_lo(dd);
            let dmin = f16_lo(_mm512_srli_epi32::<16>(dd));
            let term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum));
            let m_term = _mm512_mul_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(summ));
            f = _mm512_add_ps(f, _mm512_sub_ps(term, m_term));
        }
    }
    f
}

/// Q6_K.
///
/// # Safety
/// As [`k4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k(g: &Rows, nsb: usize, act: &[u8], side: &ActSide) -> __m512 {
    let sbs = act.as_chunks::<292>().0;
    assert!(sbs.len() >= nsb && side.dy.len() >= nsb);
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(0x03);
    let mut f = _mm512_setzero_ps();
    for (s, y) in sbs.iter().take(nsb).enumerate() {
        let base = 210 * s;
        g.prefetch_next(s, nsb);
        // SAFETY: row reads are inside superblock s of existing rows: ql at
        // +0..128, qh at +128..192, scales at +192..208, d at +208..210 (read via +206..210);
        // activation reads inside `y`.
        unsafe {
            let d = f16_lo(_mm512_srli_epi32::<16>(g.gather(base + 206)));
            let scw = [
                g.gather(base + 192),
                g.gather(base + 196),
                g.gather(base + 200),
                g.gather(base + 204),
            ];
            let sc = |i: usize| {
                let v = _mm512_sll_epi32(scw[i / 4], _mm_cvtsi32_si128(24 - 8 * (i % 4) as i32));
                _mm512_srai_epi32::<24>(v)
            };
            let mut isum = _mm512_setzero_si512();
            for h in 0..2 {
                for k in 0..4 {
                    // Sub-blocks j = 8h + 2k and j + 1: elements 0..32 of quarter k of half h.
                    let j = 8 * h + 2 * k;
                    let qy = _mm512_broadcast_i64x4(load256(y[4 + 128 * h + 32 * k..].as_ptr()));
                    let init = neg_offset(32, qy);
                    let mut z = [_mm512_setzero_si512(); 8];
                    for (p, &(ra, rb)) in PAIR_ROWS.iter().enumerate() {
                        let lo_off = base + 64 * h + 32 * (k % 2);
                        let qh_off = base + 128 + 32 * h;
                        let ql = join(load256(g.at(ra, lo_off)), load256(g.at(rb, lo_off)));
                        let qh = join(load256(g.at(ra, qh_off)), load256(g.at(rb, qh_off)));
                        let lo = if k < 2 {
                            ql
                        } else {
                            _mm512_srli_epi16::<4>(ql)
                        };
                        let hb = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * k as i32));
                        let codes = _mm512_or_si512(
                            _mm512_and_si512(lo, m4),
                            _mm512_slli_epi16::<4>(_mm512_and_si512(hb, m3)),
                        );
                        z[p] = _mm512_dpbusd_epi32(init, codes, qy);
                    }
                    let (d0, d1) = split16(&z);
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(d0, sc(j)));
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(d1, sc(j + 1)));
                }
            }
            let dy = _mm512_set1_ps(side.dy[s]);
            let term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum));
            f = _mm512_add_ps(f, term);
        }
    }
    f
}
