//! AVX-512 VNNI tiled kernels: 16 weight rows (one per 32-bit lane) × up to 8 tokens.
//!
//! Repack: 16 bytes at the same offset of the tile's 16 rows are loaded and transposed (4 × 4
//! dwords per 128-bit lane) so that register k holds bytes 4k..4k+4 of every row; unpacking
//! nibbles / high bits / scales is then vectorized across rows and already in the interleaved
//! layout (16-lane gathers did the same but cost ≈ 4× more on Zen 5). Codes are stored biased
//! by +128 (`code ^ 0x80`).
//!
//! Micro-kernels: per block and token, the accumulator starts at the token's `−128·Σy`, then
//! `block/4` `vpdpbusd` with the token's 4 codes broadcast from memory add the biased dots of
//! all 16 rows, giving each row's exact integer block dot. The float arithmetic after that is
//! the scalar reference's, operation for operation (no FMA contraction), so every lane's
//! result is bit-identical to `dot(Isa::Scalar, ..)`: legacy blocks `sum + sumi·(dx·dy)`
//! (affine `+ m·(dy·Σy)`); k-quants `isum += sc·sumi` per sub-block (`vpmulld`), mins via
//! `vpdpwssd` on i16 pairs, then `sum + ((d·dy)·isum − (dmin·dy)·Σ m·Σy)` per superblock.

use std::arch::x86_64::*;

use super::{GROUP, Kind, PreparedActs, act_record_bytes, records, tile_bytes, tile_record_bytes};
use crate::GgmlType;

/// Rows per tile: one per 32-bit lane of a 512-bit register.
pub(super) const TILE: usize = 16;

/// `acc + Σ` over `rows` tiles: see the module docs. Runs the whole matmul for `prep`'s tokens.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C. `w_rows` holds whole rows of
/// `row_bytes` bytes of type `ty` with `n` values each, `prep` was built for (`kind`, `n`), and
/// `out` holds `(tokens - 1) * out_stride + rows` values (checked by the caller). With
/// `rows16`, `w_rows` holds whole groups in the rows16 layout instead, of a type where
/// `crate::rows16::has_layout` holds.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn run(
    ty: GgmlType,
    kind: Kind,
    n: usize,
    w_rows: &[u8],
    row_bytes: usize,
    prep: &PreparedActs,
    out: &mut [f32],
    out_stride: usize,
    rows16: bool,
) {
    let rows = w_rows.len() / row_bytes;
    let tokens = prep.tokens();
    assert!(
        !rows16 || (crate::rows16::has_layout(ty) && rows.is_multiple_of(TILE)),
        "rows16 input is whole groups of a type with that layout"
    );
    if rows == 0 || tokens == 0 {
        return;
    }
    assert!(
        (tokens - 1) * out_stride + rows <= out.len(),
        "tiled matmul output too short"
    );
    let per_pass = super::rows_per_pass(kind, n, TILE);
    let tb = tile_bytes(kind, n, TILE);
    let groups = tokens.div_ceil(GROUP);
    super::with_repack_buffer(|buf| {
        for p0 in (0..rows).step_by(per_pass) {
            let p1 = (p0 + per_pass).min(rows);
            let tiles = (p1 - p0).div_ceil(TILE);
            if buf.len() < tiles * tb {
                buf.resize(tiles * tb, 0);
            }
            for (i, tile) in buf[..tiles * tb].chunks_exact_mut(tb).enumerate() {
                let r0 = p0 + i * TILE;
                let r1 = (r0 + TILE).min(p1);
                let w = &w_rows[r0 * row_bytes..r1 * row_bytes];
                if rows16 {
                    repack_rows16(ty, n, w, tile);
                } else {
                    repack(ty, kind, n, w, row_bytes, tile);
                }
            }
            for g in 0..groups {
                let t0 = g * GROUP;
                let count = (tokens - t0).min(GROUP);
                let acts = prep.group(g);
                for (i, tile) in buf[..tiles * tb].chunks_exact(tb).enumerate() {
                    let r0 = p0 + i * TILE;
                    let nrows = (p1 - r0).min(TILE);
                    let out = &mut out[t0 * out_stride + r0..];
                    tile_product(kind, n, count, tile, acts, out, out_stride, nrows);
                }
            }
        }
    });
}

