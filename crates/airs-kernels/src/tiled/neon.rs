//! aarch64 NEON + dot-product (`sdot`) tiled and decode kernels, bit-identical to the scalar
//! reference like the x86 ones.
//!
//! Tiled (several tokens): tiles of 8 rows (two `int32x4_t` of 4 rows each), codes stored
//! signed (`sdot` multiplies signed by signed, so no bias), 4 tokens per pass. Per block and
//! token, `sdot` by element broadcasts 4 activation codes against 4 codes of 4 rows: block/4 ×
//! 2 `sdot`, then the scalar reference's float steps on 8 lanes. The weight repack is the
//! portable scalar one (O(weights) per call, amortized over the tokens).
//!
//! Decode (one token): 4 rows per pass in their natural layout; 2 plain `sdot` per row and
//! 32-value block give 4 partial sums per row, and two levels of pairwise adds (`addp`) fold
//! 4 rows into one register of exact row dots, lane r = row r.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{
    ActSide, GROUP, Kind, PreparedActs, act_record_bytes, records, tile_bytes, tile_record_bytes,
};
use crate::GgmlType;

/// Rows per tile.
pub(super) const TILE: usize = 8;
/// Tokens per kernel pass.
const PASS: usize = 4;

/// `acc + Σ a·b` per group of 4 signed bytes (`sdot`; `vdotq_s32` is not yet stable Rust).
/// Public for the engine's attention kernels (`airs_kernels::sdot`).
///
/// # Safety
/// The CPU must support NEON and the dot-product extension (a caller compiled with both
/// features calls it safely).
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads two vector registers and updates a third; it touches no memory,
    // stack or flags, and this fn is only compiled/run with the dotprod feature.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `acc + Σ a·(group L of b)` per 4 bytes of `a`: `sdot` by element.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(crate) fn sdot_lane<const L: i32>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: as in `sdot`; `L` < 4 is an immediate lane index.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.4b[{lane}]",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            lane = const L,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    // SAFETY: the caller passes 16 readable bytes; `ld1` of bytes needs no alignment.
    unsafe { vld1q_s8(p.cast()) }
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_u8(p: *const u8) -> uint8x16_t {
    // SAFETY: the caller passes 16 readable bytes.
    unsafe { vld1q_u8(p) }
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_f32(p: *const u8) -> float32x4_t {
    // SAFETY: the caller passes 16 readable bytes; `ld1` of f32 lanes needs no alignment.
    unsafe { vld1q_f32(p.cast()) }
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_s32(p: *const u8) -> int32x4_t {
    // SAFETY: the caller passes 16 readable bytes.
    unsafe { vld1q_s32(p.cast()) }
}

#[inline]
unsafe fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: the caller passes 4 readable bytes.
    unsafe { p.cast::<f32>().read_unaligned() }
}

#[inline]
unsafe fn rd_i32(p: *const u8) -> i32 {
    // SAFETY: the caller passes 4 readable bytes.
    unsafe { p.cast::<i32>().read_unaligned() }
}

/// The whole tiled matmul for `prep`'s tokens. With `rows16`, `w_rows` holds whole groups of a
/// legacy type in the rows16 layout, and each tile is half a group
/// ([`crate::rows16::legacy_tile_half`]); else the file's rows, repacked by the scalar repack.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension; geometry as for the x86 `run`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon,dotprod")]
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
                if rows16 {
                    // Half `r0 / 8 % 2` of group `r0 / 16`, block by block.
                    let group_bytes = crate::rows16::GROUP_ROWS * row_bytes;
                    let block_bytes = crate::rows16::GROUP_ROWS * row_bytes / (n / 32);
                    let rec = tile_record_bytes(kind, TILE);
                    let group = &w_rows[r0 / 16 * group_bytes..][..group_bytes];
                    assert!(
                        r1 - r0 == TILE && tile.len() >= n / 32 * rec,
                        "whole rows16 groups"
                    );
                    for (blk, dst) in group
                        .chunks_exact(block_bytes)
                        .zip(tile.chunks_exact_mut(rec))
                    {
                        // SAFETY: NEON (this fn's); `blk` is one block-group of the legacy
                        // type `ty` and `dst` one tile record (288 or 320 bytes).
                        unsafe {
                            crate::rows16::legacy_tile_half(
                                ty,
                                blk.as_ptr(),
                                r0 / TILE % 2,
                                dst.as_mut_ptr(),
                            )
                        };
                    }
                    continue;
                }
                let w = &w_rows[r0 * row_bytes..r1 * row_bytes];
                super::repack_scalar(ty, kind, n, w, row_bytes, TILE, 0, tile);
            }
            for g in 0..groups {
                let acts = prep.group(g);
                for t0 in (0..GROUP).step_by(PASS) {
                    let first = g * GROUP + t0;
                    if first >= tokens {
                        break;
                    }
                    let count = (tokens - first).min(PASS);
                    for (i, tile) in buf[..tiles * tb].chunks_exact(tb).enumerate() {
                        let r0 = p0 + i * TILE;
                        let nrows = (p1 - r0).min(TILE);
                        let out = &mut out[first * out_stride + r0..];
                        tile_product(kind, n, t0, count, tile, acts, out, out_stride, nrows);
                    }
                }
            }
        }
    });
}

