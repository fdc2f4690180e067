//! aarch64 NEON + dot-product kernels for the rows16 layout, bit-identical to the scalar
//! reference like the AVX-512 ones.
//!
//! What: a chunk (4 codes × 16 rows) is four q-registers of 4 rows; `sdot` by element
//! (`sdot vD.4s, vN.16b, vM.4b[lane]`) multiplies each with 4 broadcast activation codes, so a
//! token's 16 row dots accumulate in four registers, no horizontal sums. `sdot` is signed ×
//! signed, so no 0x80 bias: Q8_0 codes as stored, Q4_0/Q5_0 unsigned with the activations'
//! `−off·Σy` term as start, Q4_K unsigned (mins from the sub-block sums), Q6_K decoded as
//! q − 32. Integer sums are exact in any order; each block's float step is the reference's.
//! Tokens: compiled per count 1..=16; per block, passes of [`PASS`] (legacy) or [`KPASS`]
//! (k-quants) tokens in registers, the block decoded once into a stack buffer when there are
//! several passes; one token keeps 8 `sdot` chains, and Q6_K reads in address order
//! ([`q6k_one`]).
//!
//! Where it comes from: the parent module's x86 kernels (layout, float steps) and
//! `tiled::neon` (`sdot` as inline asm: `vdotq_s32` is unstable). Helpers are
//! `#[inline(always)]` without target features, so they inline into the `neon,dotprod`
//! kernels (LLVM declined plain `#[inline]` for the passes). Cost per 64 weight bytes and
//! token: four `sdot`, plus the chunk's decode (Q8_0 none, Q4_0/Q4_K one op a register, Q5_0
//! three, Q6_K about three) shared by a pass or, with several passes, by the block; per block
//! and token a float step on 16 lanes. Unmeasured: no aarch64 hardware here.

use std::arch::aarch64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::{Activations, GROUP_ROWS, TokenRows, q4k, q5k, q6k};
use crate::GgmlType;
use crate::tiled::neon::sdot_lane;

/// Activation rows one call takes (the caller splits more).
pub(super) const MAX_TOKENS: usize = 16;
/// Tokens per pass of the legacy kernels: 4 × 4 integer accumulators.
const PASS: usize = 4;
/// Tokens per pass of the k-quant kernels: 2 × 4 sub-block accumulators and 2 × 4 sums.
const KPASS: usize = 2;

/// The 16 f16 at `p` as f32, four rows a register.
///
/// # Safety
/// NEON; `p` addresses 32 readable bytes.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> [float32x4_t; 4] {
    // SAFETY: NEON (caller); two 16-byte loads inside the caller's 32 bytes (`ld1` needs no
    // alignment).
    unsafe {
        let (lo, hi) = (vld1q_u16(p.cast()), vld1q_u16(p.add(16).cast()));
        [
            vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(lo))),
            vcvt_high_f32_f16(vreinterpretq_f16_u16(lo)),
            vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(hi))),
            vcvt_high_f32_f16(vreinterpretq_f16_u16(hi)),
        ]
    }
}

/// The four 16-byte registers at `p`.
///
/// # Safety
/// NEON; `p` addresses 64 readable bytes.
#[inline(always)]
unsafe fn ld4(p: *const u8) -> [uint8x16_t; 4] {
    // SAFETY: NEON (caller); four loads inside the caller's 64 bytes.
    unsafe {
        [
            vld1q_u8(p),
            vld1q_u8(p.add(16)),
            vld1q_u8(p.add(32)),
            vld1q_u8(p.add(48)),
        ]
    }
}

/// A rows16 type as the kernels decode it.
trait Layout {
    /// Bytes of one block (legacy) or superblock (k-quants) of a group.
    const GROUP_BLOCK: usize;
    /// Chunks (4 values × 16 rows) per block.
    const CHUNKS: usize;
    /// Whether chunks are read as stored (nothing to decode once for several passes).
    const RAW: bool = false;
    /// The codes of chunk `c` (values `4c..4c+4` of the block, in block order) of the block
    /// at `blk`, as i8: register `q` holds rows `4q..4q+4`, 4 codes each.
    ///
    /// # Safety
    /// NEON; `blk` addresses one whole block of a group of this layout; `c < CHUNKS`.
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4];
    /// The chunk decoded `i`-th into a buffer: an order that reads the block's bytes forward.
    #[inline(always)]
    fn decode_order(i: usize) -> usize {
        i
    }
}

/// Where a pass reads the decoded chunks of a block.
trait Chunks {
    /// # Safety
    /// NEON; `c` is a chunk of the block the source was made for.
    unsafe fn get(&self, c: usize) -> [int8x16_t; 4];
}

/// Decoded from the group stream on the spot.
struct Direct<L>(*const u8, PhantomData<L>);

impl<L: Layout> Chunks for Direct<L> {
    #[inline(always)]
    unsafe fn get(&self, c: usize) -> [int8x16_t; 4] {
        // SAFETY: `self.0` is a whole block of `L` (the maker's), `c` one of its chunks.
        unsafe { L::chunk(self.0, c) }
    }
}

/// Loaded from a buffer the block was decoded into once (4 registers a chunk).
struct Decoded(*const int8x16_t);

impl Chunks for Decoded {
    #[inline(always)]
    unsafe fn get(&self, c: usize) -> [int8x16_t; 4] {
        // SAFETY: the buffer holds every chunk of the block (the maker's).
        unsafe {
            let p = self.0.add(4 * c);
            [*p, *p.add(1), *p.add(2), *p.add(3)]
        }
    }
}