/// `out[t * stride + r] = row r of the repacked `tile` · token t of the prepared `acts`
/// group, for t < `count`, r < `nrows`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn tile_product(
    kind: Kind,
    n: usize,
    count: usize,
    tile: &[u8],
    acts: &[u8],
    out: &mut [f32],
    stride: usize,
    nrows: usize,
) {
    let nrec = records(kind, n);
    assert!(
        (1..=GROUP).contains(&count)
            && (1..=TILE).contains(&nrows)
            && tile.len() >= nrec * tile_record_bytes(kind, TILE)
            && acts.len() >= nrec * act_record_bytes(kind)
            && (count - 1) * stride + nrows <= out.len(),
        "tile_product geometry"
    );
    let mask = ((1u32 << nrows) - 1) as __mmask16;
    let (t, a, o) = (tile.as_ptr(), acts.as_ptr(), out.as_mut_ptr());
    macro_rules! by_count {
        ($f:ident $(, $c:expr)*) => {
            // SAFETY: the assert above bounds every record the kernel reads (nrec records of
            // the tile and of the activation group) and every masked store (row < nrows of
            // token row < count, each inside `out`); the CPU features are those of this fn.
            unsafe {
                match count {
                    1 => $f::<1 $(, $c)*>(t, a, nrec, o, stride, mask),
                    2 => $f::<2 $(, $c)*>(t, a, nrec, o, stride, mask),
                    3 => $f::<3 $(, $c)*>(t, a, nrec, o, stride, mask),
                    4 => $f::<4 $(, $c)*>(t, a, nrec, o, stride, mask),
                    5 => $f::<5 $(, $c)*>(t, a, nrec, o, stride, mask),
                    6 => $f::<6 $(, $c)*>(t, a, nrec, o, stride, mask),
                    7 => $f::<7 $(, $c)*>(t, a, nrec, o, stride, mask),
                    _ => $f::<8 $(, $c)*>(t, a, nrec, o, stride, mask),
                }
            }
        };
    }
    match kind {
        Kind::Legacy { min: false } => by_count!(legacy_kernel, false),
        Kind::Legacy { min: true } => by_count!(legacy_kernel, true),
        Kind::K {
            block: 32,
            min: true,
        } => by_count!(k_kernel, 8, true),
        Kind::K {
            block: 32,
            min: false,
        } => by_count!(k_kernel, 8, false),
        Kind::K {
            block: 16,
            min: true,
        } => by_count!(k_kernel, 4, true),
        Kind::K {
            block: 16,
            min: false,
        } => by_count!(k_kernel, 4, false),
        Kind::K { .. } => unreachable!("k-quant sub-blocks are 16 or 32 values"),
    }
}

/// Legacy kinds: `T` tokens × 16 rows over `nrec` 32-value blocks; see the module docs.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `tile` and `acts` point to `nrec` records each (layouts of
/// `tile_record_bytes` / `act_record_bytes`), and `out + t * stride` has 16 writable lanes for
/// every lane set in `mask`, t < `T`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_kernel<const T: usize, const MIN: bool>(
    tile: *const u8,
    acts: *const u8,
    nrec: usize,
    out: *mut f32,
    stride: usize,
    mask: __mmask16,
) {
    let wrec = tile_record_bytes(Kind::Legacy { min: MIN }, TILE);
    let arec = act_record_bytes(Kind::Legacy { min: MIN });
    let mut f = [_mm512_setzero_ps(); T];
    for b in 0..nrec {
        // SAFETY: record b of the tile spans [b·wrec, (b+1)·wrec) and of the
        // activations [b·arec, (b+1)·arec); every load below stays inside them (caller's
        // contract), and unaligned loads / broadcasts have no alignment requirement.
        unsafe {
            let wp = tile.add(b * wrec);
            let ap = acts.add(b * arec);
            let mut w = [_mm512_setzero_si512(); 8];
            for (g, w) in w.iter_mut().enumerate() {
                *w = _mm512_loadu_si512(wp.add(64 * g).cast());
            }
            let wd = _mm512_loadu_ps(wp.add(512).cast());
            for (t, f) in f.iter_mut().enumerate() {
                // Token by token here: all T chains at once would spill (f, w and accumulators
                // fill the 32 registers).
                let [acc] = dots_biased::<1, 8>(&w, ap.add(32 * t), 0, ap.add(288 + 4 * t));
                let dy = _mm512_set1_ps(ap.add(256 + 4 * t).cast::<f32>().read_unaligned());
                let mut p = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(wd, dy));
                if MIN {
                    let wm = _mm512_loadu_ps(wp.add(576).cast());
                    let ms = ap.add(320 + 4 * t).cast::<f32>().read_unaligned();
                    p = _mm512_add_ps(p, _mm512_mul_ps(wm, _mm512_set1_ps(ms)));
                }
                *f = _mm512_add_ps(*f, p);
            }
        }
    }
    for (t, &f) in f.iter().enumerate() {
        // SAFETY: lanes set in `mask` of token row t are writable (caller's contract).
        unsafe { _mm512_mask_storeu_ps(out.add(t * stride), mask, f) };
    }
}

/// The exact integer dots of 16 rows' biased codes `w` (`G` groups of 4) with the codes of
/// tokens 0..T at `qs + t·stride`, each starting from the token's `−128·Σy` at `noff + 4t`.
/// Groups run outermost so that consecutive `vpdpbusd` are independent (T chains in flight).
///
/// # Safety
/// AVX-512 VNNI; `qs + t·stride` has `4 G` readable bytes and `noff + 4t` 4, for t < T.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dots_biased<const T: usize, const G: usize>(
    w: &[__m512i; G],
    qs: *const u8,
    stride: usize,
    noff: *const u8,
) -> [__m512i; T] {
    // SAFETY: the reads stay in the ranges of the contract; no alignment is required.
    unsafe {
        let mut acc: [__m512i; T] = std::array::from_fn(|t| {
            _mm512_set1_epi32(noff.add(4 * t).cast::<i32>().read_unaligned())
        });
        for (g, &w) in w.iter().enumerate() {
            for (t, acc) in acc.iter_mut().enumerate() {
                let y = qs.add(stride * t + 4 * g).cast::<i32>().read_unaligned();
                *acc = _mm512_dpbusd_epi32(*acc, w, _mm512_set1_epi32(y));
            }
        }
        acc
    }
}