/// `out[t * stride + r]` for tokens `t0..t0 + count` of the group (t < count) and rows
/// r < `nrows` of the tile.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon,dotprod")]
fn tile_product(
    kind: Kind,
    n: usize,
    t0: usize,
    count: usize,
    tile: &[u8],
    acts: &[u8],
    out: &mut [f32],
    stride: usize,
    nrows: usize,
) {
    let nrec = records(kind, n);
    assert!(
        (1..=PASS).contains(&count)
            && t0 + count <= GROUP
            && (1..=TILE).contains(&nrows)
            && tile.len() >= nrec * tile_record_bytes(kind, TILE)
            && acts.len() >= nrec * act_record_bytes(kind)
            && (count - 1) * stride + nrows <= out.len(),
        "tile_product geometry"
    );
    let mut f = [[vdupq_n_f32(0.0); 2]; PASS];
    let (t, a) = (tile.as_ptr(), acts.as_ptr());
    macro_rules! by_count {
        ($f:ident $(, $c:expr)*) => {
            // SAFETY: the assert above bounds every record the kernel reads (nrec records of
            // the tile and of the activation group, tokens t0..t0 + count < GROUP); the CPU
            // features are those of this fn.
            unsafe {
                match count {
                    1 => $f::<1 $(, $c)*>(t, a, nrec, t0, &mut f),
                    2 => $f::<2 $(, $c)*>(t, a, nrec, t0, &mut f),
                    3 => $f::<3 $(, $c)*>(t, a, nrec, t0, &mut f),
                    _ => $f::<4 $(, $c)*>(t, a, nrec, t0, &mut f),
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
    for (t, f) in f.iter().take(count).enumerate() {
        let o = &mut out[t * stride..t * stride + nrows];
        let mut lanes = [0f32; TILE];
        // SAFETY: `lanes` is 8 writable f32.
        unsafe {
            vst1q_f32(lanes.as_mut_ptr(), f[0]);
            vst1q_f32(lanes[4..].as_mut_ptr(), f[1]);
        }
        o.copy_from_slice(&lanes[..nrows]);
    }
}

/// `acc[h] + Σ_g w[g][h] · (group g of the codes at qs)` for `G` groups of 4 codes.
///
/// # Safety
/// NEON + dotprod; `qs` has `4 G` readable bytes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_groups<const G: usize>(w: &[[int8x16_t; 2]; 8], qs: *const u8) -> [int32x4_t; 2] {
    // SAFETY: reads 16 (and for G = 8, 32) bytes at `qs` (caller).
    let (y0, y1) = unsafe {
        (
            ld_s8(qs),
            if G > 4 {
                ld_s8(qs.add(16))
            } else {
                vdupq_n_s8(0)
            },
        )
    };
    let mut acc = [vdupq_n_s32(0); 2];
    for (h, acc) in acc.iter_mut().enumerate() {
        *acc = sdot_lane::<0>(*acc, w[0][h], y0);
        *acc = sdot_lane::<1>(*acc, w[1][h], y0);
        *acc = sdot_lane::<2>(*acc, w[2][h], y0);
        *acc = sdot_lane::<3>(*acc, w[3][h], y0);
        if G > 4 {
            *acc = sdot_lane::<0>(*acc, w[4][h], y1);
            *acc = sdot_lane::<1>(*acc, w[5][h], y1);
            *acc = sdot_lane::<2>(*acc, w[6][h], y1);
            *acc = sdot_lane::<3>(*acc, w[7][h], y1);
        }
    }
    acc
}

/// Legacy kinds, tokens `t0..t0 + T` of the group.
///
/// # Safety
/// NEON + dotprod; `tile`/`acts` hold `nrec` records of their layouts, `t0 + T ≤ GROUP`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn legacy_kernel<const T: usize, const MIN: bool>(
    tile: *const u8,
    acts: *const u8,
    nrec: usize,
    t0: usize,
    f: &mut [[float32x4_t; 2]; PASS],
) {
    let wrec = tile_record_bytes(Kind::Legacy { min: MIN }, TILE);
    let arec = act_record_bytes(Kind::Legacy { min: MIN });
    for b in 0..nrec {
        // SAFETY: record b spans [b·wrec, (b+1)·wrec) of the tile and [b·arec, (b+1)·arec) of
        // the activations; the offsets below follow their layouts (caller's contract).
        unsafe {
            let wp = tile.add(b * wrec);
            let ap = acts.add(b * arec);
            let mut w = [[vdupq_n_s8(0); 2]; 8];
            for (g, w) in w.iter_mut().enumerate() {
                *w = [ld_s8(wp.add(32 * g)), ld_s8(wp.add(32 * g + 16))];
            }
            let d = [ld_f32(wp.add(256)), ld_f32(wp.add(272))];
            for (t, f) in f.iter_mut().take(T).enumerate() {
                let tt = t0 + t;
                let acc = dot_groups::<8>(&w, ap.add(32 * tt));
                let dy = rd_f32(ap.add(256 + 4 * tt));
                for h in 0..2 {
                    let mut p = vmulq_f32(vcvtq_f32_s32(acc[h]), vmulq_n_f32(d[h], dy));
                    if MIN {
                        let m = ld_f32(wp.add(288 + 16 * h));
                        p = vaddq_f32(p, vmulq_n_f32(m, rd_f32(ap.add(320 + 4 * tt))));
                    }
                    f[h] = vaddq_f32(f[h], p);
                }
            }
        }
    }
}

/// K kinds with sub-blocks of `4 G4` values, tokens `t0..t0 + T` of the group.
///
/// # Safety
/// As [`legacy_kernel`].
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn k_kernel<const T: usize, const G4: usize, const MIN: bool>(
    tile: *const u8,
    acts: *const u8,
    nrec: usize,
    t0: usize,
    f: &mut [[float32x4_t; 2]; PASS],
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
    for s in 0..nrec {
        // SAFETY: superblock record s of the tile and of the activations; all offsets follow
        // the layouts of `tile_record_bytes` / `act_record_bytes` (caller's contract).
        unsafe {
            let wp = tile.add(s * wrec);
            let ap = acts.add(s * arec);
            let mut isum = [[vdupq_n_s32(0); 2]; T];
            for j in 0..subs {
                let ws = wp.add(whead + j * wsub);
                let a = ap.add(ahead + j * asub);
                let mut w = [[vdupq_n_s8(0); 2]; 8];
                for (g, w) in w.iter_mut().take(G4).enumerate() {
                    *w = [ld_s8(ws.add(32 * g)), ld_s8(ws.add(32 * g + 16))];
                }
                let sc = [ld_s32(ws.add(8 * block)), ld_s32(ws.add(8 * block + 16))];
                for (t, isum) in isum.iter_mut().enumerate() {
                    let acc = dot_groups::<G4>(&w, a.add(block * (t0 + t)));
                    for h in 0..2 {
                        isum[h] = vmlaq_s32(isum[h], acc[h], sc[h]);
                    }
                }
            }
            for (t, f) in f.iter_mut().take(T).enumerate() {
                let tt = t0 + t;
                let dy = rd_f32(ap.add(4 * tt));
                for h in 0..2 {
                    let d = ld_f32(wp.add(16 * h));
                    let mut term = vmulq_f32(vmulq_n_f32(d, dy), vcvtq_f32_s32(isum[t][h]));
                    if MIN {
                        let mut summ = vdupq_n_s32(0);
                        for i in 0..subs / 2 {
                            let mp = ld_s32(wp.add(64 + 32 * i + 16 * h));
                            let sy = rd_i32(ap.add(GROUP * 4 + 2 * subs * tt + 4 * i));
                            let m_lo = vshrq_n_s32::<16>(vshlq_n_s32::<16>(mp));
                            let m_hi = vshrq_n_s32::<16>(mp);
                            summ = vmlaq_n_s32(summ, m_lo, (sy << 16) >> 16);
                            summ = vmlaq_n_s32(summ, m_hi, sy >> 16);
                        }
                        let dmin = ld_f32(wp.add(32 + 16 * h));
                        let m_term = vmulq_f32(vmulq_n_f32(dmin, dy), vcvtq_f32_s32(summ));
                        term = vsubq_f32(term, m_term);
                    }
                    f[h] = vaddq_f32(f[h], term);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decode: 4 rows per pass.

/// Whether `ty` has a decode kernel here.
pub(super) fn decode_supported(ty: GgmlType) -> bool {
    use GgmlType as G;
    matches!(
        ty,
        G::Q8_0 | G::Q4_0 | G::Q5_0 | G::Q4_1 | G::Q5_1 | G::Q4K | G::Q5K | G::Q6K
    )
}

/// Lane r = Σ of the 4 lanes of `a[r]`.
#[inline]
#[target_feature(enable = "neon")]
fn fold4(a: [int32x4_t; 4]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3]))
}

/// Bytes 0xFF where bit j of `qh` is set: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "neon")]
fn high_bit_masks(qh: u32) -> (uint8x16_t, uint8x16_t) {
    const LOW: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const HIGH: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let v = vreinterpretq_u8_u32(vdupq_n_u32(qh));
    // SAFETY: the three constants are 16 readable bytes each.
    let (lo, hi, bits) = unsafe {
        (
            ld_u8(LOW.as_ptr()),
            ld_u8(HIGH.as_ptr()),
            ld_u8(BITS.as_ptr()),
        )
    };
    (
        vtstq_u8(vqtbl1q_u8(v, lo), bits),
        vtstq_u8(vqtbl1q_u8(v, hi), bits),
    )
}

/// 4 f16 values as f32 lanes.
#[inline]
#[target_feature(enable = "neon")]
fn f16x4(bits: [u16; 4]) -> float32x4_t {
    // SAFETY: `bits` is 4 readable u16.
    let v = unsafe { vld1_u16(bits.as_ptr()) };
    vcvt_f32_f16(vreinterpret_f16_u16(v))
}

/// `out[r] = row r · act` for the rows of `w`; see the x86 decode `run` for the contract.
///
/// # Safety
/// NEON + dotprod; `decode_supported(ty)`; geometry checked by the caller (re-asserted).
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn decode(
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
            && act.len() == crate::act_type(ty).map_or(usize::MAX, |a| a.row_bytes(n)),
        "decode geometry"
    );
    let side = ActSide::new(ty, n, act);
    for r0 in (0..rows).step_by(4) {
        let nrows = (rows - r0).min(4);
        // Rows past the end repeat the last one (their results are not stored).
        let row: [&[u8]; 4] =
            std::array::from_fn(|r| &w[(r0 + r.min(nrows - 1)) * row_bytes..][..row_bytes]);
        // SAFETY: `row` holds 4 whole rows of this geometry (asserted), `act`/`side` the
        // activation row; the kernels read only inside the blocks they name.
        let f = unsafe {
            match ty {
                G::Q8_0 => legacy_decode::<0>(&row, n / 32, act, &side),
                G::Q4_0 => legacy_decode::<1>(&row, n / 32, act, &side),
                G::Q5_0 => legacy_decode::<2>(&row, n / 32, act, &side),
                G::Q4_1 => legacy_decode::<3>(&row, n / 32, act, &side),
                G::Q5_1 => legacy_decode::<4>(&row, n / 32, act, &side),
                G::Q4K => k4_decode::<false>(&row, n / 256, act, &side),
                G::Q5K => k4_decode::<true>(&row, n / 256, act, &side),
                G::Q6K => q6k_decode(&row, n / 256, act, &side),
                _ => unreachable!("decode kernel for {ty}"),
            }
        };
        let mut lanes = [0f32; 4];
        // SAFETY: `lanes` is 4 writable f32.
        unsafe { vst1q_f32(lanes.as_mut_ptr(), f) };
        out[r0..r0 + nrows].copy_from_slice(&lanes[..nrows]);
    }
}

/// Legacy types: `TY` 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = Q4_1, 4 = Q5_1.
///
/// # Safety
/// NEON + dotprod; the rows hold `nb` blocks of the type, `act` `nb` Q8_0 blocks.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn legacy_decode<const TY: u8>(
    row: &[&[u8]; 4],
    nb: usize,
    act: &[u8],
    side: &ActSide,
) -> float32x4_t {
    let bytes = [34, 18, 22, 20, 24][TY as usize];
    let blocks = act.as_chunks::<34>().0;
    assert!(blocks.len() >= nb && side.dy.len() >= nb && row.iter().all(|r| r.len() >= nb * bytes));
    let m4 = vdupq_n_u8(0x0F);
    let mut f = vdupq_n_f32(0.0);
    for (b, y) in blocks.iter().take(nb).enumerate() {
        // SAFETY: every load is inside block b of a row (asserted lengths) or of `y`.
        unsafe {
            let (y0, y1) = (ld_s8(y[2..].as_ptr()), ld_s8(y[18..].as_ptr()));
            let mut acc = [vdupq_n_s32(0); 4];
            let mut d = [0u16; 4];
            let mut m = [0u16; 4];
            for (r, acc) in acc.iter_mut().enumerate() {
                let blk = &row[r][bytes * b..bytes * (b + 1)];
                d[r] = u16::from_le_bytes([blk[0], blk[1]]);
                m[r] = u16::from_le_bytes([blk[2], blk[3]]);
                let (c0, c1) = match TY {
                    0 => (ld_s8(blk[2..].as_ptr()), ld_s8(blk[18..].as_ptr())),
                    1 | 3 => {
                        let q = ld_u8(blk[bytes - 16..].as_ptr());
                        let (lo, hi) = (vandq_u8(q, m4), vshrq_n_u8::<4>(q));
                        let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
                        if TY == 1 {
                            (vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8)))
                        } else {
                            (lo, hi)
                        }
                    }
                    _ => {
                        let q = ld_u8(blk[bytes - 16..].as_ptr());
                        let qh_off = if TY == 2 { 2 } else { 4 };
                        let qh = u32::from_le_bytes(blk[qh_off..qh_off + 4].try_into().unwrap());
                        let (bit_lo, bit_hi) = high_bit_masks(qh);
                        let (lo, hi) = (vandq_u8(q, m4), vshrq_n_u8::<4>(q));
                        if TY == 2 {
                            // q5 − 16 = nibble if the bit is set, else nibble | 0xF0.
                            let f0 = vdupq_n_u8(0xF0);
                            (
                                vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(f0, bit_lo))),
                                vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(f0, bit_hi))),
                            )
                        } else {
                            let b4 = vdupq_n_u8(0x10);
                            (
                                vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(bit_lo, b4))),
                                vreinterpretq_s8_u8(vorrq_u8(hi, vandq_u8(bit_hi, b4))),
                            )
                        }
                    }
                };
                *acc = sdot(sdot(vdupq_n_s32(0), c0, y0), c1, y1);
            }
            let idot = fold4(acc);
            let mut p = vmulq_f32(vcvtq_f32_s32(idot), vmulq_n_f32(f16x4(d), side.dy[b]));
            if TY >= 3 {
                p = vaddq_f32(p, vmulq_n_f32(f16x4(m), side.ms[b]));
            }
            f = vaddq_f32(f, p);
        }
    }
    f
}