/// Decode every chunk of the block at `blk` into `buf` (`4 · L::CHUNKS` registers).
///
/// # Safety
/// As [`Layout::chunk`]; `buf` has room for `4 · L::CHUNKS` registers.
#[inline(always)]
unsafe fn decode_block<L: Layout>(blk: *const u8, buf: *mut int8x16_t) {
    for i in 0..L::CHUNKS {
        let c = L::decode_order(i);
        // SAFETY: `c` is a chunk of the block; chunk c's 4 registers are inside `buf`.
        unsafe {
            let w = L::chunk(blk, c);
            for (q, w) in w.into_iter().enumerate() {
                buf.add(4 * c + q).write(w);
            }
        }
    }
}

/// Q8_0: 32 f16 scale bytes, then 8 chunks of signed codes.
struct Q8_0;
/// Q4_0: scales, then 4 chunks of nibbles (low: chunks 0..4, high: 4..8); codes 0..=15.
struct Q4_0;
/// Q5_0: scales, the fifth-bit plane, then the nibbles as Q4_0; codes 0..=31.
struct Q5_0;
/// Q4_1: scales, mins, then the nibbles as Q4_0; codes 0..=15.
struct Q4_1;
/// Q5_1: scales, mins, then Q5_0's plane and nibbles; codes 0..=31.
struct Q5_1;

impl Layout for Q8_0 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 34;
    const CHUNKS: usize = 8;
    const RAW: bool = true;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // SAFETY: NEON (caller); chunk c is bytes 32 + 64c .. +64 of the 544-byte block.
        unsafe { ld4(blk.add(32 + 64 * c)).map(|v| vreinterpretq_s8_u8(v)) }
    }
}

/// Low (`c < 4`) or high nibbles of nibble chunk `c % 4` at `qs`.
///
/// # Safety
/// NEON; `qs` addresses 4 chunks of 64 bytes.
#[inline(always)]
unsafe fn nibbles(qs: *const u8, c: usize) -> [uint8x16_t; 4] {
    // SAFETY: NEON (caller); chunk c % 4 is inside the caller's 256 bytes.
    unsafe {
        let mut v = ld4(qs.add(64 * (c % 4)));
        for v in &mut v {
            *v = if c < 4 {
                vandq_u8(*v, vdupq_n_u8(0x0F))
            } else {
                vshrq_n_u8::<4>(*v)
            };
        }
        v
    }
}

impl Layout for Q4_0 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 18;
    const CHUNKS: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // SAFETY: NEON (caller); the nibbles are bytes 32..288 of the block.
        unsafe { nibbles(blk.add(32), c).map(|v| vreinterpretq_s8_u8(v)) }
    }
}

impl Layout for Q5_0 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 22;
    const CHUNKS: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // SAFETY: NEON (caller); the plane is bytes 32..96 of the block, the nibbles 96..352.
        unsafe { five_bit_chunk(blk.add(32), blk.add(96), c) }
    }
}

impl Layout for Q4_1 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 20;
    const CHUNKS: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // SAFETY: NEON (caller); the nibbles are bytes 64..320 of the block.
        unsafe { nibbles(blk.add(64), c).map(|v| vreinterpretq_s8_u8(v)) }
    }
}

impl Layout for Q5_1 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 24;
    const CHUNKS: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // SAFETY: NEON (caller); the plane is bytes 64..128 of the block, the nibbles
        // 128..384.
        unsafe { five_bit_chunk(blk.add(64), blk.add(128), c) }
    }
}

/// Chunk `c` of a Q5_0/Q5_1 block: the nibbles at `qs` with the fifth bits of the plane at
/// `plane`: bit `c` of each byte, moved to bit 4 (`ushl` by `4 − c`) and inserted (`bsl`).
///
/// # Safety
/// NEON; `plane` addresses 64 readable bytes, `qs` 256; `c < 8`.
#[inline(always)]
unsafe fn five_bit_chunk(plane: *const u8, qs: *const u8, c: usize) -> [int8x16_t; 4] {
    // SAFETY: NEON (caller); the plane's 64 bytes and the nibbles inside `qs`'s 256 bytes.
    unsafe {
        let h = ld4(plane);
        let shift = vdupq_n_s8(4 - c as i8);
        let nib = nibbles(qs, c);
        let mut out = [vdupq_n_s8(0); 4];
        for ((o, h), nib) in out.iter_mut().zip(h).zip(nib) {
            let bits = vshlq_u8(h, shift);
            *o = vreinterpretq_s8_u8(vbslq_u8(vdupq_n_u8(0x10), bits, nib));
        }
        out
    }
}

/// Rows `8·half..8·half + 8` of the legacy block at `blk` (a block-group of `ty`) as the tiled
/// NEON kernels' tile record of 8 rows, byte for byte what `tiled::repack_scalar` writes from
/// the file's rows: the 8 code registers (codes `4k..4k + 4` of the 8 rows, as signed codes:
/// Q4_0 `q − 8`, Q5_0 `q − 16`, Q4_1/Q5_1 `q`, Q8_0 as stored) at `32k`, the scales as f32
/// at 256 and, for Q4_1/Q5_1, the mins at 288. The layout's chunks are the record's registers
/// for 16 rows, so this is one chunk decode and a bias per register.
///
/// # Safety
/// NEON; `blk` addresses one whole block-group of `ty`, a legacy rows16 type; `half < 2`;
/// `dst` 288 writable bytes (320 with mins).
pub(crate) unsafe fn legacy_tile_half(ty: GgmlType, blk: *const u8, half: usize, dst: *mut u8) {
    // SAFETY: the contract is this function's.
    unsafe {
        match ty {
            GgmlType::Q8_0 => tile_half::<Q8_0>(blk, half, 0, dst),
            GgmlType::Q4_0 => tile_half::<Q4_0>(blk, half, 8, dst),
            GgmlType::Q5_0 => tile_half::<Q5_0>(blk, half, 16, dst),
            GgmlType::Q4_1 => tile_half::<Q4_1>(blk, half, 0, dst),
            GgmlType::Q5_1 => tile_half::<Q5_1>(blk, half, 0, dst),
            _ => unreachable!("{ty} is not a legacy rows16 type"),
        }
    }
}