/// K kinds: `T` tokens × 16 rows over `nrec` superblocks of sub-blocks of `4 G4` values.
///
/// # Safety
/// As [`legacy_kernel`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn k_kernel<const T: usize, const G4: usize, const MIN: bool>(
    tile: *const u8,
    acts: *const u8,
    nrec: usize,
    out: *mut f32,
    stride: usize,
    mask: __mmask16,
) {
    let block = 4 * G4;
    let kind = Kind::K { block, min: MIN };
    let subs = super::subs(block);
    let wrec = tile_record_bytes(kind, TILE);
    let arec = act_record_bytes(kind);
    let whead = super::k_tile_head_bytes(block, MIN, TILE);
    let wsub = super::k_tile_sub_bytes(block, TILE);
    let ahead = GROUP * 4 + GROUP * 2 * subs;
    let asub = super::k_act_sub_bytes(block);
    let mut f = [_mm512_setzero_ps(); T];
    for s in 0..nrec {
        // SAFETY: superblock record s spans [s·wrec, (s+1)·wrec) of the tile
        // and [s·arec, (s+1)·arec) of the activations; all offsets below are inside them by the
        // layouts of `tile_record_bytes` / `act_record_bytes` (caller's contract).
        unsafe {
            let wp = tile.add(s * wrec);
            let ap = acts.add(s * arec);
            let mut isum = [_mm512_setzero_si512(); T];
            for j in 0..subs {
                let ws = wp.add(whead + j * wsub);
                let a = ap.add(ahead + j * asub);
                let mut w = [_mm512_setzero_si512(); G4];
                for (g, w) in w.iter_mut().enumerate() {
                    *w = _mm512_loadu_si512(ws.add(64 * g).cast());
                }
                let sc = _mm512_loadu_si512(ws.add(64 * G4).cast());
                let accs = dots_biased::<T, G4>(&w, a, block, a.add(GROUP * block));
                for (isum, &acc) in isum.iter_mut().zip(&accs) {
                    *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(acc, sc));
                }
            }
            let d = _mm512_loadu_ps(wp.cast());
            for (t, f) in f.iter_mut().enumerate() {
                let dy = _mm512_set1_ps(ap.add(4 * t).cast::<f32>().read_unaligned());
                let mut term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum[t]));
                if MIN {
                    let mut summ = _mm512_setzero_si512();
                    for i in 0..subs / 2 {
                        let m = _mm512_loadu_si512(wp.add(128 + 64 * i).cast());
                        let sy = ap
                            .add(GROUP * 4 + 2 * subs * t + 4 * i)
                            .cast::<i32>()
                            .read_unaligned();
                        summ = _mm512_dpwssd_epi32(summ, m, _mm512_set1_epi32(sy));
                    }
                    let dmin = _mm512_loadu_ps(wp.add(64).cast());
                    let m_term = _mm512_mul_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(summ));
                    term = _mm512_sub_ps(term, m_term);
                }
                *f = _mm512_add_ps(*f, term);
            }
        }
    }
    for (t, &f) in f.iter().enumerate() {
        // SAFETY: lanes set in `mask` of token row t are writable (caller's contract).
        unsafe { _mm512_mask_storeu_ps(out.add(t * stride), mask, f) };
    }
}

// ---------------------------------------------------------------------------------------------
// Repacking.

/// Repack `w` (≤ 16 whole rows) into `dst` (one tile): SIMD for the common types, the scalar
/// reference for the rest.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn repack(
    ty: GgmlType,
    kind: Kind,
    n: usize,
    w: &[u8],
    row_bytes: usize,
    dst: &mut [u8],
) {
    let rows = w.len() / row_bytes;
    assert!(
        (1..=TILE).contains(&rows)
            && w.len() == rows * row_bytes
            && row_bytes * TILE < i32::MAX as usize
            && dst.len() >= tile_bytes(kind, n, TILE)
            && row_bytes == crate::check_row(ty, n).unwrap_or(usize::MAX),
        "repack geometry"
    );
    let g = Rows16::new(w.as_ptr(), row_bytes, rows);
    // SAFETY: every `quad` below reads 16 bytes at an offset ≤ row_bytes - 16 within a row's
    // block of the type's layout (listed per type), from rows < `rows` only (clamped); the
    // asserts above guarantee 1 ≤ rows ≤ 16 rows exist in `w`, and every store stays inside
    // `dst`'s tile.
    unsafe {
        match ty {
            GgmlType::Q8_0 => repack_q8_0(&g, n / 32, dst),
            GgmlType::Q4_0 => repack_q4_0(&g, n / 32, dst),
            GgmlType::Q5_0 => repack_q5_0(&g, n / 32, dst),
            GgmlType::Q4K => repack_k4::<false>(&g, n / 256, dst),
            GgmlType::Q5K => repack_k4::<true>(&g, n / 256, dst),
            GgmlType::Q6K => repack_q6k(&g, n / 256, dst),
            _ => super::repack_scalar(ty, kind, n, w, row_bytes, TILE, 0x80, dst),
        }
    }
}

