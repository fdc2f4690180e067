//! AVX-512 VNNI decode kernels: up to [`MAX_TOKENS`] activation rows against weight rows read
//! in place (no repack), 16 weight rows per pass with one row per 32-bit lane of the result,
//! bit-identical to the scalar reference (and so to the tiled prefill kernels). Each weight
//! block is loaded and unpacked once for all the tokens, so a small batch (several sequences'
//! decode rows in one step) streams the weights once at about the cost of reading them, where
//! the tiled kernels would first repack every weight row.
//!
//! Legacy quants: per block, two rows' codes share one 512-bit register in their natural
//! layout (row A in the low 256 bits, row B in the high), and one `vpdpbusd` against the
//! activation block (broadcast to both halves) leaves 8 partial sums per row. Eight such
//! registers (16 rows) are folded into one register of 16 exact row dots by a 3-stage
//! add/shuffle tree (21 ops); the rows are assigned to registers so that the tree's output is
//! in row order. Unsigned codes carry their type's offset (Q4_0: 8, Q5_0: 16, Q8_0: 128 after
//! `^ 0x80`), removed exactly by starting each register at `−offset · Σy` per lane. The float
//! steps then run once per block for all 16 rows, as in the scalar reference. The 16 rows are
//! read as 16 interleaved streams, so each pass prefetches a later group of rows.
//!
//! K-quants: two phases. Phase 1 reads each row in memory order and forms, per superblock,
//! the exact integers `Σ sc·sumi` and `Σ m·Σy` with ggml's VNNI structure; phase 2 replays the
//! scalar reference's float steps for the 16 rows at once from that small buffer.
//!
//! Cost (Zen 5, one core, weights in cache): Q8_0 ≈ 55, Q5_0 / Q4_0 ≈ 30, Q4_K ≈ 35, Q6_K ≈
//! 50 GB/s of weights — above one core's share of DRAM bandwidth; from DRAM with 2 threads
//! the legacy kernels match or beat the per-row dot, the k-quant ones reach ≈ 75 % of it (the
//! per-superblock horizontal sums that exactness needs).

use std::arch::x86_64::*;

use super::ActSide;
use crate::GgmlType;

/// Rows per pass.
const ROWS: usize = 16;