/// [`legacy_tile_half`] for layout `L`, whose codes are offset by `bias`.
///
/// # Safety
/// As [`legacy_tile_half`].
#[inline(always)]
unsafe fn tile_half<L: Legacy>(blk: *const u8, half: usize, bias: i8, dst: *mut u8) {
    // SAFETY: NEON (caller); the chunks and scales lie in the block-group (`Layout::chunk`,
    // `f16x16` of its first 32 bytes, the mins' next 32); the stores stay in `dst`'s 288
    // (320) bytes.
    unsafe {
        let bias = vdupq_n_s8(bias);
        for k in 0..8 {
            let regs = L::chunk(blk, k);
            vst1q_s8(dst.add(32 * k).cast(), vsubq_s8(regs[2 * half], bias));
            vst1q_s8(
                dst.add(32 * k + 16).cast(),
                vsubq_s8(regs[2 * half + 1], bias),
            );
        }
        let d = f16x16(blk);
        vst1q_f32(dst.add(256).cast(), d[2 * half]);
        vst1q_f32(dst.add(272).cast(), d[2 * half + 1]);
        if L::MIN {
            let m = f16x16(blk.add(32));
            vst1q_f32(dst.add(288).cast(), m[2 * half]);
            vst1q_f32(dst.add(304).cast(), m[2 * half + 1]);
        }
    }
}

/// A legacy type: Q8_0's codes are signed, Q4_0's and Q5_0's offset by the activations'
/// block term; Q4_1's and Q5_1's unsigned, with a min.
trait Legacy: Layout {
    const OFFSET: bool;
    /// Whether blocks have a min `m` (the 16 rows' f16 after their scales): the reference's
    /// `+ m·(dy·Σy)`.
    const MIN: bool = false;
}
impl Legacy for Q8_0 {
    const OFFSET: bool = false;
}
impl Legacy for Q4_0 {
    const OFFSET: bool = true;
}
impl Legacy for Q5_0 {
    const OFFSET: bool = true;
}
impl Legacy for Q4_1 {
    const OFFSET: bool = false;
    const MIN: bool = true;
}
impl Legacy for Q5_1 {
    const OFFSET: bool = false;
    const MIN: bool = true;
}

/// Q4_K superblocks: sub-blocks of 32 values (8 chunks); codes 0..=15.
struct Q4K;
/// Q5_K superblocks: Q4_K's with the fifth bits; codes 0..=31.
struct Q5K;
/// Q6_K superblocks: sub-blocks of 16 values (4 chunks); codes decoded as q − 32.
struct Q6K;

impl Layout for Q4K {
    const GROUP_BLOCK: usize = q4k::GROUP_BLOCK;
    const CHUNKS: usize = 64;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // Chunk c: sub-block s = c / 8 (nibbles of pair s / 2, low for even s), chunk c % 8.
        let s = c / 8;
        // SAFETY: NEON (caller); the codes are bytes 256..2304 of the superblock.
        unsafe {
            let v = ld4(blk.add(256 + 512 * (s / 2) + 64 * (c % 8)));
            let mut out = [vdupq_n_s8(0); 4];
            for (o, v) in out.iter_mut().zip(v) {
                *o = vreinterpretq_s8_u8(if s.is_multiple_of(2) {
                    vandq_u8(v, vdupq_n_u8(0x0F))
                } else {
                    vshrq_n_u8::<4>(v)
                });
            }
            out
        }
    }
}

impl Layout for Q5K {
    const GROUP_BLOCK: usize = q5k::GROUP_BLOCK;
    const CHUNKS: usize = 64;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // Chunk c: sub-block s = c / 8 as Q4_K's, whose fifth bits are bit s of the bytes of
        // `qh` register c % 8.
        let s = c / 8;
        // SAFETY: NEON (caller); `qh` is bytes 256..768 of the superblock, the codes
        // 768..2816.
        unsafe {
            let v = ld4(blk.add(q5k::CODES + 512 * (s / 2) + 64 * (c % 8)));
            let h = ld4(blk.add(q5k::QH + 64 * (c % 8)));
            let bit = vdupq_n_u8(1 << s);
            let mut out = [vdupq_n_s8(0); 4];
            for ((o, v), h) in out.iter_mut().zip(v).zip(h) {
                let nib = if s.is_multiple_of(2) {
                    vandq_u8(v, vdupq_n_u8(0x0F))
                } else {
                    vshrq_n_u8::<4>(v)
                };
                let fifth = vandq_u8(vtstq_u8(h, bit), vdupq_n_u8(0x10));
                *o = vreinterpretq_s8_u8(vorrq_u8(nib, fifth));
            }
            out
        }
    }
}