/// The tile [`repack`] makes of 16 rows, from the same rows as one group of the rows16 layout
/// (`group`, see `crate::rows16`), for every type with that layout. Both layouts keep
/// a block's codes as 4-code × 16-row registers, so each register only takes the +128 bias (and
/// Q4_0/Q5_0 their nibble split and fifth bits: bit `k` of a Q5_0 rows16 fifth-bit plane is
/// one bit per byte of register `k`) and the 16 scales widen to f32 — no transposes, unlike
/// the repack of 16 separate rows. The k-quants (Q4_K, Q5_K, Q6_K) run their repacks' own
/// arithmetic on the group's registers ([`Group16`]). Byte for byte the same tile (tested).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) fn repack_rows16(ty: GgmlType, n: usize, group: &[u8], dst: &mut [u8]) {
    if matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) {
        let kind = super::kind(ty).expect("k-quants have a tiled kind").0;
        let nsb = n / crate::QK_K;
        let g = Group16::new(ty, group);
        assert!(
            n.is_multiple_of(crate::QK_K)
                && group.len() == nsb * g.group_block
                && dst.len() >= nsb * tile_record_bytes(kind, TILE),
            "rows16 tile repack geometry"
        );
        // SAFETY: the CPU features are this fn's; `g` reads the `nsb` superblock-groups that
        // `group` holds (asserted), and `dst` holds a tile of `nsb` records.
        unsafe {
            match ty {
                GgmlType::Q4K => repack_k4::<false>(&g, nsb, dst),
                GgmlType::Q5K => repack_k4::<true>(&g, nsb, dst),
                _ => repack_q6k(&g, nsb, dst),
            }
        }
        return;
    }
    let nb = n / 32;
    // A block-group's bytes, whether it has mins (after the 16 scales) and a fifth-bit plane
    // (after those), and the bias that makes a nibble type's code the tile's biased code
    // (q − 8 + 128, q5 − 16 + 128; Q4_1/Q5_1's codes are unsigned: + 128).
    let (block_bytes, min, five, bias) = match ty {
        GgmlType::Q8_0 => (544, false, false, 0),
        GgmlType::Q4_0 => (288, false, false, 120),
        GgmlType::Q5_0 => (352, false, true, 112),
        GgmlType::Q4_1 => (320, true, false, 128),
        GgmlType::Q5_1 => (384, true, true, 128),
        _ => panic!("no direct rows16 tile repack for {ty:?}"),
    };
    let plane_at = if min { 64 } else { 32 };
    let codes_at = plane_at + if five { 64 } else { 0 };
    let rec = tile_record_bytes(Kind::Legacy { min }, TILE);
    assert!(
        n.is_multiple_of(32) && group.len() == nb * block_bytes && dst.len() >= nb * rec,
        "rows16 tile repack geometry"
    );
    let m4 = _mm512_set1_epi8(0x0F);
    let bias = _mm512_set1_epi8(bias as u8 as i8);
    let fifth = _mm512_set1_epi8(0x10);
    for b in 0..nb {
        let src = group[b * block_bytes..(b + 1) * block_bytes].as_ptr();
        let r = dst[b * rec..(b + 1) * rec].as_mut_ptr();
        // SAFETY: `src` spans one rows16 block (`block_bytes`: 32 bytes of scales, the mins,
        // the plane, then 64-byte code registers) and `r` one tile record (8 code registers,
        // 16 f32 scales, 16 f32 mins), both inside their slices by the assert; the loads and
        // stores are unaligned.
        unsafe {
            let load = |at: usize| _mm512_loadu_si512(src.add(at).cast());
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(src.cast()));
            if ty == GgmlType::Q8_0 {
                let flip = _mm512_set1_epi8(0x80u8 as i8);
                for k in 0..8 {
                    store(r.add(64 * k), _mm512_xor_si512(load(32 + 64 * k), flip));
                }
            } else {
                // Plane byte 4r + i, bit j = the fifth bit of code 4j + i of row r.
                let plane = load(plane_at);
                let mask =
                    |j: usize| _mm512_test_epi8_mask(plane, _mm512_set1_epi8((1u8 << j) as i8));
                for k in 0..4 {
                    let q = load(codes_at + 64 * k);
                    let mut lo = _mm512_and_si512(q, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi32::<4>(q), m4);
                    if five {
                        lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(mask(k), fifth));
                        hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(mask(k + 4), fifth));
                    }
                    store(r.add(64 * k), _mm512_add_epi8(lo, bias));
                    store(r.add(64 * (k + 4)), _mm512_add_epi8(hi, bias));
                }
            }
            store_ps(r.add(512), d);
            if min {
                store_ps(
                    r.add(576),
                    _mm512_cvtph_ps(_mm256_loadu_si256(src.add(32).cast())),
                );
            }
        }
    }
}

/// Loads of the same offset from each of up to 16 rows, transposed so that lane r = row r.
struct Rows16 {
    base: *const u8,
    row_bytes: usize,
    /// Row index per lane, clamped to the last existing row.
    clamp: [usize; TILE],
    mask: __mmask16,
}