/// Q4_K (`FIVE` = false) and Q5_K.
///
/// # Safety
/// As [`legacy_decode`], with `nsb` superblocks and Q8_K activations.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn k4_decode<const FIVE: bool>(
    row: &[&[u8]; 4],
    nsb: usize,
    act: &[u8],
    side: &ActSide,
) -> float32x4_t {
    let (bytes, qs_off) = if FIVE { (176, 48) } else { (144, 16) };
    let sbs = act.as_chunks::<292>().0;
    assert!(
        sbs.len() >= nsb
            && side.dy.len() >= nsb
            && side.sy_pairs.len() >= 4 * nsb
            && row.iter().all(|r| r.len() >= nsb * bytes)
    );
    let m4 = vdupq_n_u8(0x0F);
    let mut f = vdupq_n_f32(0.0);
    for (s, y) in sbs.iter().take(nsb).enumerate() {
        let sb: [&[u8]; 4] = std::array::from_fn(|r| &row[r][bytes * s..bytes * (s + 1)]);
        let mut sc = [[0i32; 4]; 8];
        let mut mins = [[0i32; 4]; 8];
        let mut d = [0u16; 4];
        let mut dmin = [0u16; 4];
        for r in 0..4 {
            d[r] = u16::from_le_bytes([sb[r][0], sb[r][1]]);
            dmin[r] = u16::from_le_bytes([sb[r][2], sb[r][3]]);
            for j in 0..8 {
                let (s6, m6) = super::scale_min_k4(j, &sb[r][4..16]);
                sc[j][r] = i32::from(s6);
                mins[j][r] = i32::from(m6);
            }
        }
        // SAFETY: every load is inside superblock s of a row (asserted lengths) or of `y`.
        unsafe {
            let mut isum = vdupq_n_s32(0);
            for pair in 0..4 {
                let ya = [
                    ld_s8(y[4 + 64 * pair..].as_ptr()),
                    ld_s8(y[20 + 64 * pair..].as_ptr()),
                ];
                let yb = [
                    ld_s8(y[36 + 64 * pair..].as_ptr()),
                    ld_s8(y[52 + 64 * pair..].as_ptr()),
                ];
                let mut acc_lo = [vdupq_n_s32(0); 4];
                let mut acc_hi = [vdupq_n_s32(0); 4];
                for r in 0..4 {
                    let q = [
                        ld_u8(sb[r][qs_off + 32 * pair..].as_ptr()),
                        ld_u8(sb[r][qs_off + 32 * pair + 16..].as_ptr()),
                    ];
                    let mut lo = [vandq_u8(q[0], m4), vandq_u8(q[1], m4)];
                    let mut hi = [vshrq_n_u8::<4>(q[0]), vshrq_n_u8::<4>(q[1])];
                    if FIVE {
                        let qh = [ld_u8(sb[r][16..].as_ptr()), ld_u8(sb[r][32..].as_ptr())];
                        let b4 = vdupq_n_u8(0x10);
                        let (bl, bh) = (vdupq_n_u8(1 << (2 * pair)), vdupq_n_u8(2 << (2 * pair)));
                        for h in 0..2 {
                            lo[h] = vorrq_u8(lo[h], vandq_u8(vtstq_u8(qh[h], bl), b4));
                            hi[h] = vorrq_u8(hi[h], vandq_u8(vtstq_u8(qh[h], bh), b4));
                        }
                    }
                    let s8 = vreinterpretq_s8_u8;
                    acc_lo[r] = sdot(sdot(vdupq_n_s32(0), s8(lo[0]), ya[0]), s8(lo[1]), ya[1]);
                    acc_hi[r] = sdot(sdot(vdupq_n_s32(0), s8(hi[0]), yb[0]), s8(hi[1]), yb[1]);
                }
                let sc_lo = vld1q_s32(sc[2 * pair].as_ptr());
                let sc_hi = vld1q_s32(sc[2 * pair + 1].as_ptr());
                isum = vmlaq_s32(isum, fold4(acc_lo), sc_lo);
                isum = vmlaq_s32(isum, fold4(acc_hi), sc_hi);
            }
            let mut summ = vdupq_n_s32(0);
            for i in 0..4 {
                let sy = side.sy_pairs[4 * s + i];
                summ = vmlaq_n_s32(summ, vld1q_s32(mins[2 * i].as_ptr()), (sy << 16) >> 16);
                summ = vmlaq_n_s32(summ, vld1q_s32(mins[2 * i + 1].as_ptr()), sy >> 16);
            }
            let dy = side.dy[s];
            let term = vmulq_f32(vmulq_n_f32(f16x4(d), dy), vcvtq_f32_s32(isum));
            let m_term = vmulq_f32(vmulq_n_f32(f16x4(dmin), dy), vcvtq_f32_s32(summ));
            f = vaddq_f32(f, vsubq_f32(term, m_term));
        }
    }
    f
}