impl Layout for Q6K {
    const GROUP_BLOCK: usize = q6k::GROUP_BLOCK;
    const CHUNKS: usize = 64;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> [int8x16_t; 4] {
        // Values 4c.. = 128h + 32f + 4k..: low nibbles of ql chunk k (f = 0) or 8 + k (f = 1),
        // high nibbles of those (f = 2, 3); top bits: pair f of qh chunk k.
        let (h, f, k) = (c / 32, c / 8 % 4, c % 8);
        // SAFETY: NEON (caller); the layout's ql and qh chunks are inside the superblock.
        unsafe {
            let ql = ld4(blk.add(q6k::ql(h, 8 * (f % 2) + k)));
            let qh = ld4(blk.add(q6k::qh(h, k)));
            let mut out = [vdupq_n_s8(0); 4];
            for ((o, l), t) in out.iter_mut().zip(ql).zip(qh) {
                *o = q6k_code(l, t, f);
            }
            out
        }
    }

    #[inline(always)]
    fn decode_order(i: usize) -> usize {
        // Per half, the code records k in address order, each giving its four quarters.
        let (h, k, f) = (i / 32, i / 4 % 8, i % 4);
        32 * h + 8 * f + k
    }
}

/// The signed Q6_K codes (q − 32) of quarter `f` from its `ql` register `l` (low nibbles for
/// `f` < 2, high ones else) and `qh` register `t` (bit pair `f`).
///
/// # Safety
/// NEON.
#[inline(always)]
unsafe fn q6k_code(l: uint8x16_t, t: uint8x16_t, f: usize) -> int8x16_t {
    // SAFETY: NEON (caller).
    unsafe {
        let three = vdupq_n_u8(3);
        let code = match f {
            0 => vsliq_n_u8::<4>(l, vandq_u8(t, three)),
            1 => vsliq_n_u8::<4>(l, vandq_u8(vshrq_n_u8::<2>(t), three)),
            2 => vsriq_n_u8::<4>(vandq_u8(t, vdupq_n_u8(0x30)), l),
            _ => vsriq_n_u8::<4>(vshrq_n_u8::<2>(t), l),
        };
        vsubq_s8(vreinterpretq_s8_u8(code), vdupq_n_s8(32))
    }
}

/// Q6_K with one token, in the order its bytes lie (the hardware prefetchers stream that at
/// full rate, as the x86 one-token kernel found): per half and 4 of its 8 code records, each
/// record's three chunks give the codes of all four 32-value quarters, summed into 16
/// accumulators (quarter × 4 rows), then scaled per sub-block into `isum`; the float step is
/// [`kquant_pass`]'s.
///
/// # Safety
/// NEON and dotprod; `blk` one whole Q6_K superblock of a group, `terms` its terms; `y` the
/// Q8_K block's 256 codes.
#[inline(always)]
unsafe fn q6k_one(blk: *const u8, terms: &Terms, y: *const u8, dy: f32, f: &mut [float32x4_t; 4]) {
    // SAFETY: NEON and dotprod (caller); the layout's chunks are inside the superblock and
    // values 128h + 32fq + 16kh .. +16 inside the activation codes.
    unsafe {
        let mut isum = [vdupq_n_s32(0); 4];
        for h in 0..2 {
            for kh in 0..2 {
                // acc[fq][q]: sub-block 8h + 2fq + kh, rows 4q..4q+4.
                let mut acc = [[vdupq_n_s32(0); 4]; 4];
                let mut ys = [vdupq_n_s8(0); 4];
                for (fq, v) in ys.iter_mut().enumerate() {
                    *v = vld1q_s8(y.add(128 * h + 32 * fq + 16 * kh).cast());
                }
                macro_rules! record {
                    ($l:literal) => {{
                        let k = 4 * kh + $l;
                        let (l0, l1, t) = (q6k::ql(h, k), q6k::ql(h, 8 + k), q6k::qh(h, k));
                        for q in 0..4 {
                            let l0 = vld1q_u8(blk.add(l0 + 16 * q));
                            let l1 = vld1q_u8(blk.add(l1 + 16 * q));
                            let t = vld1q_u8(blk.add(t + 16 * q));
                            for (fq, (acc, y)) in acc.iter_mut().zip(&ys).enumerate() {
                                let l = if fq % 2 == 0 { l0 } else { l1 };
                                acc[q] = sdot_lane::<$l>(acc[q], q6k_code(l, t, fq), *y);
                            }
                        }
                    }};
                }
                record!(0);
                record!(1);
                record!(2);
                record!(3);
                for (fq, acc) in acc.iter().enumerate() {
                    let sc = &terms.sc[8 * h + 2 * fq + kh];
                    for ((is, acc), sc) in isum.iter_mut().zip(acc).zip(sc) {
                        *is = vmlaq_s32(*is, *acc, *sc);
                    }
                }
            }
        }
        for ((f, is), d) in f.iter_mut().zip(isum).zip(&terms.d) {
            let term = vmulq_f32(vmulq_n_f32(*d, dy), vcvtq_f32_s32(is));
            *f = vaddq_f32(*f, term);
        }
    }
}

/// A k-quant superblock's per-row terms, rows in lanes: the f32 `d` (and `dmin`), the integer
/// sub-block scales (and mins).
struct Terms {
    d: [float32x4_t; 4],
    dmin: [float32x4_t; 4],
    sc: [[int32x4_t; 4]; 16],
    m: [[int32x4_t; 4]; 8],
}