impl Rows16 {
    #[target_feature(enable = "avx512f")]
    fn new(base: *const u8, row_bytes: usize, rows: usize) -> Rows16 {
        Rows16 {
            base,
            row_bytes,
            clamp: std::array::from_fn(|r| r.min(rows.max(1) - 1)),
            mask: ((1u32 << rows) - 1) as __mmask16,
        }
    }

    /// The 16 bytes at `off` of every row as 4 registers: register k, lane r = bytes
    /// `off + 4k .. off + 4k + 4` of row r (0 for rows past the end) — the same as
    /// four 16-lane gathers of `off, off + 4, ..`, from 16 loads and a 4 × 4 transpose instead
    /// (≈ 4× fewer cycles on Zen 5).
    ///
    /// # Safety
    /// `off + 16 <= row_bytes` and at least one row exists.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn quad(&self, off: usize) -> [__m512i; 4] {
        // SAFETY: every load reads 16 bytes at `off` of a clamped (existing) row, inside the
        // row by the contract; loadu has no alignment requirement.
        let z: [__m512i; 4] = unsafe {
            let row = |r: usize| -> __m128i {
                let p = self.base.add(self.clamp[r] * self.row_bytes + off);
                _mm_loadu_si128(p.cast())
            };
            std::array::from_fn(|q| {
                // 128-bit lane l holds row q + 4l, so the transpose below yields row order.
                let v = _mm512_castsi128_si512(row(q));
                let v = _mm512_inserti32x4::<1>(v, row(q + 4));
                let v = _mm512_inserti32x4::<2>(v, row(q + 8));
                _mm512_inserti32x4::<3>(v, row(q + 12))
            })
        };
        let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
        let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
        let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
        .map(|v| _mm512_maskz_mov_epi32(self.mask, v))
    }

    /// Prefetch part `part` of `parts` of the 16 rows that follow this tile's (at least 32 KiB
    /// ahead): the repack reads 16 rows as 16 interleaved streams, which the hardware
    /// prefetchers do not follow well (as in the decode kernels).
    #[inline]
    fn prefetch_next(&self, part: usize, parts: usize) {
        let group = TILE * self.row_bytes;
        let lines = group.div_ceil(64).div_ceil(parts.max(1));
        let ahead = group * (32usize << 10).div_ceil(group);
        let start = self.base.wrapping_add(ahead + 64 * lines * part);
        for l in 0..lines {
            // SAFETY: `prefetcht0` is a hint: it never faults and has no visible effect,
            // whatever the address (`wrapping_add` keeps the pointer arithmetic defined).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(64 * l).cast()) };
        }
    }

    /// `v` in the tile's rows, 0 in padding lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pad0(&self, v: __m512i) -> __m512i {
        _mm512_maskz_mov_epi32(self.mask, v)
    }

    /// `v` in the tile's rows, the biased code 0 in padding lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pad(&self, v: __m512i) -> __m512i {
        _mm512_mask_blend_epi32(self.mask, _mm512_set1_epi32(0x8080_8080u32 as i32), v)
    }
}

/// Where the k-quant repacks read a tile's 16 rows from: the file's rows ([`Rows16`], a
/// transpose per 16 bytes) or one group in the rows16 layout ([`Group16`], where the same
/// registers are stored ready, as plain loads). Offsets are the file layout's, in a row.
///
/// # Safety (every method)
/// The CPU has AVX-512 F/BW/VL; offsets are those of the type's fields inside the rows.
trait TileRows {
    /// Register k, lane r = bytes `off + 4k .. off + 4k + 4` of row r, for k < 4 (0 for
    /// pieces that are not 4-byte fields of the rows16 layout: `d`, `dmin`).
    unsafe fn quad(&self, off: usize) -> [__m512i; 4];
    /// The f16 at `off` and at `off + 2` of every row, as f32 (Q4_K's `d` and `dmin`).
    unsafe fn half_pair(&self, off: usize) -> (__m512, __m512);
    /// The f16 at `off` (≥ 14) of every row, as f32 (Q6_K's `d`, its last two bytes).
    unsafe fn half(&self, off: usize) -> __m512;
    /// `v` in the tile's rows, 0 in padding lanes.
    unsafe fn pad0(&self, v: __m512i) -> __m512i;
    /// `v` in the tile's rows, the biased code 0 in padding lanes.
    unsafe fn pad(&self, v: __m512i) -> __m512i;
    /// Prefetch part `part` of `parts` of what follows.
    fn prefetch_next(&self, part: usize, parts: usize);
}