/// Most activation rows one call takes (callers pass more in groups of this many).
pub(super) const MAX_TOKENS: usize = 16;

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

    /// Prefetch part `part` of `parts` of a later group of 16 rows (the first one at least
    /// 32 KiB ahead; measured best on Zen 5 against 16 KiB and L2-only hints): the rows are
    /// contiguous, and a pass reads its 16 rows as 16 interleaved streams, which the hardware
    /// prefetchers do not follow well.
    #[inline]
    fn prefetch_next(&self, part: usize, parts: usize) {
        let group = ROWS * self.row_bytes;
        let lines = group.div_ceil(64).div_ceil(parts);
        // At least 32 KiB ahead (several DRAM latencies at the bandwidth of one core).
        let ahead = group * (32usize << 10).div_ceil(group);
        let start = self.base.wrapping_add(ahead + 64 * lines * part);
        for l in 0..lines {
            // SAFETY: `prefetcht0` is a hint: it never faults and has no visible effect,
            // whatever the address (`wrapping_add` keeps the pointer arithmetic defined).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(64 * l).cast()) };
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

/// `out[t · out_stride + r] = row r · act t` for the rows of `w` (whole rows of `row_bytes`,
/// type `ty` with `n` values) and the activation rows `acts` (1 to [`MAX_TOKENS`] rows in `ty`'s
/// activation encoding).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `supported(ty)`;
/// `row_bytes` is `ty`'s row size for `n`, `acts` whole activation rows, and `out` holds the
/// rows of every token (the caller checks the geometry; this re-asserts it).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn run(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    out: &mut [f32],
    out_stride: usize,
) {
    use GgmlType as G;
    let rows = w.len() / row_bytes;
    let act_bytes = crate::act_type(ty).map_or(usize::MAX, |a| a.row_bytes(n));
    let tokens = acts.len() / act_bytes.max(1);
    assert!(
        (1..=MAX_TOKENS).contains(&tokens)
            && acts.len() == tokens * act_bytes
            && (tokens == 1 || out_stride >= rows)
            && out.len() >= (tokens - 1) * out_stride + rows
            && w.len() == rows * row_bytes
            && row_bytes == crate::check_row(ty, n).unwrap_or(usize::MAX)
            && row_bytes * ROWS < i32::MAX as usize,
        "decode geometry"
    );
    let act: Vec<&[u8]> = acts.chunks_exact(act_bytes).collect();
    let sides: Vec<ActSide> = act.iter().map(|a| ActSide::new(ty, n, a)).collect();
    let q6k_init: Vec<Vec<__m512i>> = if ty == G::Q6K {
        act.iter()
            .map(|a| {
                a.as_chunks::<292>().0[..n / 256]
                    .iter()
                    .flat_map(|y| {
                        (0..4).map(|i| {
                            // SAFETY: bytes 4 + 64i .. 68 + 64i of the superblock are readable.
                            let v = unsafe { _mm512_loadu_si512(y[4 + 64 * i..].as_ptr().cast()) };
                            neg_offset(32, v)
                        })
                    })
                    .collect()
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut f = [_mm512_setzero_ps(); MAX_TOKENS];
    let f = &mut f[..tokens];
    for r0 in (0..rows).step_by(ROWS) {
        let nrows = (rows - r0).min(ROWS);
        let group = &w[r0 * row_bytes..(r0 + nrows) * row_bytes];
        let g = Rows::new(group.as_ptr(), row_bytes, nrows);
        // SAFETY: `g` addresses rows r0..r0+nrows of `w` (clamped), `act` and `sides` are the
        // activation rows of this geometry (asserted), and every kernel reads only inside the
        // blocks its layout names; CPU features are this fn's.
        unsafe {
            match ty {
                G::Q8_0 => legacy::<0>(&g, n / 32, &act, &sides, f),
                G::Q4_0 => legacy::<1>(&g, n / 32, &act, &sides, f),
                G::Q5_0 => legacy::<2>(&g, n / 32, &act, &sides, f),
                G::Q4_1 => legacy::<3>(&g, n / 32, &act, &sides, f),
                G::Q5_1 => legacy::<4>(&g, n / 32, &act, &sides, f),
                G::Q4K => k4::<false>(group, row_bytes, n / 256, &act, &sides, f),
                G::Q5K => k4::<true>(group, row_bytes, n / 256, &act, &sides, f),
                G::Q6K => q6k(group, row_bytes, n / 256, &act, &sides, &q6k_init, f),
                _ => unreachable!("decode kernel for {ty}"),
            }
        }
        let mask = ((1u32 << nrows) - 1) as __mmask16;
        for (t, &ft) in f.iter().enumerate() {
            // SAFETY: lanes < nrows are out[t·stride + r0 ..][..nrows], inside `out`
            // (asserted).
            unsafe { _mm512_mask_storeu_ps(out[t * out_stride + r0..].as_mut_ptr(), mask, ft) };
        }
    }
}

/// Legacy types: `TY` 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = Q4_1, 4 = Q5_1; 16 rows in lanes,
/// `f[t]` the dots with activation row `t`. Each block's codes are unpacked once for all the
/// tokens; every token then runs exactly the one-token arithmetic.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `g` addresses ≥ 1 rows of `nb` blocks of the type; every `act[t]`
/// holds `nb` Q8_0 blocks and `side[t]` was built from it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// `b` indexes the weight rows' blocks and every token's activation blocks alike.
#[allow(clippy::needless_range_loop)]
unsafe fn legacy<const TY: u8>(
    g: &Rows,
    nb: usize,
    act: &[&[u8]],
    side: &[ActSide],
    f: &mut [__m512],
) {
    let (bytes, qs_off, qh_off, off): (usize, usize, usize, u8) = match TY {
        0 => (34, 2, 0, 128),
        1 => (18, 2, 0, 8),
        2 => (22, 6, 2, 16),
        3 => (20, 4, 0, 0),
        _ => (24, 8, 4, 0),
    };
    let affine = TY >= 3;
    let blocks: Vec<&[[u8; 34]]> = act.iter().map(|a| a.as_chunks::<34>().0).collect();
    for (b, s) in blocks.iter().zip(side) {
        assert!(b.len() >= nb && s.dy.len() >= nb && (!affine || s.ms.len() >= nb));
    }
    f.fill(_mm512_setzero_ps());
    for b in 0..nb {
        g.prefetch_next(b, nb);
        // SAFETY: every row pointer is `g.at(r, bytes·b + k)` with k + length ≤ `bytes` (qs at
        // `qs_off`, 16 or 32 bytes; qh at `qh_off`, 4 bytes; d at 0, 4 bytes incl. the next
        // field), inside block b of an existing row; activation blocks b exist (asserted).
        unsafe {
            let base = bytes * b;
            let mut codes = [_mm512_setzero_si512(); 8];
            for (p, &(ra, rb)) in PAIR_ROWS.iter().enumerate() {
                codes[p] = match TY {
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
            }
            let dm = g.gather(base);
            let d = f16_lo(dm);
            let m = if affine {
                f16_lo(_mm512_srli_epi32::<16>(dm))
            } else {
                _mm512_setzero_ps()
            };
            for (t, ft) in f.iter_mut().enumerate() {
                let qy = _mm512_broadcast_i64x4(load256(blocks[t][b][2..].as_ptr()));
                let init = if off == 0 {
                    _mm512_setzero_si512()
                } else {
                    neg_offset(off, qy)
                };
                let z: [__m512i; 8] =
                    std::array::from_fn(|p| _mm512_dpbusd_epi32(init, codes[p], qy));
                let idot = fold32(&z);
                let dy = _mm512_set1_ps(side[t].dy[b]);
                let mut p = _mm512_mul_ps(_mm512_cvtepi32_ps(idot), _mm512_mul_ps(d, dy));
                if affine {
                    p = _mm512_add_ps(p, _mm512_mul_ps(m, _mm512_set1_ps(side[t].ms[b])));
                }
                *ft = _mm512_add_ps(*ft, p);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants: two phases. Phase 1 walks each row in memory order (one sequential stream, which
// the hardware prefetchers follow; 16 interleaved rows did not stream well from DRAM) and
// computes per superblock the exact integers `isum = Σ sc·sumi` and `summ = Σ m·Σy` plus the
// row's f16 factors, into a small buffer laid out lane = row. Phase 2 replays the scalar
// reference's float steps for 16 rows at once: `sum + ((d·dy)·isum − (dmin·dy)·summ)`.

/// Per superblock of a 16-row group: `isum`, `summ` (i32), `d`, `dmin` (f16 bits), 16 lanes
/// each.
type KBuf = Vec<[[u32; ROWS]; 4]>;

/// Phase 2: the float steps over the phase-1 buffer, lane r = row r.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn k_replay(buf: &[[[u32; ROWS]; 4]], dy: &[f32], min: bool) -> __m512 {
    let mut f = _mm512_setzero_ps();
    for (sb, &dy) in buf.iter().zip(dy) {
        // SAFETY: each array is 16 readable u32.
        let [isum, summ, d, dmin] = sb.map(|v| unsafe { _mm512_loadu_si512(v.as_ptr().cast()) });
        let dy = _mm512_set1_ps(dy);
        let d = f16_lo(d);
        let mut term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum));
        if min {
            let dmin = f16_lo(dmin);
            let m_term = _mm512_mul_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(summ));
            term = _mm512_sub_ps(term, m_term);
        }
        f = _mm512_add_ps(f, term);
    }
    f
}

/// Prefetch the `bytes` bytes that lie `PREFETCH_AHEAD` bytes past `p` (the row data a
/// sequential walk reads a few superblocks later; rows are contiguous, so this runs into the
/// next rows).
#[inline]
fn prefetch_ahead(p: *const u8, bytes: usize) {
    let start = p.wrapping_add(PREFETCH_AHEAD);
    for l in 0..bytes.div_ceil(64) {
        // SAFETY: `prefetcht0` is a hint: it never faults and has no visible effect, whatever
        // the address (`wrapping_add` keeps the pointer arithmetic defined).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(64 * l).cast()) };
    }
}

/// Prefetch distance of the sequential k-quant walk (12 KiB matched the per-row kernels from
/// DRAM on Zen 5; 2 KiB left them 25 % behind).
const PREFETCH_AHEAD: usize = 12288;

/// The little-endian u16 at `p`, zero-extended.
#[inline]
unsafe fn u16_at(p: *const u8) -> u32 {
    // SAFETY: the caller passes 2 readable bytes.
    u32::from(unsafe { p.cast::<u16>().read_unaligned() })
}

/// A `vpshufb` control whose 16-bit lane i (of every 128-bit lane l) is byte `bytes[l][i]`
/// of the source lane, zero-extended.
const fn widen_ctrl(bytes: [[u8; 8]; 4]) -> [i64; 8] {
    let mut q = [0i64; 8];
    let mut l = 0;
    while l < 4 {
        let mut i = 0;
        while i < 8 {
            let v = bytes[l][i] as u16 | 0x8000;
            q[2 * l + i / 4] |= (v as i64) << (16 * (i % 4));
            i += 1;
        }
        l += 1;
    }
    q
}

#[inline]
#[target_feature(enable = "avx512f")]
fn vec8(q: [i64; 8]) -> __m512i {
    _mm512_set_epi64(q[7], q[6], q[5], q[4], q[3], q[2], q[1], q[0])
}

/// `[a ×4, b ×4]`.
const fn two(a: u8, b: u8) -> [u8; 8] {
    [a, a, a, a, b, b, b, b]
}

/// The 12 packed 6-bit scales and mins of a Q4_K/Q5_K block (first 12 bytes of `v`) as bytes
/// `[sc0..sc7, m0..m7]` (ggml's `get_scale_min_k4`, in vector registers).
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_k4_scales(v: __m128i) -> __m128i {
    // u32 lanes: a0 = bytes 0..4, a1 = 4..8, a2 = 8..12.
    let p = _mm_shuffle_epi32::<0b10_01_10_00>(v); // [a0, a2, a1, a2]
    let p = _mm_srlv_epi32(p, _mm_set_epi32(4, 0, 0, 0));
    let p = _mm_and_si128(
        p,
        _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f),
    );
    let q = _mm_shuffle_epi32::<0b01_01_00_00>(v); // [a0, a0, a1, a1]
    let q = _mm_and_si128(
        _mm_srli_epi32::<2>(q),
        _mm_set_epi32(0x30303030, 0, 0x30303030, 0),
    );
    _mm_or_si128(p, q)
}

/// Q4_K (`FIVE` = false) and Q5_K over ≤ 16 whole rows at `w`. Per superblock and row, the
/// exact integers as ggml's AVX-512 VNNI code forms them: `vpdpbusd` sums of 4 products (at
/// most 4·31·127, so `vpackssdw` to i16 is exact), then `vpmaddwd` / `vpdpwssd` apply the
/// scales of 4 sub-blocks at once; mins via `vpmaddwd` on the activation's 16-value sums.
///
/// A superblock's codes are unpacked once for all the tokens (`f[t]`: the dots with
/// activation row `t`).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `w` holds ≤ 16 rows of `row_bytes` = `nsb` superblocks; every
/// `act[t]` is a Q8_K activation row and `side[t]` was built from it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn k4<const FIVE: bool>(
    w: &[u8],
    row_bytes: usize,
    nsb: usize,
    act: &[&[u8]],
    side: &[ActSide],
    f: &mut [__m512],
) {
    let (bytes, qs_off) = if FIVE { (176, 48) } else { (144, 16) };
    let sbs: Vec<&[[u8; 292]]> = act.iter().map(|a| a.as_chunks::<292>().0).collect();
    for (y, s) in sbs.iter().zip(side) {
        assert!(y.len() >= nsb && s.dy.len() >= nsb);
    }
    assert!(row_bytes == nsb * bytes && w.len() <= ROWS * row_bytes);
    let tokens = act.len();
    let m4 = _mm512_set1_epi8(0x0F);
    // packs(r0, r1) holds sub-blocks [0, 2] in 128-bit lanes 0-1 and [1, 3] in lanes 2-3.
    let shuf01 = vec8(const { widen_ctrl([two(0, 2), two(0, 2), two(1, 3), two(1, 3)]) });
    let shuf23 = vec8(const { widen_ctrl([two(4, 6), two(4, 6), two(5, 7), two(5, 7)]) });
    // i16 lane k of each 256-bit half: m_{k/2} (byte 8 + k/2).
    let mins_ctrl = vec8(
        const {
            widen_ctrl([
                [8, 8, 9, 9, 10, 10, 11, 11],
                [12, 12, 13, 13, 14, 14, 15, 15],
                [8, 8, 9, 9, 10, 10, 11, 11],
                [12, 12, 13, 13, 14, 14, 15, 15],
            ])
        },
    );
    // Token t's superblock s is `buf[t · nsb + s]`.
    let mut buf: KBuf = vec![[[0; ROWS]; 4]; tokens * nsb];
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        for s in 0..nsb {
            let x = &row[bytes * s..bytes * (s + 1)];
            prefetch_ahead(x.as_ptr(), bytes);
            // SAFETY: all reads are inside superblock `x` (scales at +4..20 of which 12 are
            // used, qh at +16..48, qs at `qs_off`..+128) and the activation superblocks `y`
            // (codes at +4..260, sums at +260..292).
            unsafe {
                let sc = _mm512_broadcast_i32x4(unpack_k4_scales(_mm_loadu_si128(
                    x[4..].as_ptr().cast(),
                )));
                let qh = if FIVE {
                    _mm512_broadcast_i64x4(load256(x[16..].as_ptr()))
                } else {
                    _mm512_setzero_si512()
                };
                let codes: [__m512i; 4] = std::array::from_fn(|j| {
                    let q = load256(x[qs_off + 32 * j..].as_ptr());
                    let q = join(q, _mm256_srli_epi16::<4>(q));
                    let mut codes = _mm512_and_si512(q, m4);
                    if FIVE {
                        let bits = join(
                            _mm256_set1_epi8((1u8 << (2 * j)) as i8),
                            _mm256_set1_epi8((2u8 << (2 * j)) as i8),
                        );
                        let k = _mm512_test_epi8_mask(qh, bits);
                        codes = _mm512_mask_add_epi8(codes, k, codes, _mm512_set1_epi8(16));
                    }
                    codes
                });
                let scales_lo = _mm512_shuffle_epi8(sc, shuf01);
                let scales_hi = _mm512_shuffle_epi8(sc, shuf23);
                let mins_scales = _mm256_shuffle_epi8(
                    _mm512_castsi512_si256(sc),
                    _mm512_castsi512_si256(mins_ctrl),
                );
                let (d, dmin) = (u16_at(x.as_ptr()), u16_at(x[2..].as_ptr()));
                for (t, y) in sbs.iter().enumerate() {
                    let y = &y[s];
                    let bsums = load256(y[260..].as_ptr());
                    let mins = _mm256_madd_epi16(bsums, mins_scales);
                    let dots: [__m512i; 4] = std::array::from_fn(|j| {
                        let yv = _mm512_loadu_si512(y[4 + 64 * j..].as_ptr().cast());
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[j], yv)
                    });
                    let p01 = _mm512_packs_epi32(dots[0], dots[1]);
                    let p23 = _mm512_packs_epi32(dots[2], dots[3]);
                    let sumi =
                        _mm512_dpwssd_epi32(_mm512_madd_epi16(p01, scales_lo), p23, scales_hi);
                    let out = &mut buf[t * nsb + s];
                    out[0][r] = _mm512_reduce_add_epi32(sumi) as u32;
                    out[1][r] = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(mins)) as u32;
                    out[2][r] = d;
                    out[3][r] = dmin;
                }
            }
        }
    }
    for (t, ft) in f.iter_mut().enumerate() {
        *ft = k_replay(&buf[t * nsb..(t + 1) * nsb], &side[t].dy, true);
    }
}

/// Q6_K over `nrows` ≤ 16 whole rows at `w`; `init[4s + i]` is `−32 · Σ4y` per lane of the
/// activation's 64-byte quarter i of superblock s (removes the −32 offset exactly).
///
/// Codes are unpacked once per superblock for all the tokens (`init[t]`, `f[t]`: token t's).
///
/// # Safety
/// As [`k4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k(
    w: &[u8],
    row_bytes: usize,
    nsb: usize,
    act: &[&[u8]],
    side: &[ActSide],
    init: &[Vec<__m512i>],
    f: &mut [__m512],
) {
    let sbs: Vec<&[[u8; 292]]> = act.iter().map(|a| a.as_chunks::<292>().0).collect();
    for ((y, s), i) in sbs.iter().zip(side).zip(init) {
        assert!(y.len() >= nsb && s.dy.len() >= nsb && i.len() >= 4 * nsb);
    }
    assert!(row_bytes == nsb * 210 && w.len() <= ROWS * row_bytes && init.len() >= act.len());
    let tokens = act.len();
    let m0f = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let sl = join(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    let sr = join(_mm256_set1_epi16(0), _mm256_set1_epi16(2));
    let quads = [
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
    ];
    // Token t's superblock s is `buf[t · nsb + s]`.
    let mut buf: KBuf = vec![[[0; ROWS]; 4]; tokens * nsb];
    let mut isum = [_mm512_setzero_si512(); MAX_TOKENS];
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        for s in 0..nsb {
            let x = &row[210 * s..210 * (s + 1)];
            prefetch_ahead(x.as_ptr(), 210);
            // SAFETY: all reads are inside superblock `x` (ql +0..128, qh +128..192, scales
            // +192..208, d +208..210) and the activation superblocks `y` (codes +4..260).
            unsafe {
                isum[..tokens].fill(_mm512_setzero_si512());
                for h in 0..2 {
                    let ql = _mm512_loadu_si512(x[64 * h..].as_ptr().cast());
                    let qh = _mm512_broadcast_i64x4(load256(x[128 + 32 * h..].as_ptr()));
                    // Weights 128h..+64 (sub-blocks 8h..8h+4) and 128h+64..+128 (8h+4..8h+8).
                    let lo = _mm512_ternarylogic_epi64::<0xCA>(
                        m0f,
                        ql,
                        _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30),
                    );
                    let hi = _mm512_ternarylogic_epi64::<0xCA>(
                        m0f,
                        _mm512_srli_epi16::<4>(ql),
                        _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30),
                    );
                    let sc8 = _mm_loadl_epi64(x[192 + 8 * h..].as_ptr().cast());
                    let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi32(sc8));
                    let (sc_lo, sc_hi) = (
                        _mm512_permutexvar_epi32(quads[0], sc),
                        _mm512_permutexvar_epi32(quads[1], sc),
                    );
                    for (t, y) in sbs.iter().enumerate() {
                        let y = &y[s];
                        let ylo = _mm512_loadu_si512(y[4 + 128 * h..].as_ptr().cast());
                        let yhi = _mm512_loadu_si512(y[68 + 128 * h..].as_ptr().cast());
                        let dlo = _mm512_dpbusd_epi32(init[t][4 * s + 2 * h], lo, ylo);
                        let dhi = _mm512_dpbusd_epi32(init[t][4 * s + 2 * h + 1], hi, yhi);
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dlo, sc_lo));
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dhi, sc_hi));
                    }
                }
                let d = u16_at(x[208..].as_ptr());
                for (t, &v) in isum[..tokens].iter().enumerate() {
                    let out = &mut buf[t * nsb + s];
                    out[0][r] = _mm512_reduce_add_epi32(v) as u32;
                    out[2][r] = d;
                }
            }
        }
    }
    for (t, ft) in f.iter_mut().enumerate() {
        *ft = k_replay(&buf[t * nsb..(t + 1) * nsb], &side[t].dy, false);
    }
}