/// A k-quant type.
trait Kquant: Layout {
    /// Sub-blocks per superblock (one integer scale each).
    const SUBS: usize;
    /// Whether it has mins (Q4_K).
    const MINS: bool;
    /// Whether one token takes [`q6k_one`] (Q6_K).
    const ONE_IN_ORDER: bool = false;
    /// # Safety
    /// NEON; `blk` addresses one whole superblock of a group.
    unsafe fn terms(blk: *const u8) -> Terms;
}

/// Byte `i` of each u32 lane, as i32 (unsigned).
///
/// # Safety
/// NEON.
#[inline(always)]
unsafe fn byte_u(x: uint32x4_t, i: usize) -> int32x4_t {
    // SAFETY: NEON (caller).
    unsafe {
        let ff = vdupq_n_u32(0xFF);
        vreinterpretq_s32_u32(match i {
            0 => vandq_u32(x, ff),
            1 => vandq_u32(vshrq_n_u32::<8>(x), ff),
            2 => vandq_u32(vshrq_n_u32::<16>(x), ff),
            _ => vshrq_n_u32::<24>(x),
        })
    }
}

/// Byte `i` of each 32-bit lane, sign-extended.
///
/// # Safety
/// NEON.
#[inline(always)]
unsafe fn byte_s(x: int32x4_t, i: usize) -> int32x4_t {
    // SAFETY: NEON (caller).
    unsafe {
        vshrq_n_s32::<24>(match i {
            0 => vshlq_n_s32::<24>(x),
            1 => vshlq_n_s32::<16>(x),
            2 => vshlq_n_s32::<8>(x),
            _ => x,
        })
    }
}

impl Kquant for Q4K {
    const SUBS: usize = 8;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn terms(blk: *const u8) -> Terms {
        // SAFETY: NEON (caller); d at 0..32, dmin at 32..64 and the three scale planes at
        // 64..256 of the superblock.
        unsafe {
            let z = vdupq_n_s32(0);
            let mut t = Terms {
                d: f16x16(blk),
                dmin: f16x16(blk.add(32)),
                sc: [[z; 4]; 16],
                m: [[z; 4]; 8],
            };
            let (six, nib, top) = (
                vdupq_n_u32(0x3F3F_3F3F),
                vdupq_n_u32(0x0F0F_0F0F),
                vdupq_n_u32(0x3030_3030),
            );
            for q in 0..4 {
                // ggml's `scales[0..4]`, `[4..8]`, `[8..12]` of rows 4q..4q+4, a row a lane,
                // unpacked as its `get_scale_min_k4`, four sub-blocks a lane.
                let p0 = vreinterpretq_u32_u8(vld1q_u8(blk.add(64 + 16 * q)));
                let p1 = vreinterpretq_u32_u8(vld1q_u8(blk.add(128 + 16 * q)));
                let p2 = vreinterpretq_u32_u8(vld1q_u8(blk.add(192 + 16 * q)));
                let sc_lo = vandq_u32(p0, six);
                let sc_hi = vorrq_u32(vandq_u32(p2, nib), vandq_u32(vshrq_n_u32::<2>(p0), top));
                let m_lo = vandq_u32(p1, six);
                let m_hi = vorrq_u32(
                    vandq_u32(vshrq_n_u32::<4>(p2), nib),
                    vandq_u32(vshrq_n_u32::<2>(p1), top),
                );
                for i in 0..4 {
                    t.sc[i][q] = byte_u(sc_lo, i);
                    t.sc[4 + i][q] = byte_u(sc_hi, i);
                    t.m[i][q] = byte_u(m_lo, i);
                    t.m[4 + i][q] = byte_u(m_hi, i);
                }
            }
            t
        }
    }
}

impl Kquant for Q5K {
    const SUBS: usize = 8;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn terms(blk: *const u8) -> Terms {
        // SAFETY: NEON (caller); `d`, `dmin` and the scale planes lie where Q4_K's do.
        unsafe { <Q4K as Kquant>::terms(blk) }
    }
}

impl Kquant for Q6K {
    const SUBS: usize = 16;
    const MINS: bool = false;
    const ONE_IN_ORDER: bool = true;
    #[inline(always)]
    unsafe fn terms(blk: *const u8) -> Terms {
        // SAFETY: NEON (caller); d at 0..32 and the four scale planes at 32..288 of the
        // superblock.
        unsafe {
            let z = vdupq_n_s32(0);
            let mut t = Terms {
                d: f16x16(blk),
                dmin: [vdupq_n_f32(0.0); 4],
                sc: [[z; 4]; 16],
                m: [[z; 4]; 8],
            };
            for p in 0..4 {
                for q in 0..4 {
                    // Plane p, rows 4q..4q+4: the int8 scales 4p..4p+4 of a row in its lane.
                    let x = vld1q_s32(blk.add(q6k::SCALES + 64 * p + 16 * q).cast());
                    for i in 0..4 {
                        t.sc[4 * p + i][q] = byte_s(x, i);
                    }
                }
            }
            t
        }
    }
}