impl TileRows for Rows16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn quad(&self, off: usize) -> [__m512i; 4] {
        // SAFETY: the trait's contract is `Rows16::quad`'s.
        unsafe { Rows16::quad(self, off) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn half_pair(&self, off: usize) -> (__m512, __m512) {
        // SAFETY: the 16 bytes at `off` lie in the rows (the contract).
        let dd = unsafe { Rows16::quad(self, off) }[0];
        (f16_lo(dd), f16_lo(_mm512_srli_epi32::<16>(dd)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn half(&self, off: usize) -> __m512 {
        // SAFETY: the 16 bytes ending with the f16 at `off` lie in the rows (the contract).
        f16_lo(_mm512_srli_epi32::<16>(
            unsafe { Rows16::quad(self, off - 14) }[3],
        ))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn pad0(&self, v: __m512i) -> __m512i {
        Rows16::pad0(self, v)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn pad(&self, v: __m512i) -> __m512i {
        Rows16::pad(self, v)
    }

    #[inline]
    fn prefetch_next(&self, part: usize, parts: usize) {
        Rows16::prefetch_next(self, part, parts)
    }
}

/// One 16-row group of a k-quant in the rows16 layout, read through the layout's maps from a
/// file-layout offset to where the 16 rows' pieces lie side by side.
struct Group16 {
    base: *const u8,
    /// Bytes of one row's superblock, and of the group's.
    block: usize,
    group_block: usize,
    register: fn(usize) -> Option<usize>,
    halves: fn(usize) -> usize,
}

impl Group16 {
    /// Group `group` (whole superblock-groups) of type `ty` (Q4_K, Q5_K or Q6_K).
    fn new(ty: GgmlType, group: &[u8]) -> Group16 {
        use crate::rows16::{q4k, q5k, q6k};
        let (block, group_block, register, halves): (_, _, fn(_) -> _, fn(_) -> _) = match ty {
            GgmlType::Q4K => (q4k::BLOCK, q4k::GROUP_BLOCK, q4k::register, q4k::halves),
            GgmlType::Q5K => (q5k::BLOCK, q5k::GROUP_BLOCK, q5k::register, q5k::halves),
            GgmlType::Q6K => (q6k::BLOCK, q6k::GROUP_BLOCK, q6k::register, q6k::halves),
            _ => panic!("no rows16 k-quant layout for {ty:?}"),
        };
        assert!(
            group.len().is_multiple_of(group_block),
            "whole superblock-groups"
        );
        Group16 {
            base: group.as_ptr(),
            block,
            group_block,
            register,
            halves,
        }
    }

    /// The start of superblock-group `off / block` and the offset within a row's superblock.
    fn at(&self, off: usize) -> (*const u8, usize) {
        let (s, x) = (off / self.block, off % self.block);
        (self.base.wrapping_add(s * self.group_block), x)
    }
}

impl TileRows for Group16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn quad(&self, off: usize) -> [__m512i; 4] {
        let (p, x) = self.at(off);
        std::array::from_fn(|k| match (self.register)(x + 4 * k) {
            // SAFETY: a register of a superblock-group inside the group (the contract: `off`
            // is a field of a superblock the group holds).
            Some(at) => unsafe { _mm512_loadu_si512(p.add(at).cast()) },
            None => _mm512_setzero_si512(),
        })
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn half_pair(&self, off: usize) -> (__m512, __m512) {
        // SAFETY: as `half`, for the two fields.
        unsafe { (self.half(off), self.half(off + 2)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn half(&self, off: usize) -> __m512 {
        let (p, x) = self.at(off);
        // SAFETY: 16 f16 of a superblock-group inside the group (the contract).
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.add((self.halves)(x)).cast()) })
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn pad0(&self, v: __m512i) -> __m512i {
        v
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn pad(&self, v: __m512i) -> __m512i {
        v
    }

    /// Nothing: a group is one sequential stream, which the hardware prefetchers follow.
    #[inline]
    fn prefetch_next(&self, _part: usize, _parts: usize) {}
}

/// f16 values in the low 16 bits of each lane, as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_lo(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store(dst: *mut u8, v: __m512i) {
    // SAFETY: the caller passes 64 writable bytes.
    unsafe { _mm512_storeu_si512(dst.cast(), v) }
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_ps(dst: *mut u8, v: __m512) {
    // SAFETY: the caller passes 64 writable bytes.
    unsafe { _mm512_storeu_ps(dst.cast(), v) }
}

/// Byte j of each lane: bit 4 set iff bit j of `(lane >> shift)` is set, for j < 4.
#[inline]
#[target_feature(enable = "avx512f")]
fn spread_bits4(v: __m512i, shift: u32) -> __m512i {
    let t = _mm512_and_si512(
        _mm512_srl_epi32(v, _mm_cvtsi32_si128(shift as i32)),
        _mm512_set1_epi32(0xF),
    );
    // Copies of the 4 bits at bit offsets 0, 7, 14, 21 put bit j at bit 8j (no overlaps).
    let s = _mm512_and_si512(
        _mm512_mullo_epi32(t, _mm512_set1_epi32(0x0020_4081)),
        _mm512_set1_epi32(0x0101_0101),
    );
    _mm512_slli_epi32::<4>(s)
}

/// Safety (all `repack_*`): `g` loads from whole rows of the type's blocks (nb legacy blocks /
/// superblocks each) and `dst` holds one tile of the kind's records.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn repack_q8_0(g: &Rows16, nb: usize, dst: &mut [u8]) {
    let rec = TILE * (32 + 4);
    assert!(dst.len() >= nb * rec);
    let flip = _mm512_set1_epi32(0x8080_8080u32 as i32);
    for b in 0..nb {
        g.prefetch_next(b, nb);
        let r = dst[b * rec..].as_mut_ptr();
        // SAFETY: block b spans bytes 34b..34b+34 of each row; the 16-byte reads are at +0, +2
        // and +18 (d, qs), inside it.
        unsafe {
            let d = f16_lo(g.quad(34 * b)[0]);
            let q = [g.quad(34 * b + 2), g.quad(34 * b + 18)];
            for k in 0..8 {
                let q = _mm512_xor_si512(q[k / 4][k % 4], flip);
                store(r.add(64 * k), g.pad(q));
            }
            store_ps(r.add(512), d);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn repack_q4_0(g: &Rows16, nb: usize, dst: &mut [u8]) {
    let rec = TILE * (32 + 4);
    assert!(dst.len() >= nb * rec);
    let m4 = _mm512_set1_epi8(0x0F);
    // nibble − 8 + 128.
    let bias = _mm512_set1_epi8(120);
    for b in 0..nb {
        g.prefetch_next(b, nb);
        let r = dst[b * rec..].as_mut_ptr();
        // SAFETY: block b spans 18b..18b+18; the 16-byte reads at +0 (d) and +2 (qs) are inside.
        unsafe {
            let d = f16_lo(g.quad(18 * b)[0]);
            let qs = g.quad(18 * b + 2);
            for (k, &q) in qs.iter().enumerate() {
                let lo = _mm512_add_epi8(_mm512_and_si512(q, m4), bias);
                let hi = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi32::<4>(q), m4), bias);
                store(r.add(64 * k), g.pad(lo));
                store(r.add(64 * (k + 4)), g.pad(hi));
            }
            store_ps(r.add(512), d);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn repack_q5_0(g: &Rows16, nb: usize, dst: &mut [u8]) {
    let rec = TILE * (32 + 4);
    assert!(dst.len() >= nb * rec);
    let m4 = _mm512_set1_epi8(0x0F);
    // q5 − 16 + 128.
    let bias = _mm512_set1_epi8(112);
    for b in 0..nb {
        g.prefetch_next(b, nb);
        let r = dst[b * rec..].as_mut_ptr();
        // SAFETY: block b spans 22b..22b+22; the 16-byte reads at +0 (d, qh) and +6 (qs) are
        // inside.
        unsafe {
            // Bytes 0..4 = d, qh[0..2]; 4..8 = qh[2..4], qs[0..2].
            let [h0, h1, _, _] = g.quad(22 * b);
            let d = f16_lo(h0);
            let qh = _mm512_or_si512(_mm512_srli_epi32::<16>(h0), _mm512_slli_epi32::<16>(h1));
            let qs = g.quad(22 * b + 6);
            for (k, &q) in qs.iter().enumerate() {
                let lo = _mm512_or_si512(_mm512_and_si512(q, m4), spread_bits4(qh, 4 * k as u32));
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<4>(q), m4),
                    spread_bits4(qh, 16 + 4 * k as u32),
                );
                store(r.add(64 * k), g.pad(_mm512_add_epi8(lo, bias)));
                store(r.add(64 * (k + 4)), g.pad(_mm512_add_epi8(hi, bias)));
            }
            store_ps(r.add(512), d);
        }
    }
}

/// Q4_K, and Q5_K when `FIVE` (its fifth bits added to the nibbles).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn repack_k4<const FIVE: bool>(g: &impl TileRows, nsb: usize, dst: &mut [u8]) {
    let kind = Kind::K {
        block: 32,
        min: true,
    };
    let rec = tile_record_bytes(kind, TILE);
    let head = super::k_tile_head_bytes(32, true, TILE);
    let sub = super::k_tile_sub_bytes(32, TILE);
    assert!(dst.len() >= nsb * rec);
    let m4 = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let m6 = _mm512_set1_epi32(0x3f3f_3f3f);
    let m4w = _mm512_set1_epi32(0x0f0f_0f0f);
    let m30 = _mm512_set1_epi32(0x3030_3030);
    let byte0 = _mm512_set1_epi32(0xFF);
    let byte2 = _mm512_set1_epi32(0xFF_0000);
    // Bytes of a superblock, and where its codes start (Q5_K: after `qh` at 16..48).
    let (bytes, qs_at) = if FIVE { (176, 48) } else { (144, 16) };
    let sixteen = _mm512_set1_epi8(0x10);
    for s in 0..nsb {
        g.prefetch_next(s, nsb);
        let base = bytes * s;
        let r = dst[s * rec..].as_mut_ptr();
        // SAFETY: superblock s spans bytes·s..bytes·(s+1) of each row: d/dmin at +0..4,
        // scales at +4..16, (Q5_K: qh at +16..48), qs at `qs_at`..; all stores are inside
        // record s of `dst`.
        unsafe {
            let (d, dmin) = g.half_pair(base);
            let [_, a0, a1, a2] = g.quad(base);
            store_ps(r, d);
            store_ps(r.add(64), dmin);
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
            // Min pairs (m_{2i}, m_{2i+1}) as i16 pairs: bytes (0, 1) and (2, 3) of each word.
            for (i, m) in [m_lo, m_hi].into_iter().enumerate() {
                let p01 = _mm512_or_si512(
                    _mm512_and_si512(m, byte0),
                    _mm512_and_si512(_mm512_slli_epi32::<8>(m), byte2),
                );
                let p23 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<16>(m), byte0),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(m), byte2),
                );
                store(r.add(128 + 128 * i), g.pad0(p01));
                store(r.add(192 + 128 * i), g.pad0(p23));
            }
            for j in 0..8u32 {
                let sc = if j < 4 { sc_lo } else { sc_hi };
                let v = _mm512_and_si512(
                    _mm512_srl_epi32(sc, _mm_cvtsi32_si128(8 * (j % 4) as i32)),
                    byte0,
                );
                store(r.add(head + j as usize * sub + 512), g.pad0(v));
            }
            // Q5_K: register k holds `qh[4k..4k + 4]`, whose bits 2p and 2p + 1 are the fifth
            // bits of code chunk k of sub-block pair p.
            let qh: [__m512i; 8] = if FIVE {
                let [a, b] = [0, 1].map(|i| g.quad(base + 16 + 16 * i));
                std::array::from_fn(|k| [a, b][k / 4][k % 4])
            } else {
                [_mm512_setzero_si512(); 8]
            };
            for p in 0..4 {
                let (lo_rec, hi_rec) = (r.add(head + 2 * p * sub), r.add(head + (2 * p + 1) * sub));
                let qs = [
                    g.quad(base + qs_at + 32 * p),
                    g.quad(base + qs_at + 16 + 32 * p),
                ];
                for k in 0..8 {
                    let q = qs[k / 4][k % 4];
                    let mut lo = _mm512_or_si512(_mm512_and_si512(q, m4), flip);
                    let mut hi =
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(q), m4), flip);
                    if FIVE {
                        let (u1, u2) = ((1u8 << (2 * p)) as i8, (2u8 << (2 * p)) as i8);
                        let m_lo = _mm512_test_epi8_mask(qh[k], _mm512_set1_epi8(u1));
                        let m_hi = _mm512_test_epi8_mask(qh[k], _mm512_set1_epi8(u2));
                        lo = _mm512_mask_add_epi8(lo, m_lo, lo, sixteen);
                        hi = _mm512_mask_add_epi8(hi, m_hi, hi, sixteen);
                    }
                    store(lo_rec.add(64 * k), g.pad(lo));
                    store(hi_rec.add(64 * k), g.pad(hi));
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn repack_q6k(g: &impl TileRows, nsb: usize, dst: &mut [u8]) {
    let kind = Kind::K {
        block: 16,
        min: false,
    };
    let rec = tile_record_bytes(kind, TILE);
    let head = super::k_tile_head_bytes(16, false, TILE);
    let sub = super::k_tile_sub_bytes(16, TILE);
    assert!(dst.len() >= nsb * rec);
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(0x03);
    // q6 − 32 + 128.
    let bias = _mm512_set1_epi8(96);
    for s in 0..nsb {
        g.prefetch_next(s, nsb);
        let base = 210 * s;
        let r = dst[s * rec..].as_mut_ptr();
        // SAFETY: superblock s spans 210s..210s+210 of each row: ql at +0..128, qh at
        // +128..192, scales at +192..208, d at +208..210 (the high half of dword 3 of the
        // 16-byte read at +194, which ends at +210); all stores are inside record s of `dst`.
        unsafe {
            store_ps(r, g.half(base + 208));
            store_ps(r.add(64), _mm512_setzero_ps());
            for (c, &sc) in g.quad(base + 192).iter().enumerate() {
                for j in 0..4 {
                    let v = _mm512_sll_epi32(sc, _mm_cvtsi32_si128(24 - 8 * j));
                    let i = 4 * c + j as usize;
                    store(
                        r.add(head + i * sub + 256),
                        g.pad0(_mm512_srai_epi32::<24>(v)),
                    );
                }
            }
            for h in 0..2 {
                let q4 = |off: usize| g.quad(off);
                let ql: [__m512i; 16] = {
                    let [a, b, c, d] = [0, 1, 2, 3].map(|j| q4(base + 64 * h + 16 * j));
                    std::array::from_fn(|m| [a, b, c, d][m / 4][m % 4])
                };
                let qh: [__m512i; 8] = {
                    let [a, b] = [0, 1].map(|j| q4(base + 128 + 32 * h + 16 * j));
                    std::array::from_fn(|m| [a, b][m / 4][m % 4])
                };
                for k in 0..4usize {
                    for lhalf in 0..2usize {
                        let i = 8 * h + 2 * k + lhalf;
                        for gg in 0..4usize {
                            let l = ql[(k % 2) * 8 + 4 * lhalf + gg];
                            let lo = if k < 2 { l } else { _mm512_srli_epi32::<4>(l) };
                            let hb = _mm512_srl_epi32(
                                qh[4 * lhalf + gg],
                                _mm_cvtsi32_si128(2 * k as i32),
                            );
                            let code = _mm512_or_si512(
                                _mm512_and_si512(lo, m4),
                                _mm512_slli_epi32::<4>(_mm512_and_si512(hb, m3)),
                            );
                            store(
                                r.add(head + i * sub + 64 * gg),
                                g.pad(_mm512_add_epi8(code, bias)),
                            );
                        }
                    }
                }
            }
        }
    }
}