/// Q6_K.
///
/// # Safety
/// As [`k4_decode`].
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q6k_decode(row: &[&[u8]; 4], nsb: usize, act: &[u8], side: &ActSide) -> float32x4_t {
    let sbs = act.as_chunks::<292>().0;
    assert!(sbs.len() >= nsb && side.dy.len() >= nsb && row.iter().all(|r| r.len() >= nsb * 210));
    let m4 = vdupq_n_u8(0x0F);
    let m3 = vdupq_n_u8(0x03);
    let mut f = vdupq_n_f32(0.0);
    for (s, y) in sbs.iter().take(nsb).enumerate() {
        let sb: [&[u8]; 4] = std::array::from_fn(|r| &row[r][210 * s..210 * (s + 1)]);
        let mut sc = [[0i32; 4]; 16];
        let mut d = [0u16; 4];
        for r in 0..4 {
            d[r] = u16::from_le_bytes([sb[r][208], sb[r][209]]);
            for (j, sc) in sc.iter_mut().enumerate() {
                sc[r] = i32::from(sb[r][192 + j] as i8);
            }
        }
        // SAFETY: every load is inside superblock s of a row (asserted lengths) or of `y`.
        unsafe {
            let mut isum = vdupq_n_s32(0);
            for h in 0..2 {
                for k in 0..4 {
                    let j = 8 * h + 2 * k;
                    let yo = 4 + 128 * h + 32 * k;
                    let (y0, y1) = (ld_s8(y[yo..].as_ptr()), ld_s8(y[yo + 16..].as_ptr()));
                    let mut a0 = [vdupq_n_s32(0); 4];
                    let mut a1 = [vdupq_n_s32(0); 4];
                    for r in 0..4 {
                        let lo_off = 64 * h + 32 * (k % 2);
                        let ql = [
                            ld_u8(sb[r][lo_off..].as_ptr()),
                            ld_u8(sb[r][lo_off + 16..].as_ptr()),
                        ];
                        let qh = [
                            ld_u8(sb[r][128 + 32 * h..].as_ptr()),
                            ld_u8(sb[r][144 + 32 * h..].as_ptr()),
                        ];
                        let code = |h: usize| {
                            let lo = if k < 2 {
                                vandq_u8(ql[h], m4)
                            } else {
                                vshrq_n_u8::<4>(ql[h])
                            };
                            let hb = vandq_u8(vshlq_u8(qh[h], vdupq_n_s8(-2 * k as i8)), m3);
                            let q = vorrq_u8(lo, vshlq_n_u8::<4>(hb));
                            vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(32))
                        };
                        a0[r] = sdot(vdupq_n_s32(0), code(0), y0);
                        a1[r] = sdot(vdupq_n_s32(0), code(1), y1);
                    }
                    isum = vmlaq_s32(isum, fold4(a0), vld1q_s32(sc[j].as_ptr()));
                    isum = vmlaq_s32(isum, fold4(a1), vld1q_s32(sc[j + 1].as_ptr()));
                }
            }
            let term = vmulq_f32(vmulq_n_f32(f16x4(d), side.dy[s]), vcvtq_f32_s32(isum));
            f = vaddq_f32(f, term);
        }
    }
    f
}