/// Integer dots of chunks `chunks` (a multiple of 4 of them) with `P` activation rows:
/// `acc[t][q]` = `init[t]` + Σ over the chunks of rows `4q..4q+4` · the row's activation
/// codes of the chunk (`ys[t]`: the activation codes of the block).
///
/// # Safety
/// NEON and dotprod; `src` holds the chunks; each `ys[t]` has `4 · chunks.end` readable
/// bytes.
#[inline(always)]
unsafe fn dots<S: Chunks, const P: usize>(
    src: &S,
    chunks: Range<usize>,
    ys: &[*const u8; P],
    init: [int32x4_t; P],
) -> [[int32x4_t; 4]; P] {
    // SAFETY: NEON and dotprod (caller); chunks c..c+4 are bytes 4c..4c+16 of each token's
    // activation codes and chunks of the source (caller).
    unsafe {
        // One token: two accumulator sets (even and odd chunks), 8 `sdot` chains in flight.
        let mut acc = [[[vdupq_n_s32(0); 4]; P]; 2];
        for (a, i) in acc[0].iter_mut().zip(init) {
            *a = [i; 4];
        }
        let mut c = chunks.start;
        while c < chunks.end {
            let mut y = [vdupq_n_s8(0); P];
            for (y, p) in y.iter_mut().zip(ys) {
                *y = vld1q_s8(p.add(4 * c).cast());
            }
            macro_rules! lane {
                ($l:literal) => {{
                    let w = src.get(c + $l);
                    let set = if P == 1 { $l % 2 } else { 0 };
                    for (acc, y) in acc[set].iter_mut().zip(&y) {
                        for (a, w) in acc.iter_mut().zip(w) {
                            *a = sdot_lane::<$l>(*a, w, *y);
                        }
                    }
                }};
            }
            lane!(0);
            lane!(1);
            lane!(2);
            lane!(3);
            c += 4;
        }
        if P == 1 {
            let [even, odd] = &mut acc;
            for (e, o) in even[0].iter_mut().zip(odd[0]) {
                *e = vaddq_s32(*e, o);
            }
        }
        acc[0]
    }
}

/// One legacy block with `P` tokens: `f[t] += Σ_chunks … · (d · dy)` as the scalar reference
/// (`sum += sumi · (d·dy)`; with a min `sum += (d·dy)·sumi + m·(dy·Σy)`), on 16 row lanes.
///
/// # Safety
/// NEON and dotprod; `src` holds the block's 8 chunks; `ys[t]` the activation block's 32
/// codes; `f` at least `P` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn legacy_pass<L: Legacy, S: Chunks, const P: usize>(
    src: &S,
    d: &[float32x4_t; 4],
    m: &[float32x4_t; 4],
    ys: [*const u8; P],
    dy: [f32; P],
    off: [i32; P],
    min_sum: [f32; P],
    f: &mut [[float32x4_t; 4]],
) {
    // SAFETY: NEON and dotprod; the block's 8 chunks and 32 activation codes per token
    // (caller).
    unsafe {
        let mut init = [vdupq_n_s32(0); P];
        if L::OFFSET {
            for (i, o) in init.iter_mut().zip(off) {
                *i = vdupq_n_s32(o);
            }
        }
        let acc = dots::<S, P>(src, 0..8, &ys, init);
        for (((f, acc), dy), ms) in f.iter_mut().zip(acc).zip(dy).zip(min_sum) {
            for (((f, acc), d), m) in f.iter_mut().zip(acc).zip(d).zip(m) {
                let mut p = vmulq_f32(vcvtq_f32_s32(acc), vmulq_n_f32(*d, dy));
                if L::MIN {
                    p = vaddq_f32(p, vmulq_n_f32(*m, ms));
                }
                *f = vaddq_f32(*f, p);
            }
        }
    }
}

/// The 16 row dots of the legacy group at `group` (`nb` blocks) with each of `T` tokens.
///
/// # Safety
/// NEON and dotprod; `group` one whole group of `L` with `nb` blocks; `rows` `T` activation
/// rows of `nb` blocks with their terms; `buf` 32 writable registers.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn legacy_group<L: Legacy, const T: usize>(
    group: *const u8,
    nb: usize,
    rows: &TokenRows<'_, T>,
    buf: *mut int8x16_t,
) -> [[float32x4_t; 4]; T] {
    let mut f = [[vdupq_n_f32(0.0); 4]; T];
    for b in 0..nb {
        // SAFETY: block b of the group and of every activation row are inside them, the
        // buffer holds a block's 32 registers (caller); CPU features are this fn's.
        unsafe {
            let blk = group.add(L::GROUP_BLOCK * b);
            let d = f16x16(blk);
            let m = if L::MIN {
                f16x16(blk.add(32))
            } else {
                [vdupq_n_f32(0.0); 4]
            };
            macro_rules! passes {
                ($src:expr) => {{
                    let src = $src;
                    macro_rules! pass {
                        ($p:expr, $t0:expr) => {{
                            let t0 = $t0;
                            let mut ys = [std::ptr::null(); $p];
                            let (mut dy, mut off, mut ms) = ([0f32; $p], [0i32; $p], [0f32; $p]);
                            for t in 0..$p {
                                ys[t] = rows.ys[t0 + t].add(34 * b + 2);
                                dy[t] = rows.dys[t0 + t][b];
                                if L::OFFSET {
                                    off[t] = rows.offs[t0 + t][b];
                                }
                                if L::MIN {
                                    ms[t] = rows.mins[t0 + t][b];
                                }
                            }
                            legacy_pass::<L, _, $p>(&src, &d, &m, ys, dy, off, ms, &mut f[t0..])
                        }};
                    }
                    for i in 0..T / PASS {
                        pass!(PASS, PASS * i);
                    }
                    let t0 = T / PASS * PASS;
                    match T % PASS {
                        0 => {}
                        1 => pass!(1, t0),
                        2 => pass!(2, t0),
                        _ => pass!(3, t0),
                    }
                }};
            }
            if T <= PASS || L::RAW {
                passes!(Direct::<L>(blk, PhantomData));
            } else {
                decode_block::<L>(blk, buf);
                passes!(Decoded(buf));
            }
        }
    }
    f
}

/// One k-quant superblock with `P` tokens: the reference's exact `isum = Σ sc·Σ q·y` (and
/// Q4_K's `summ = Σ m·Σ y`), then its float step `sum + ((d·dy)·isum − (dmin·dy)·summ)`
/// (Q6_K: `sum + (d·dy)·isum`).
///
/// # Safety
/// NEON and dotprod; `src` holds the superblock's 64 chunks; `ys[t]` the Q8_K block's 256
/// codes; `f` at least `P` rows.
#[inline(always)]
unsafe fn kquant_pass<K: Kquant, S: Chunks, const P: usize>(
    src: &S,
    terms: &Terms,
    ys: [*const u8; P],
    dy: [f32; P],
    bsums: [&[i32; 16]; P],
    f: &mut [[float32x4_t; 4]],
) {
    // SAFETY: NEON and dotprod; each sub-block's chunks and activation codes (caller).
    unsafe {
        let per = K::CHUNKS / K::SUBS;
        let mut isum = [[vdupq_n_s32(0); 4]; P];
        for (s, sc) in terms.sc.iter().enumerate().take(K::SUBS) {
            let acc = dots::<S, P>(src, s * per..(s + 1) * per, &ys, [vdupq_n_s32(0); P]);
            for (is, acc) in isum.iter_mut().zip(acc) {
                for ((is, acc), sc) in is.iter_mut().zip(acc).zip(sc) {
                    *is = vmlaq_s32(*is, acc, *sc);
                }
            }
        }
        for (((f, is), dy), bs) in f.iter_mut().zip(isum).zip(dy).zip(bsums) {
            let mut summ = [vdupq_n_s32(0); 4];
            if K::MINS {
                // Σ_s m_s · (bsum_2s + bsum_2s+1), exact.
                let pairs = [
                    vpaddq_s32(vld1q_s32(bs.as_ptr()), vld1q_s32(bs[4..].as_ptr())),
                    vpaddq_s32(vld1q_s32(bs[8..].as_ptr()), vld1q_s32(bs[12..].as_ptr())),
                ];
                for (s, m) in terms.m.iter().enumerate() {
                    let pr = pairs[s / 4];
                    for (sm, m) in summ.iter_mut().zip(m) {
                        *sm = match s % 4 {
                            0 => vmlaq_laneq_s32::<0>(*sm, *m, pr),
                            1 => vmlaq_laneq_s32::<1>(*sm, *m, pr),
                            2 => vmlaq_laneq_s32::<2>(*sm, *m, pr),
                            _ => vmlaq_laneq_s32::<3>(*sm, *m, pr),
                        };
                    }
                }
            }
            for q in 0..4 {
                let term = vmulq_f32(vmulq_n_f32(terms.d[q], dy), vcvtq_f32_s32(is[q]));
                let v = if K::MINS {
                    let m_term = vmulq_f32(vmulq_n_f32(terms.dmin[q], dy), vcvtq_f32_s32(summ[q]));
                    vsubq_f32(term, m_term)
                } else {
                    term
                };
                f[q] = vaddq_f32(f[q], v);
            }
        }
    }
}

/// The 16 row dots of the k-quant group at `group` (`nb` superblocks) with each of `T` tokens.
///
/// # Safety
/// NEON and dotprod; `group` one whole group of `K` with `nb` superblocks; `rows` `T` Q8_K
/// rows of `nb` superblocks with their sub-block sums; `buf` 256 writable registers.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn kquant_group<K: Kquant, const T: usize>(
    group: *const u8,
    nb: usize,
    rows: &TokenRows<'_, T>,
    buf: *mut int8x16_t,
) -> [[float32x4_t; 4]; T] {
    let mut f = [[vdupq_n_f32(0.0); 4]; T];
    for b in 0..nb {
        // SAFETY: superblock b of the group and of every activation row are inside them, the
        // buffer holds a superblock's 256 registers (caller); CPU features are this fn's.
        unsafe {
            let blk = group.add(K::GROUP_BLOCK * b);
            let terms = K::terms(blk);
            macro_rules! passes {
                ($src:expr) => {{
                    let src = $src;
                    macro_rules! pass {
                        ($p:expr, $t0:expr) => {{
                            let t0 = $t0;
                            let mut ys = [std::ptr::null(); $p];
                            let mut dy = [0f32; $p];
                            let mut bs = [&rows.bsums[t0][b]; $p];
                            for t in 0..$p {
                                ys[t] = rows.ys[t0 + t].add(292 * b + 4);
                                dy[t] = rows.dys[t0 + t][b];
                                bs[t] = &rows.bsums[t0 + t][b];
                            }
                            kquant_pass::<K, _, $p>(&src, &terms, ys, dy, bs, &mut f[t0..])
                        }};
                    }
                    for i in 0..T / KPASS {
                        pass!(KPASS, KPASS * i);
                    }
                    if T % KPASS == 1 {
                        pass!(1, T - 1);
                    }
                }};
            }
            if T == 1 && K::ONE_IN_ORDER {
                let y = rows.ys[0].add(292 * b + 4);
                q6k_one(blk, &terms, y, rows.dys[0][b], &mut f[0]);
            } else if T <= KPASS {
                passes!(Direct::<K>(blk, PhantomData));
            } else {
                decode_block::<K>(blk, buf);
                passes!(Decoded(buf));
            }
        }
    }
    f
}

/// Every group of `w` with tokens `t0..t0 + T` of `acts`, into `outs`.
///
/// # Safety
/// As [`run`], with `T` = `outs.len()`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn groups<const TY: u8, const T: usize>(
    w: &[u8],
    group_bytes: usize,
    acts: &Activations<'_>,
    t0: usize,
    outs: &mut [&mut [f32]],
) {
    let nb = acts.blocks;
    let rows = acts.token_rows::<T>(t0);
    let mut buf = [vdupq_n_s8(0); 256];
    let buf = buf.as_mut_ptr();
    for (g, group) in w.chunks_exact(group_bytes).enumerate() {
        let p = group.as_ptr();
        // SAFETY: `group` is one whole group of `nb` blocks of the type `TY` names; `rows`
        // holds `T` activation rows of `nb` blocks with the terms the type reads (`run`); the
        // buffer has 256 registers; CPU features are the caller's.
        let f = unsafe {
            match TY {
                0 => legacy_group::<Q8_0, T>(p, nb, &rows, buf),
                1 => legacy_group::<Q4_0, T>(p, nb, &rows, buf),
                2 => legacy_group::<Q5_0, T>(p, nb, &rows, buf),
                3 => kquant_group::<Q4K, T>(p, nb, &rows, buf),
                5 => kquant_group::<Q5K, T>(p, nb, &rows, buf),
                6 => legacy_group::<Q4_1, T>(p, nb, &rows, buf),
                7 => legacy_group::<Q5_1, T>(p, nb, &rows, buf),
                _ => kquant_group::<Q6K, T>(p, nb, &rows, buf),
            }
        };
        for (o, f) in outs.iter_mut().zip(&f) {
            let o = &mut o[g * GROUP_ROWS..][..GROUP_ROWS];
            for (q, f) in f.iter().enumerate() {
                // SAFETY: `o` is 16 writable f32; lanes 4q..4q+4 of them.
                unsafe { vst1q_f32(o[4 * q..].as_mut_ptr(), *f) };
            }
        }
    }
}

/// The product of the rows16 groups `w` with activation rows `tokens` of `acts`, into `outs`
/// (one slice per token).
///
/// # Safety
/// NEON and dotprod; `w` whole groups of the activations' weight type and width; `tokens`
/// 1..=[`MAX_TOKENS`] of its rows, whose terms it holds ([`super::fast`] was true when they
/// were computed); `outs` one slice of at least `rows` values per row of `tokens`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn run(
    w: &[u8],
    acts: &Activations<'_>,
    tokens: Range<usize>,
    outs: &mut [&mut [f32]],
) {
    let (ty, nb) = (acts.ty, acts.blocks);
    let (ty_id, block_bytes, act_block) = match ty {
        GgmlType::Q8_0 => (0, Q8_0::GROUP_BLOCK, 34),
        GgmlType::Q4_0 => (1, Q4_0::GROUP_BLOCK, 34),
        GgmlType::Q5_0 => (2, Q5_0::GROUP_BLOCK, 34),
        GgmlType::Q4K => (3, Q4K::GROUP_BLOCK, 292),
        GgmlType::Q6K => (4, Q6K::GROUP_BLOCK, 292),
        GgmlType::Q5K => (5, Q5K::GROUP_BLOCK, 292),
        GgmlType::Q4_1 => (6, Q4_1::GROUP_BLOCK, 34),
        GgmlType::Q5_1 => (7, Q5_1::GROUP_BLOCK, 34),
        _ => unreachable!("a rows16 type"),
    };
    let group_bytes = nb * block_bytes;
    let groups_n = w.len() / group_bytes.max(1);
    let terms = match ty_id {
        1 | 2 => acts.offset_sum.len(),
        3..=5 => acts.bsums.len(),
        6 | 7 => acts.min_sum.len(),
        _ => usize::MAX,
    };
    assert!(
        (1..=MAX_TOKENS).contains(&tokens.len())
            && outs.len() == tokens.len()
            && group_bytes > 0
            && w.len() == groups_n * group_bytes
            && outs.iter().all(|o| o.len() >= groups_n * GROUP_ROWS)
            && acts.row_bytes == nb * act_block
            && acts.rows.len() >= tokens.end * acts.row_bytes
            && acts.dy.len() >= tokens.end * nb
            && terms >= tokens.end * nb,
        "rows16 NEON geometry"
    );
    macro_rules! dispatch {
        ($($t:literal)*) => {
            match (ty_id, tokens.len()) {
                $(
                    (0, $t) => groups::<0, $t>(w, group_bytes, acts, tokens.start, outs),
                    (1, $t) => groups::<1, $t>(w, group_bytes, acts, tokens.start, outs),
                    (2, $t) => groups::<2, $t>(w, group_bytes, acts, tokens.start, outs),
                    (3, $t) => groups::<3, $t>(w, group_bytes, acts, tokens.start, outs),
                    (5, $t) => groups::<5, $t>(w, group_bytes, acts, tokens.start, outs),
                    (6, $t) => groups::<6, $t>(w, group_bytes, acts, tokens.start, outs),
                    (7, $t) => groups::<7, $t>(w, group_bytes, acts, tokens.start, outs),
                    (_, $t) => groups::<4, $t>(w, group_bytes, acts, tokens.start, outs),
                )*
                _ => unreachable!("1..=16 activation rows"),
            }
        };
    }
    // SAFETY: CPU features are the caller's; the geometry is checked above.
    unsafe { dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16) }
}
