//! AVX2 kernels for the rows16 layout (x86-64 without AVX-512 VNNI: AMD Zen 2/3, Intel before
//! Ice Lake), bit-identical to the scalar reference like the AVX-512 and NEON ones.
//!
//! What: a chunk (4 codes × 16 rows, 64 bytes) is two 256-bit registers of 8 rows (a half).
//! AVX2 has no `vpdpbusd`: `vpmaddubsw` multiplies the unsigned weight codes with 4 broadcast
//! signed activation codes into i16 pair sums per row lane, and those are summed in i16 over
//! as many chunks as cannot overflow ([`Layout::SUM16`]: 8 for 4-bit codes, 4 for 5-bit, 2
//! for 6-bit) before one `vpmaddwd` widens them to i32, by 1 (legacy types) or by the
//! sub-block's scale (k-quants: the scale multiply comes free). Codes are unsigned where the
//! layout allows: Q4_0/Q5_0 with the activations' `−off·Σy` term as start, Q4_K/Q5_K with
//! their mins from the sub-block sums, Q6_K as `q` with `−32·Σ sc·Σy` per superblock; Q8_0's
//! signed codes take the sign trick (`|w|` times `y` with `w`'s sign, exact as the activation
//! quantizers never emit −128). Integer sums are exact in any order; each block's float step
//! is the reference's, on 8 row lanes per register.
//!
//! Tokens: compiled per count 1..=16. The legacy types decode each chunk on the spot
//! ([`Direct`]) for one token, for four at a time when the count is a multiple of 4, else for
//! two at a time, every pass re-reading the block from L1.
//! Q4_K and Q6_K do so for up to [`Kquant::DIRECT_TOKENS`] tokens (6: [`k4_tokens`],
//! [`k6_tokens`]), every token per decoded register; Q5_K runs 2 tokens as two of one. With
//! more tokens, Q4_K runs passes of 4 tokens ([`Kquant::PASSES_OF_FOUR`]), and Q5_K and Q6_K
//! decode a superblock once into a buffer ([`Buffers`]) that every four tokens (when their
//! count is a multiple of 4: 16 tokens Q6_K 2,611 → 2,476 µs, Q5_K 2,240 → 2,152) or every
//! pair reads from L1. Through a 4 KiB buffer, one token of TinyLlama Q4_K_M ran 9 %
//! slower than on the file-layout kernels it replaced (BENCHMARKS.md). With a few tokens the
//! buffer's stores and reloads cost more than decoding twice: from cache, one thread,
//! `decode_dram`, 2 / 4 tokens, µs through the buffer against on the spot: Q8_0 5632×2048
//! 544 / 918 against 407 / 817; Q4_K 5632×2048 363 / 570 against 284 / 531 (265 / 462 since
//! its steps are inline assembly, [`maddubs_step`]); Q6_K 2048×5632
//! 778 / 1,077 against 477 / 743; Q5_K 5632×2048 with 2 tokens 828 against 551 (BENCHMARKS.md).
//! One token of Q4_K and Q6_K reads its superblock in address order with software prefetch
//! ([`Kquant::one`]): from DRAM with 2 threads (`decode_dram`) Q4_K went from 28 to 34 GB/s
//! and Q6_K from 25 to 36-42, against 37-44 for a plain read of the same bytes. One token of
//! every type prefetches 2 KiB ahead ([`ONE_TOKEN_AHEAD`]; Q8_0 from DRAM 31-34 → 38-45 GB/s).
//!
//! Where it comes from: the parent module's AVX-512 kernels (layout, terms, float steps),
//! `mod neon` (the chunk abstraction), ggml's AVX2 k-quant dots (`vpmaddubsw` into i16, then
//! `vpmaddwd` by the scales). Cost per 64 weight bytes and token: two `vpmaddubsw` (Q8_0 also
//! two `vpsignb`), about one `vpaddw` and a fraction of a `vpmaddwd`; the chunk's decode (Q8_0
//! one op a register, Q4_0/Q4_K one or two, Q5_0/Q5_K three to five, Q6_K three) once per
//! block (the legacy types' several tokens: once per pass); per block and token a float step
//! on 16 lanes.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::{Activations, GROUP_ROWS, TokenRows, q4k, q5k, q6k};
use crate::GgmlType;

/// Activation rows one call takes (the caller splits more).
pub(super) const MAX_TOKENS: usize = 16;

/// A chunk: rows 0..8 and 8..16.
type Chunk = [__m256i; 2];

/// The 16 f16 at `p` as f32, 8 rows a register.
///
/// # Safety
/// AVX2 and F16C; `p` addresses 32 readable bytes.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> [__m256; 2] {
    // SAFETY: F16C (caller); two 16-byte loads inside the caller's 32 bytes.
    unsafe {
        [
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
        ]
    }
}

/// The two halves of the 64-byte register at `p`.
///
/// # Safety
/// AVX2; `p` addresses 64 readable bytes.
#[inline(always)]
unsafe fn ld2(p: *const u8) -> Chunk {
    // SAFETY: AVX2 (caller); two loads inside the caller's 64 bytes.
    unsafe {
        [
            _mm256_loadu_si256(p.cast()),
            _mm256_loadu_si256(p.add(32).cast()),
        ]
    }
}

/// The low (`high` false) or high nibbles of each byte.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn nibble(v: __m256i, high: bool) -> __m256i {
    // SAFETY: AVX2 (caller).
    unsafe {
        let v = if high { _mm256_srli_epi16::<4>(v) } else { v };
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }
}

/// The low (`high` false) or high nibbles of the 64-byte register at `p`.
///
/// # Safety
/// AVX2; `p` addresses 64 readable bytes.
#[inline(always)]
unsafe fn nibbles(p: *const u8, high: bool) -> Chunk {
    // SAFETY: AVX2 (caller); the register is the caller's.
    unsafe {
        let v = ld2(p);
        [nibble(v[0], high), nibble(v[1], high)]
    }
}

/// `sum[h] += vpmaddubsw(codes[h], yc)` for both halves (`sum[h] =` the product when
/// `first`): one token's step over one chunk of [`k4_tokens`], in inline assembly. Written with
/// intrinsics, LLVM unrolled that loop whole, hoisted the following steps' loads (codes and
/// broadcast activations) ahead of these and spilled what it hoisted: with 4 tokens, a store
/// to the stack for about every `vpmaddubsw`. An `asm!` block that may touch memory keeps each
/// load after the steps before it, so the loop runs in the order written, in registers. From
/// cache, one thread, `decode_dram` Q4_K 5632×2048, 2 / 3 / 4 / 5 / 6 tokens: 283 / 420 / 533
/// / 684 / 690 → 265 / 365 / 462 / 561 / 689 µs (BENCHMARKS.md). The same step in Q6_K's
/// [`k6_tokens`] and in the legacy types' [`dots`] from 3 tokens, whose codes take longer to
/// decode, was slower (Q6_K 2 / 4 tokens 474 / 754 → 494 / 812-826 µs; 4 tokens Q8_0 5632×2048
/// 811 → 838, Q5_0 4864×896 257 → 310).
///
/// # Safety
/// AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_step(codes: Chunk, yc: __m256i, sum: &mut Chunk, first: bool) {
    // SAFETY: register operands only, AVX2 instructions (this fn's features). The block
    // neither reads nor writes memory nor the stack and keeps the flags; it is left without
    // `nomem` on purpose, as an ordering point for the loads around it.
    unsafe {
        if first {
            std::arch::asm!(
                "vpmaddubsw {s0}, {c0}, {y}",
                "vpmaddubsw {s1}, {c1}, {y}",
                c0 = in(ymm_reg) codes[0],
                c1 = in(ymm_reg) codes[1],
                y = in(ymm_reg) yc,
                s0 = out(ymm_reg) sum[0],
                s1 = out(ymm_reg) sum[1],
                options(nostack, preserves_flags),
            );
        } else {
            std::arch::asm!(
                "vpmaddubsw {t}, {c0}, {y}",
                "vpaddw {s0}, {s0}, {t}",
                "vpmaddubsw {t}, {c1}, {y}",
                "vpaddw {s1}, {s1}, {t}",
                c0 = in(ymm_reg) codes[0],
                c1 = in(ymm_reg) codes[1],
                y = in(ymm_reg) yc,
                s0 = inout(ymm_reg) sum[0],
                s1 = inout(ymm_reg) sum[1],
                t = out(ymm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// Software prefetch, into L2 (`prefetcht1`), of the `bytes` at `p` `ahead` bytes ahead
/// (every type, one token or several; unlike AVX-512, where it did not pay for one token of
/// the k-quants).
#[inline(always)]
fn prefetch_ahead(p: *const u8, bytes: usize, ahead: usize) {
    for l in 0..bytes.div_ceil(64) {
        // SAFETY: `prefetcht1` is a hint: it never faults, whatever the address
        // (`wrapping_add` keeps the arithmetic defined); SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead + 64 * l).cast()) };
    }
}

/// How far ahead several tokens' products prefetch: the AVX-512 kernels' distance
/// (`x86::prefetch_ahead`).
const SEVERAL_AHEAD: usize = 8192;
/// How far ahead one token's product prefetches. From DRAM with 2 threads (`decode_dram`,
/// three alternated sittings) 2 KiB against 8 KiB took Q8_0 from 31-34 to 38-45 GB/s (it had
/// no prefetch at 8 KiB, where it did not pay), Q4_0 from 35-36 to 38-42, and the medians of
/// Q4_K and Q6_K from 34.7 to 40.6 and 36.2 to 39.8 (their sittings overlap), against 43 for a
/// plain read of Q8_0 5632×2048 in the same session; whole decode (`airs bench decode`,
/// alternated twice) Qwen2.5-0.5B 72 → 77 t/s, TinyLlama Q4_K_M 47-49 → 52-54, Q8_0 28 → 34.
/// 4 KiB was slower than 2 on each; Q5_0 alone was slightly faster at 8 KiB in `decode_dram`,
/// but Qwen's decode was not.
const ONE_TOKEN_AHEAD: usize = 2048;

/// `$body` once per literal, with the constant `$s` bound to it (loops whose index must be a
/// compile-time constant in the body).
macro_rules! unroll {
    ($s:ident in [$($n:literal)*] $body:block) => {
        $({
            const $s: usize = $n;
            $body
        })*
    };
}

/// A rows16 type as these kernels decode it.
trait Layout {
    /// Bytes of one block (legacy) or superblock (k-quants) of a group.
    const GROUP_BLOCK: usize;
    /// Chunks (4 values × 16 rows) per block.
    const CHUNKS: usize;
    /// Chunks whose `vpmaddubsw` pair sums may be added in i16: `SUM16 · 2 · max code · 128`
    /// ≤ 32767.
    const SUM16: usize;
    /// Codes signed (Q8_0: the sign trick), else unsigned.
    const SIGNED: bool = false;
    /// The codes of chunk `c` (values `4c..4c+4` of the block, in block order) of the block at
    /// `blk`, rows 0..8 and 8..16.
    ///
    /// # Safety
    /// AVX2; `blk` addresses one whole block of a group of this layout; `c < CHUNKS`.
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk;
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
    const SUM16: usize = 1;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // SAFETY: AVX2 (caller); chunk c is bytes 32 + 64c .. +64 of the 544-byte block.
        unsafe { ld2(blk.add(32 + 64 * c)) }
    }
}

impl Layout for Q4_0 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 18;
    const CHUNKS: usize = 8;
    const SUM16: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // SAFETY: AVX2 (caller); the nibbles are bytes 32..288 of the block.
        unsafe { nibbles(blk.add(32 + 64 * (c % 4)), c >= 4) }
    }
}

impl Layout for Q5_0 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 22;
    const CHUNKS: usize = 8;
    const SUM16: usize = 4;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // SAFETY: AVX2 (caller); the plane is bytes 32..96 of the block, the nibbles 96..352.
        unsafe { five_bit_chunk(blk.add(32), blk.add(96), c) }
    }
}

impl Layout for Q4_1 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 20;
    const CHUNKS: usize = 8;
    const SUM16: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // SAFETY: AVX2 (caller); the nibbles are bytes 64..320 of the block.
        unsafe { nibbles(blk.add(64 + 64 * (c % 4)), c >= 4) }
    }
}

impl Layout for Q5_1 {
    const GROUP_BLOCK: usize = GROUP_ROWS * 24;
    const CHUNKS: usize = 8;
    const SUM16: usize = 4;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // SAFETY: AVX2 (caller); the plane is bytes 64..128 of the block, the nibbles
        // 128..384.
        unsafe { five_bit_chunk(blk.add(64), blk.add(128), c) }
    }
}

/// Chunk `c` of a Q5_0/Q5_1 block: the nibbles at `qs` plus 16 where bit `c` of the fifth-bit
/// plane's byte is set ([`bit_to_16`]): three operations a register, as Q5_K's, where spreading
/// a u64 mask over bytes took a broadcast and five (`vpshufb`, `vpand`, `vpcmpeqb`, `vpand`,
/// `vpor`) and left one token of Q5_0 bound by arithmetic (BENCHMARKS.md).
///
/// # Safety
/// AVX2; `plane` addresses 64 readable bytes, `qs` 256; `c < 8`.
#[inline(always)]
unsafe fn five_bit_chunk(plane: *const u8, qs: *const u8, c: usize) -> Chunk {
    // SAFETY: AVX2 (caller); the plane's 64 bytes and the nibbles inside `qs`'s 256 bytes.
    unsafe {
        let mut out = nibbles(qs.add(64 * (c % 4)), c >= 4);
        for (o, h) in out.iter_mut().zip(ld2(plane)) {
            *o = _mm256_or_si256(*o, bit_to_16(h, c));
        }
        out
    }
}

/// A legacy type: Q4_0's and Q5_0's codes are offset by the activations' block term; Q4_1's
/// and Q5_1's have a min.
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
/// Q6_K superblocks: sub-blocks of 16 values (4 chunks); codes 0..=63 (the reference's
/// `q − 32` with the offset taken out per superblock).
struct Q6K;

impl Layout for Q4K {
    const GROUP_BLOCK: usize = q4k::GROUP_BLOCK;
    const CHUNKS: usize = 64;
    const SUM16: usize = 8;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // Chunk c: sub-block s = c / 8 (nibbles of pair s / 2, low for even s), chunk c % 8.
        let s = c / 8;
        // SAFETY: AVX2 (caller); the codes are bytes 256..2304 of the superblock.
        unsafe { nibbles(blk.add(256 + 512 * (s / 2) + 64 * (c % 8)), s % 2 == 1) }
    }
}

/// Bit `s` (< 8) of each byte of `h` at bit 4, alone (`& 0x10`): a fifth bit as the 16 it adds
/// to its code. 16-bit shifts: bit 4 of each byte comes from the same byte.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn bit_to_16(h: __m256i, s: usize) -> __m256i {
    // SAFETY: AVX2 (caller).
    unsafe {
        let at4 = match s {
            0 => _mm256_slli_epi16::<4>(h),
            1 => _mm256_slli_epi16::<3>(h),
            2 => _mm256_slli_epi16::<2>(h),
            3 => _mm256_slli_epi16::<1>(h),
            4 => h,
            5 => _mm256_srli_epi16::<1>(h),
            6 => _mm256_srli_epi16::<2>(h),
            _ => _mm256_srli_epi16::<3>(h),
        };
        _mm256_and_si256(at4, _mm256_set1_epi8(0x10))
    }
}

impl Layout for Q5K {
    const GROUP_BLOCK: usize = q5k::GROUP_BLOCK;
    const CHUNKS: usize = 64;
    const SUM16: usize = 4;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // Chunk c: sub-block s = c / 8 as Q4_K's, whose fifth bits are bit s of the bytes of
        // `qh` register c % 8, shifted to bit 4 (16-bit shifts: bit 4 of each byte comes from
        // the same byte).
        let s = c / 8;
        // SAFETY: AVX2 (caller); `qh` is bytes 256..768 of the superblock, the codes
        // 768..2816.
        unsafe {
            let mut out = nibbles(
                blk.add(q5k::CODES + 512 * (s / 2) + 64 * (c % 8)),
                s % 2 == 1,
            );
            let h = ld2(blk.add(q5k::QH + 64 * (c % 8)));
            for (o, h) in out.iter_mut().zip(h) {
                *o = _mm256_or_si256(*o, bit_to_16(h, s));
            }
            out
        }
    }
}

/// The 6-bit codes of quarter `f` (0..4) of a Q6_K register: the low nibbles of `ql` (`f` 0
/// and 1) or its high ones (2 and 3), with bit pair `f` of each `qh` byte moved to bits 4-5.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn q6_codes(ql: __m256i, qh: __m256i, f: usize) -> __m256i {
    // SAFETY: AVX2 (caller).
    unsafe {
        let hb = match f {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<2>(qh),
            2 => qh,
            _ => _mm256_srli_epi16::<2>(qh),
        };
        _mm256_or_si256(
            nibble(ql, f >= 2),
            _mm256_and_si256(hb, _mm256_set1_epi8(0x30)),
        )
    }
}

impl Layout for Q6K {
    const GROUP_BLOCK: usize = q6k::GROUP_BLOCK;
    const CHUNKS: usize = 64;
    const SUM16: usize = 2;
    #[inline(always)]
    unsafe fn chunk(blk: *const u8, c: usize) -> Chunk {
        // Values 4c.. = 128h + 32f + 4k..: quarter f of ql chunk k (f = 0, 2) or 8 + k (f = 1,
        // 3) with qh chunk k.
        let (h, f, k) = (c / 32, c / 8 % 4, c % 8);
        // SAFETY: AVX2 (caller); the layout's ql and qh chunks are inside the superblock.
        unsafe {
            let ql = ld2(blk.add(q6k::ql(h, 8 * (f % 2) + k)));
            let qh = ld2(blk.add(q6k::qh(h, k)));
            [q6_codes(ql[0], qh[0], f), q6_codes(ql[1], qh[1], f)]
        }
    }
}

/// Where a token's dots read a block's decoded chunks: (the codes `vpmaddubsw` takes, unsigned;
/// Q8_0's signed codes, whose signs the activations take).
trait Source {
    /// # Safety
    /// AVX2; `c` is a chunk of the block the source was made for.
    unsafe fn get(&self, c: usize) -> (Chunk, Chunk);
}

/// Decoded from the group stream on the spot (one token: nothing to share).
struct Direct<L>(*const u8, PhantomData<L>);

impl<L: Layout> Source for Direct<L> {
    #[inline(always)]
    unsafe fn get(&self, c: usize) -> (Chunk, Chunk) {
        // SAFETY: `self.0` is a whole block of `L` (the maker's), `c` one of its chunks.
        unsafe {
            let w = L::chunk(self.0, c);
            if L::SIGNED {
                (
                    [_mm256_sign_epi8(w[0], w[0]), _mm256_sign_epi8(w[1], w[1])],
                    w,
                )
            } else {
                (w, w)
            }
        }
    }
}

/// Loaded from a buffer a k-quant superblock was decoded into once for several tokens
/// ([`decode_block_part`]; unsigned codes).
struct Decoded<'a> {
    buf: &'a [Chunk],
}

impl Source for Decoded<'_> {
    #[inline(always)]
    unsafe fn get(&self, c: usize) -> (Chunk, Chunk) {
        // SAFETY: the buffer holds every chunk of the superblock (the maker's).
        let w = unsafe { *self.buf.get_unchecked(c) };
        (w, w)
    }
}

/// Eighth `i` of a k-quant superblock's chunks (`8i..8i + 8`) decoded into `buf`.
///
/// # Safety
/// As [`Layout::chunk`]; `buf` has room for `L::CHUNKS` chunks.
#[inline(always)]
unsafe fn decode_block_part<L: Layout>(blk: *const u8, buf: &mut [Chunk], i: usize) {
    let per = L::CHUNKS / 8;
    for (c, w) in buf.iter_mut().enumerate().skip(per * i).take(per) {
        // SAFETY: `c` is a chunk of the block (caller).
        *w = unsafe { L::chunk(blk, c) };
    }
}

/// Integer dots of the chunks `chunks` of `src` with `N` tokens' activation codes `y` (each its
/// block, `4 · chunks.end` bytes; several tokens share each chunk's loads): per token and
/// half, the i32 sums of `vpmaddubsw` pair sums over every run of `L::SUM16` chunks, each run
/// widened by `vpmaddwd` with `scale` (i16 pairs, equal in a lane: 1, or a k-quant sub-block's
/// scale), added to the token's `init`.
///
/// # Safety
/// AVX2; each `y` has `4 · chunks.end` readable bytes; `src` holds the chunks.
#[inline(always)]
unsafe fn dots<L: Layout, S: Source, const N: usize>(
    src: &S,
    chunks: Range<usize>,
    y: [*const u8; N],
    scale: &[__m256i; 2],
    init: [[__m256i; 2]; N],
) -> [[__m256i; 2]; N] {
    // SAFETY: AVX2 (caller); the codes of chunk c are bytes 4c..4c+4 of each `y`.
    unsafe {
        let mut acc = init;
        let mut c = chunks.start;
        while c < chunks.end {
            let mut sum = [[_mm256_setzero_si256(); 2]; N];
            for i in 0..L::SUM16 {
                let (codes, signs) = src.get(c + i);
                for (u, sum) in sum.iter_mut().enumerate() {
                    let yc =
                        _mm256_set1_epi32(y[u].add(4 * (c + i)).cast::<i32>().read_unaligned());
                    for h in 0..2 {
                        let ys = if L::SIGNED {
                            _mm256_sign_epi8(yc, signs[h])
                        } else {
                            yc
                        };
                        let p = _mm256_maddubs_epi16(codes[h], ys);
                        sum[h] = if i == 0 {
                            p
                        } else {
                            _mm256_add_epi16(sum[h], p)
                        };
                    }
                }
            }
            for (acc, sum) in acc.iter_mut().zip(&sum) {
                for h in 0..2 {
                    acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(sum[h], scale[h]));
                }
            }
            c += L::SUM16;
        }
        acc
    }
}

/// A k-quant superblock decoded once for several tokens: its chunks. Empty where no product
/// reads it (zeroing it per call was 4 % of a one-token decode's profile, in `memset`).
struct Buffers {
    chunks: Vec<Chunk>,
}

/// A legacy block's float step for one token, as the reference: `f += sumi · (d·dy)` (with a
/// min, `+ m·ms`, `ms` the token's `dy·Σy`).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn legacy_step<L: Legacy>(
    f: &mut [__m256; 2],
    acc: [__m256i; 2],
    d: &[__m256; 2],
    m: &[__m256; 2],
    dy: f32,
    ms: f32,
) {
    // SAFETY: AVX2 (caller).
    unsafe {
        let dy = _mm256_set1_ps(dy);
        for h in 0..2 {
            let mut p = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_mul_ps(d[h], dy));
            if L::MIN {
                p = _mm256_add_ps(p, _mm256_mul_ps(m[h], _mm256_set1_ps(ms)));
            }
            f[h] = _mm256_add_ps(f[h], p);
        }
    }
}

/// The 16 row dots of the legacy group at `group` (`nb` blocks) with each of `T` tokens: per
/// block, `f += Σ q·y · (d·dy)` as the scalar reference (`sum += sumi · (d·dy)`; with a min
/// `sum += (d·dy)·sumi + m·(dy·Σy)`).
///
/// # Safety
/// AVX2, FMA and F16C; `group` one whole group of `L` with `nb` blocks; `rows` `T` activation
/// rows of `nb` blocks with their terms.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_group<L: Legacy, const T: usize>(
    group: *const u8,
    nb: usize,
    rows: &TokenRows<'_, T>,
) -> [[__m256; 2]; T] {
    let mut f = [[_mm256_setzero_ps(); 2]; T];
    let ones = [_mm256_set1_epi16(1); 2];
    for b in 0..nb {
        // SAFETY: block b of the group and of every activation row are inside them (caller);
        // CPU features are this fn's.
        unsafe {
            let blk = group.add(L::GROUP_BLOCK * b);
            let ahead = if T > 1 {
                SEVERAL_AHEAD
            } else {
                ONE_TOKEN_AHEAD
            };
            prefetch_ahead(blk, L::GROUP_BLOCK, ahead);
            let d = f16x16(blk);
            let m = if L::MIN {
                f16x16(blk.add(32))
            } else {
                [_mm256_setzero_ps(); 2]
            };
            // (A closure here may not call intrinsics: it would not inherit the CPU features.)
            let offset = |t: usize| {
                if L::OFFSET {
                    *rows.offs[t].get_unchecked(b)
                } else {
                    0
                }
            };
            let y = |t: usize| rows.ys[t].add(34 * b + 2);
            let dy = |t: usize| *rows.dys[t].get_unchecked(b);
            let ms = |t: usize| {
                if L::MIN {
                    *rows.mins[t].get_unchecked(b)
                } else {
                    0.0
                }
            };
            // The integer dots, then the block's float step per token: four tokens at a time
            // when their count is a multiple of 4, else two at a time and an odd last one
            // alone (each chunk decoded once per pass). From cache, one thread, 4864×896, µs
            // in pairs against in fours: 4 tokens Q5_0 258 → 238, Q4_0 210 → 184, Q8_0 316 →
            // 317; 16 tokens (a prefill pass) Q8_0 1,253 → 1,177, Q5_0 819 → 765, Q4_0 770 →
            // 713; 8 tokens Q8_0 and Q5_0 7 % and 4 % faster in fours, Q4_0 8 % slower. With 5
            // or 6 tokens (four, then one or two) Q5_0 was 20 % slower than in pairs.
            let src = Direct::<L>(blk, PhantomData);
            let mut t = 0;
            while T.is_multiple_of(4) && t < T {
                let quad = dots::<L, _, 4>(
                    &src,
                    0..8,
                    [y(t), y(t + 1), y(t + 2), y(t + 3)],
                    &ones,
                    [
                        [_mm256_set1_epi32(offset(t)); 2],
                        [_mm256_set1_epi32(offset(t + 1)); 2],
                        [_mm256_set1_epi32(offset(t + 2)); 2],
                        [_mm256_set1_epi32(offset(t + 3)); 2],
                    ],
                );
                for (u, acc) in quad.into_iter().enumerate() {
                    legacy_step::<L>(&mut f[t + u], acc, &d, &m, dy(t + u), ms(t + u));
                }
                t += 4;
            }
            while t + 1 < T {
                let pair = dots::<L, _, 2>(
                    &src,
                    0..8,
                    [y(t), y(t + 1)],
                    &ones,
                    [
                        [_mm256_set1_epi32(offset(t)); 2],
                        [_mm256_set1_epi32(offset(t + 1)); 2],
                    ],
                );
                for (u, acc) in pair.into_iter().enumerate() {
                    legacy_step::<L>(&mut f[t + u], acc, &d, &m, dy(t + u), ms(t + u));
                }
                t += 2;
            }
            if t < T {
                let init = [_mm256_set1_epi32(offset(t)); 2];
                let [acc] = dots::<L, _, 1>(&src, 0..8, [y(t)], &ones, [init]);
                legacy_step::<L>(&mut f[t], acc, &d, &m, dy(t), ms(t));
            }
        }
    }
    f
}

/// A k-quant superblock's per-row terms, rows in lanes (two halves of 8): the f32 `d` (and
/// `dmin`); each sub-block's scale as an i16 pair `(sc, sc)` per lane (for `vpmaddwd`); Q4_K's
/// mins as pairs `(m_2s, m_2s+1)` (against the activations' 32-value pair sums); Q6_K's scales
/// as pairs `(sc_4p, sc_4p+2)` and `(sc_4p+1, sc_4p+3)` (against its 16-value sub-block sums,
/// for the offset).
struct Terms<const SUBS: usize, const PAIRS: usize> {
    d: [__m256; 2],
    dmin: [__m256; 2],
    sc: [[__m256i; 2]; SUBS],
    pairs: [[__m256i; 2]; PAIRS],
}

/// Q4_K's and Q5_K's terms (8 sub-blocks, 4 min pairs), Q6_K's (16 sub-blocks, 8 scale
/// pairs): sized exactly, so that every field is written once (with unused entries, zeroing
/// the whole before filling it was 7 % of a one-token product, in `memset`).
type Terms4 = Terms<8, 4>;
type Terms6 = Terms<16, 8>;

/// Read access to a [`Terms`] whatever its sizes.
trait KquantTerms {
    fn d(&self) -> &[__m256; 2];
    fn dmin(&self) -> &[__m256; 2];
    fn sc(&self) -> &[[__m256i; 2]];
    fn pairs(&self) -> &[[__m256i; 2]];
}

impl<const SUBS: usize, const PAIRS: usize> KquantTerms for Terms<SUBS, PAIRS> {
    #[inline(always)]
    fn d(&self) -> &[__m256; 2] {
        &self.d
    }
    #[inline(always)]
    fn dmin(&self) -> &[__m256; 2] {
        &self.dmin
    }
    #[inline(always)]
    fn sc(&self) -> &[[__m256i; 2]] {
        &self.sc
    }
    #[inline(always)]
    fn pairs(&self) -> &[[__m256i; 2]] {
        &self.pairs
    }
}

/// A k-quant type.
trait Kquant: Layout + Sized {
    /// Sub-blocks per superblock (one integer scale each).
    const SUBS: usize;
    /// The type's [`Terms`].
    type Terms: KquantTerms;
    /// One token's integer dots of the superblock at `blk` with its activation codes `y`:
    /// per half, `isum = Σ_s sc_s · Σ q·y` (Q6_K's codes unsigned, its offset apart). By
    /// default sub-block after sub-block, chunks decoded on the spot.
    ///
    /// # Safety
    /// AVX2; `blk` one whole superblock of a group, `y` its 256 activation codes.
    #[inline(always)]
    unsafe fn one(blk: *const u8, y: *const u8, terms: &Self::Terms) -> [__m256i; 2] {
        let per = Self::CHUNKS / Self::SUBS;
        let src = Direct::<Self>(blk, PhantomData);
        // SAFETY: AVX2 (caller).
        let mut isum = [unsafe { _mm256_setzero_si256() }; 2];
        for s in 0..Self::SUBS {
            // SAFETY: the chunks of sub-block s are the superblock's, `y` its codes (caller).
            isum = unsafe {
                dots::<Self, _, 1>(&src, s * per..(s + 1) * per, [y], &terms.sc()[s], [isum])[0]
            };
        }
        isum
    }
    /// Most tokens [`Kquant::several`] takes in one pass.
    const DIRECT_TOKENS: usize = 1;
    /// Beyond [`Kquant::DIRECT_TOKENS`]: false to run the tokens through a decoded superblock,
    /// true to run them in [`Kquant::several`] passes of 4 (the last pass takes what is left),
    /// every pass decoding the superblock again ([`passes`]).
    const PASSES_OF_FOUR: bool = false;
    /// `N` tokens' integer dots of the superblock at `blk` ([`Kquant::one`]'s, added to
    /// `isum`), read from the group stream. By default token after token through `one`.
    ///
    /// # Safety
    /// As [`Kquant::one`] for each `y`.
    #[inline(always)]
    unsafe fn several<const N: usize>(
        blk: *const u8,
        y: [*const u8; N],
        terms: &Self::Terms,
        isum: &mut [[__m256i; 2]; N],
    ) {
        for (y, isum) in y.into_iter().zip(isum.iter_mut()) {
            // SAFETY: the caller's contract is `one`'s for each token.
            let one = unsafe { Self::one(blk, y, terms) };
            for h in 0..2 {
                // SAFETY: AVX2 (caller).
                isum[h] = unsafe { _mm256_add_epi32(isum[h], one[h]) };
            }
        }
    }
    /// # Safety
    /// AVX2 and F16C; `blk` addresses one whole superblock of a group.
    unsafe fn terms(blk: *const u8) -> Self::Terms;
}

/// Each 32-bit lane's bytes `b` (`-1`: a zero byte), `vpshufb` within 128-bit lanes.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn pick(x: __m256i, b: [i8; 4]) -> __m256i {
    let control: [i8; 32] = std::array::from_fn(|i| {
        if b[i % 4] < 0 {
            -1
        } else {
            ((i % 16) & !3) as i8 + b[i % 4]
        }
    });
    // SAFETY: AVX2 (caller); `control` is 32 readable bytes.
    unsafe { _mm256_shuffle_epi8(x, _mm256_loadu_si256(control.as_ptr().cast())) }
}

/// One token's integer dots of a Q4_K (`FIVE` false) or Q5_K superblock ([`Kquant::one`]):
/// sub-blocks in pairs `2p, 2p + 1` ([`k4_pair`]), in address order. Sub-block after
/// sub-block through [`dots`] (each chunk's shift picked at run time, `qh` and the codes read
/// out of order, no prefetch) ran Q5_K at 15.9 GB/s a thread from cache against Q4_K's 38.
///
/// # Safety
/// AVX2; `blk` one whole superblock of a group of the type, `y` its 256 activation codes.
#[inline(always)]
unsafe fn k4_one<const FIVE: bool>(blk: *const u8, y: *const u8, terms: &Terms4) -> [__m256i; 2] {
    // SAFETY: AVX2 (caller); the superblock's scales (and Q5_K's `qh`) precede its codes.
    unsafe {
        let mut isum = [_mm256_setzero_si256(); 2];
        prefetch_ahead(blk, if FIVE { q5k::CODES } else { 256 }, ONE_TOKEN_AHEAD);
        // Q5_K's pairs unrolled, so that each fifth bit's shift is a constant; Q4_K's as a
        // loop (unrolled, it ran 3-4 % slower from cache).
        if FIVE {
            unroll!(P in [0 1 2 3] { k4_pair::<FIVE>(blk, y, terms, P, &mut isum); });
        } else {
            for p in 0..4 {
                k4_pair::<FIVE>(blk, y, terms, p, &mut isum);
            }
        }
        isum
    }
}

/// Sub-blocks `2p` and `2p + 1` of [`k4_one`] into `isum`: they share their code registers
/// (low and high nibbles), each loaded once; Q5_K's fifth bits are bit `2p + u` of the bytes
/// of `qh` register `k` (512 bytes, revisited per pair from L1).
///
/// # Safety
/// As [`k4_one`]; `p < 4`.
#[inline(always)]
unsafe fn k4_pair<const FIVE: bool>(
    blk: *const u8,
    y: *const u8,
    terms: &Terms4,
    p: usize,
    isum: &mut [__m256i; 2],
) {
    // The codes follow the superblock's scales (and Q5_K's `qh`); the pair sums of `run`
    // chunks fit i16 (`Layout::SUM16`: 8 for Q4_K, 4 for Q5_K).
    let codes = if FIVE { q5k::CODES } else { 256 };
    let run = if FIVE { Q5K::SUM16 } else { Q4K::SUM16 };
    // SAFETY: AVX2 (caller); pair p's codes are the 8 registers at `codes + 512p` of the
    // superblock, values `64p + 4k..` (low nibbles) and `64p + 32 + 4k..` (high) of `y` its
    // codes; Q5_K's `qh` registers at `q5k::QH + 64k`.
    unsafe {
        let pair = blk.add(codes + 512 * p);
        prefetch_ahead(pair, 512, ONE_TOKEN_AHEAD);
        let mut sum = [[_mm256_setzero_si256(); 2]; 2];
        for k in 0..8 {
            let v = ld2(pair.add(64 * k));
            let qh = if FIVE {
                ld2(blk.add(q5k::QH + 64 * k))
            } else {
                [_mm256_setzero_si256(); 2]
            };
            for (u, sum) in sum.iter_mut().enumerate() {
                let at = 4 * (16 * p + 8 * u + k);
                let yc = _mm256_set1_epi32(y.add(at).cast::<i32>().read_unaligned());
                for h in 0..2 {
                    let mut code = nibble(v[h], u == 1);
                    if FIVE {
                        code = _mm256_or_si256(code, bit_to_16(qh[h], 2 * p + u));
                    }
                    let w = _mm256_maddubs_epi16(code, yc);
                    sum[h] = if k % run == 0 {
                        w
                    } else {
                        _mm256_add_epi16(sum[h], w)
                    };
                }
            }
            if k % run == run - 1 {
                for (u, sum) in sum.iter().enumerate() {
                    for h in 0..2 {
                        let w = _mm256_madd_epi16(sum[h], terms.sc[2 * p + u][h]);
                        isum[h] = _mm256_add_epi32(isum[h], w);
                    }
                }
            }
        }
    }
}

/// `N` tokens' integer dots of a Q4_K superblock ([`Kquant::several`]), in
/// [`k4_one`]'s order: per sub-block pair, the low nibbles of its 8 registers and then the
/// high ones, each chunk decoded once for every token, each token's step in
/// [`maddubs_step`]. Up to 6 tokens (from cache, one thread, 5632×2048: 2 / 4 / 6 tokens
/// 265 / 462 / 689 µs against 363 / 570 / 767 through the buffer); with more, the `2N` i16
/// sums spill (before `maddubs_step`: 8 tokens 1,017 against 971; 16 tokens 2,580 against
/// about 1,750).
///
/// # Safety
/// As [`k4_one`] for each `y`.
#[inline(always)]
unsafe fn k4_tokens<const N: usize>(
    blk: *const u8,
    y: [*const u8; N],
    terms: &Terms4,
    isum: &mut [[__m256i; 2]; N],
) {
    // SAFETY: AVX2 (caller); pair p's codes are the 8 registers at `256 + 512p` of the
    // superblock, values `64p + 4k..` (low nibbles) and `64p + 32 + 4k..` (high) of each `y`.
    unsafe {
        prefetch_ahead(blk, 256, SEVERAL_AHEAD);
        for p in 0..4 {
            let pair = blk.add(256 + 512 * p);
            prefetch_ahead(pair, 512, SEVERAL_AHEAD);
            for u in 0..2 {
                let mut sum = [[_mm256_setzero_si256(); 2]; N];
                for k in 0..8 {
                    let v = ld2(pair.add(64 * k));
                    let code = [nibble(v[0], u == 1), nibble(v[1], u == 1)];
                    let at = 4 * (16 * p + 8 * u + k);
                    for (y, sum) in y.iter().zip(sum.iter_mut()) {
                        let yc = _mm256_set1_epi32(y.add(at).cast::<i32>().read_unaligned());
                        maddubs_step(code, yc, sum, k == 0);
                    }
                }
                for (sum, isum) in sum.iter().zip(isum.iter_mut()) {
                    for h in 0..2 {
                        let w = _mm256_madd_epi16(sum[h], terms.sc[2 * p + u][h]);
                        isum[h] = _mm256_add_epi32(isum[h], w);
                    }
                }
            }
        }
    }
}

impl Kquant for Q4K {
    const SUBS: usize = 8;
    type Terms = Terms4;
    const DIRECT_TOKENS: usize = 6;
    /// From cache, one thread, µs through the buffer against in passes of 4: 5632×2048, 8 / 12
    /// / 16 tokens 961 / 1,356 / 1,752 against 899 / 1,315 / 1,736; 896×4864 360 / 506 / 654
    /// against 333 / 491 / 647.
    const PASSES_OF_FOUR: bool = true;
    #[inline(always)]
    unsafe fn several<const N: usize>(
        blk: *const u8,
        y: [*const u8; N],
        terms: &Terms4,
        isum: &mut [[__m256i; 2]; N],
    ) {
        // SAFETY: the caller's contract is `k4_tokens`'.
        unsafe { k4_tokens::<N>(blk, y, terms, isum) }
    }
    #[inline(always)]
    unsafe fn one(blk: *const u8, y: *const u8, terms: &Terms4) -> [__m256i; 2] {
        // SAFETY: the caller's contract is `k4_one`'s.
        unsafe { k4_one::<false>(blk, y, terms) }
    }
    #[inline(always)]
    unsafe fn terms(blk: *const u8) -> Terms4 {
        // SAFETY: AVX2 and F16C (caller); d at 0..32, dmin at 32..64 and the three scale
        // planes at 64..256 of the superblock.
        unsafe {
            let z = _mm256_setzero_si256();
            let mut t = Terms4 {
                d: f16x16(blk),
                dmin: f16x16(blk.add(32)),
                sc: [[z; 2]; 8],
                pairs: [[z; 2]; 4],
            };
            let six = _mm256_set1_epi8(0x3F);
            let nib = _mm256_set1_epi8(0x0F);
            let top = _mm256_set1_epi8(0x30);
            for h in 0..2 {
                // ggml's `scales[0..4]`, `[4..8]`, `[8..12]` of rows 8h..8h+8, a row a lane,
                // unpacked as its `get_scale_min_k4`, four sub-blocks a lane.
                let p0 = _mm256_loadu_si256(blk.add(64 + 32 * h).cast());
                let p1 = _mm256_loadu_si256(blk.add(128 + 32 * h).cast());
                let p2 = _mm256_loadu_si256(blk.add(192 + 32 * h).cast());
                let (top0, top1) = (
                    _mm256_and_si256(_mm256_srli_epi32::<2>(p0), top),
                    _mm256_and_si256(_mm256_srli_epi32::<2>(p1), top),
                );
                let sc = [
                    _mm256_and_si256(p0, six),
                    _mm256_or_si256(_mm256_and_si256(p2, nib), top0),
                ];
                let m = [
                    _mm256_and_si256(p1, six),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(p2), nib), top1),
                ];
                for s in 0..8 {
                    let i = (s % 4) as i8;
                    t.sc[s][h] = pick(sc[s / 4], [i, -1, i, -1]);
                }
                for s in 0..4 {
                    let i = (2 * (s % 2)) as i8;
                    t.pairs[s][h] = pick(m[s / 2], [i, -1, i + 1, -1]);
                }
            }
            t
        }
    }
}

impl Kquant for Q5K {
    const SUBS: usize = 8;
    type Terms = Terms4;
    /// Two tokens as two of one (the default [`Kquant::several`]): from cache, one thread,
    /// 5632×2048, 551 µs against 828 through the buffer; at 3 tokens the buffer is 3 % faster.
    const DIRECT_TOKENS: usize = 2;
    #[inline(always)]
    unsafe fn one(blk: *const u8, y: *const u8, terms: &Terms4) -> [__m256i; 2] {
        // SAFETY: the caller's contract is `k4_one`'s.
        unsafe { k4_one::<true>(blk, y, terms) }
    }
    #[inline(always)]
    unsafe fn terms(blk: *const u8) -> Terms4 {
        // SAFETY: AVX2 and F16C (caller); `d`, `dmin` and the scale planes lie where Q4_K's
        // do.
        unsafe { <Q4K as Kquant>::terms(blk) }
    }
}

/// `N` tokens' integer dots of a Q6_K superblock ([`Kquant::several`]), records in
/// [`Q6K::one`]'s address order, but per quarter `f` of a record pair: each code register
/// decoded once for every token (the pair's records revisited from L1 per quarter, so that
/// the i16 sums are `2N` registers rather than one's 8 a token). Up to 6 tokens (from cache,
/// one thread, 2048×5632: 2 / 4 / 6 tokens 477 / 743 / 1,034 µs against 778 / 1,077 / 1,334
/// through the buffer; 8 tokens 1,745 against 1,600-1,650).
///
/// # Safety
/// As [`Q6K::one`] for each `y`.
#[inline(always)]
unsafe fn k6_tokens<const N: usize>(
    blk: *const u8,
    y: [*const u8; N],
    terms: &Terms6,
    isum: &mut [[__m256i; 2]; N],
) {
    // SAFETY: AVX2 (caller); as `Q6K::one`.
    unsafe {
        prefetch_ahead(blk, q6k::ql(0, 0), SEVERAL_AHEAD);
        for h in 0..2 {
            for kp in 0..4 {
                prefetch_ahead(blk.add(q6k::ql(h, 2 * kp)), 384, SEVERAL_AHEAD);
                unroll!(F in [0 1 2 3] {
                    let mut sum = [[_mm256_setzero_si256(); 2]; N];
                    for k in [2 * kp, 2 * kp + 1] {
                        let rec = blk.add(q6k::ql(h, k));
                        let ql = ld2(rec.add(if F.is_multiple_of(2) { 0 } else { 64 }));
                        let qh = ld2(rec.add(128));
                        let at = 4 * (32 * h + 8 * F + k);
                        let code = [q6_codes(ql[0], qh[0], F), q6_codes(ql[1], qh[1], F)];
                        for (y, sum) in y.iter().zip(sum.iter_mut()) {
                            let yc = _mm256_set1_epi32(y.add(at).cast::<i32>().read_unaligned());
                            for hh in 0..2 {
                                let p = _mm256_maddubs_epi16(code[hh], yc);
                                sum[hh] = if k.is_multiple_of(2) {
                                    p
                                } else {
                                    _mm256_add_epi16(sum[hh], p)
                                };
                            }
                        }
                    }
                    let sc = &terms.sc[8 * h + 2 * F + kp / 2];
                    for (sum, isum) in sum.iter().zip(isum.iter_mut()) {
                        for hh in 0..2 {
                            let w = _mm256_madd_epi16(sum[hh], sc[hh]);
                            isum[hh] = _mm256_add_epi32(isum[hh], w);
                        }
                    }
                });
            }
        }
    }
}

impl Kquant for Q6K {
    const SUBS: usize = 16;
    type Terms = Terms6;
    const DIRECT_TOKENS: usize = 6;
    #[inline(always)]
    unsafe fn several<const N: usize>(
        blk: *const u8,
        y: [*const u8; N],
        terms: &Terms6,
        isum: &mut [[__m256i; 2]; N],
    ) {
        // SAFETY: the caller's contract is `k6_tokens`'.
        unsafe { k6_tokens::<N>(blk, y, terms, isum) }
    }
    /// In the layout's record order, which is address order (the hardware prefetchers follow
    /// it; sub-block after sub-block revisits each record four times): per half `h` and record
    /// `k` (`ql` chunks `k` and `8 + k`, `qh` chunk `k`), the codes of all four quarters `f`,
    /// sub-block `8h + 2f + k/4`; two records' pair sums added in i16, then widened by their
    /// sub-block's scale.
    #[inline(always)]
    unsafe fn one(blk: *const u8, y: *const u8, terms: &Terms6) -> [__m256i; 2] {
        // SAFETY: AVX2 (caller); the records (192 bytes at `q6k::ql(h, k)`: `ql` chunk k,
        // `ql` chunk 8 + k, `qh` chunk k) are the superblock's, value `128h + 32f + 4k..` of
        // `y` its codes.
        unsafe {
            let mut isum = [_mm256_setzero_si256(); 2];
            prefetch_ahead(blk, q6k::ql(0, 0), ONE_TOKEN_AHEAD);
            for h in 0..2 {
                for kp in 0..4 {
                    prefetch_ahead(blk.add(q6k::ql(h, 2 * kp)), 384, ONE_TOKEN_AHEAD);
                    let mut sum = [[_mm256_setzero_si256(); 2]; 4];
                    for k in [2 * kp, 2 * kp + 1] {
                        let rec = blk.add(q6k::ql(h, k));
                        let (a, b, qh) = (ld2(rec), ld2(rec.add(64)), ld2(rec.add(128)));
                        unroll!(F in [0 1 2 3] {
                            let at = 4 * (32 * h + 8 * F + k);
                            let yc = _mm256_set1_epi32(y.add(at).cast::<i32>().read_unaligned());
                            for hh in 0..2 {
                                let ql = if F.is_multiple_of(2) { a[hh] } else { b[hh] };
                                let code = q6_codes(ql, qh[hh], F);
                                let p = _mm256_maddubs_epi16(code, yc);
                                sum[F][hh] = if k.is_multiple_of(2) {
                                    p
                                } else {
                                    _mm256_add_epi16(sum[F][hh], p)
                                };
                            }
                        });
                    }
                    for (f, sum) in sum.iter().enumerate() {
                        let sc = &terms.sc[8 * h + 2 * f + kp / 2];
                        for hh in 0..2 {
                            let w = _mm256_madd_epi16(sum[hh], sc[hh]);
                            isum[hh] = _mm256_add_epi32(isum[hh], w);
                        }
                    }
                }
            }
            isum
        }
    }
    #[inline(always)]
    unsafe fn terms(blk: *const u8) -> Terms6 {
        // SAFETY: AVX2 and F16C (caller); d at 0..32 and the four scale planes at 32..288 of
        // the superblock.
        unsafe {
            let z = _mm256_setzero_si256();
            let mut t = Terms6 {
                d: f16x16(blk),
                dmin: [_mm256_setzero_ps(); 2],
                sc: [[z; 2]; 16],
                pairs: [[z; 2]; 8],
            };
            for p in 0..4 {
                for h in 0..2 {
                    // Plane p, rows 8h..8h+8: the int8 scales 4p..4p+4 of a row in its lane.
                    let x = _mm256_loadu_si256(blk.add(q6k::SCALES + 64 * p + 32 * h).cast());
                    for i in 0..4 {
                        // Byte i in the high byte of both i16 halves, then sign-extended.
                        let b = i as i8;
                        let hi = pick(x, [-1, b, -1, b]);
                        t.sc[4 * p + i][h] = _mm256_srai_epi16::<8>(hi);
                    }
                    t.pairs[2 * p][h] = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(x));
                    t.pairs[2 * p + 1][h] = _mm256_srai_epi16::<8>(x);
                }
            }
            t
        }
    }
}

/// `T` tokens' integer dots of the superblock at `blk` in [`Kquant::several`] passes of 4
/// tokens, the last pass what is left ([`Kquant::PASSES_OF_FOUR`]).
///
/// # Safety
/// As [`Kquant::several`] for each token's `y(t)`.
#[inline(always)]
unsafe fn passes<K: Kquant, const T: usize>(
    blk: *const u8,
    y: &impl Fn(usize) -> *const u8,
    terms: &K::Terms,
    isums: &mut [[__m256i; 2]; T],
) {
    /// One pass: tokens `t..t + N`.
    ///
    /// # Safety
    /// As [`Kquant::several`] for each token's `y(t)`.
    #[inline(always)]
    unsafe fn pass<K: Kquant, const N: usize>(
        blk: *const u8,
        y: &impl Fn(usize) -> *const u8,
        terms: &K::Terms,
        isums: &mut [[__m256i; 2]],
        t: usize,
    ) {
        let isums: &mut [[__m256i; 2]; N] = (&mut isums[t..t + N]).try_into().unwrap();
        // SAFETY: the caller's contract.
        unsafe { K::several::<N>(blk, std::array::from_fn(|u| y(t + u)), terms, isums) }
    }
    for t in (0..T).step_by(4) {
        // SAFETY: the caller's contract, pass by pass.
        unsafe {
            match T - t {
                1 => pass::<K, 1>(blk, y, terms, isums, t),
                2 => pass::<K, 2>(blk, y, terms, isums, t),
                3 => pass::<K, 3>(blk, y, terms, isums, t),
                _ => pass::<K, 4>(blk, y, terms, isums, t),
            }
        }
    }
}

/// The 16 row dots of the k-quant group at `group` (`nb` superblocks) with each of `T`
/// tokens: per superblock the reference's exact `isum = Σ sc·Σ q·y` (Q6_K: `Σ sc·Σ(q − 32)·y`)
/// and Q4_K's `summ = Σ m·Σ y`, then its float step `sum + ((d·dy)·isum − (dmin·dy)·summ)`
/// (Q6_K: `sum + (d·dy)·isum`).
///
/// # Safety
/// AVX2, FMA and F16C; `group` one whole group of `K` with `nb` superblocks; `rows` `T` Q8_K
/// rows of `nb` superblocks with their sub-block sums (and for Q4_K/Q5_K pair sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant_group<K: Kquant, const T: usize>(
    group: *const u8,
    nb: usize,
    rows: &TokenRows<'_, T>,
    buf: &mut Buffers,
) -> [[__m256; 2]; T] {
    let mut f = [[_mm256_setzero_ps(); 2]; T];
    let per = K::CHUNKS / K::SUBS;
    for b in 0..nb {
        // SAFETY: superblock b of the group and of every activation row are inside them
        // (caller); CPU features are this fn's.
        unsafe {
            let blk = group.add(K::GROUP_BLOCK * b);
            let terms = K::terms(blk);
            let direct = T <= K::DIRECT_TOKENS || K::PASSES_OF_FOUR;
            if !direct {
                // A superblock is 36-53 lines: prefetched in eighths, one per eighth decoded
                // (as the AVX-512 kernels found better than all at once).
                let part = K::GROUP_BLOCK / 8;
                for i in 0..8 {
                    prefetch_ahead(blk.add(part * i), part, SEVERAL_AHEAD);
                    decode_block_part::<K>(blk, &mut buf.chunks, i);
                }
            }
            let y = |t: usize| rows.ys[t].add(292 * b + 4);
            // The integer dots: one token and a few read their chunks on the spot (Q4_K: any
            // count, 4 a pass); more read the decoded superblock four or two tokens at a time
            // (each chunk's loads serve them all).
            let mut isums = [[_mm256_setzero_si256(); 2]; T];
            if T == 1 {
                isums[0] = K::one(blk, y(0), &terms);
            } else if T <= K::DIRECT_TOKENS {
                K::several::<T>(blk, std::array::from_fn(y), &terms, &mut isums);
            } else if direct {
                passes::<K, T>(blk, &y, &terms, &mut isums);
            } else {
                let src = Decoded { buf: &buf.chunks };
                let mut t = 0;
                while T.is_multiple_of(4) && t < T {
                    let mut quad = [isums[t], isums[t + 1], isums[t + 2], isums[t + 3]];
                    for (s, sc) in terms.sc().iter().enumerate() {
                        let at = s * per..(s + 1) * per;
                        quad = dots::<K, _, 4>(
                            &src,
                            at,
                            [y(t), y(t + 1), y(t + 2), y(t + 3)],
                            sc,
                            quad,
                        );
                    }
                    [isums[t], isums[t + 1], isums[t + 2], isums[t + 3]] = quad;
                    t += 4;
                }
                while t + 1 < T {
                    let mut pair = [isums[t], isums[t + 1]];
                    for (s, sc) in terms.sc().iter().enumerate() {
                        let at = s * per..(s + 1) * per;
                        pair = dots::<K, _, 2>(&src, at, [y(t), y(t + 1)], sc, pair);
                    }
                    [isums[t], isums[t + 1]] = pair;
                    t += 2;
                }
                if t < T {
                    for (s, sc) in terms.sc().iter().enumerate() {
                        let at = s * per..(s + 1) * per;
                        [isums[t]] = dots::<K, _, 1>(&src, at, [y(t)], sc, [isums[t]]);
                    }
                }
            }
            for (t, f) in f.iter_mut().enumerate() {
                let mut isum = isums[t];
                let mut summ = [_mm256_setzero_si256(); 2];
                if K::SUBS == 8 {
                    // Σ_s m_s · (bsum_2s + bsum_2s+1), exact: |pair| ≤ 32 · 128 fits i16.
                    let pairs = rows.min_pairs[t].get_unchecked(b);
                    for (s, &yp) in pairs.iter().enumerate() {
                        for (sm, m) in summ.iter_mut().zip(&terms.pairs()[s]) {
                            let p = _mm256_madd_epi16(*m, _mm256_set1_epi32(yp));
                            *sm = _mm256_add_epi32(*sm, p);
                        }
                    }
                } else {
                    // The codes' offset 32: `isum −= 32 · Σ sc_s · bsum_s`, exact
                    // (|Σ| ≤ 16 · 128 · 2048).
                    let bs = rows.bsums[t].get_unchecked(b);
                    let pack = |a: i32, b: i32| (a & 0xFFFF) | (b << 16);
                    let mut off = [_mm256_setzero_si256(); 2];
                    for p in 0..4 {
                        let even = _mm256_set1_epi32(pack(bs[4 * p], bs[4 * p + 2]));
                        let odd = _mm256_set1_epi32(pack(bs[4 * p + 1], bs[4 * p + 3]));
                        for (h, off) in off.iter_mut().enumerate() {
                            let e = _mm256_madd_epi16(terms.pairs()[2 * p][h], even);
                            let o = _mm256_madd_epi16(terms.pairs()[2 * p + 1][h], odd);
                            *off = _mm256_add_epi32(*off, _mm256_add_epi32(e, o));
                        }
                    }
                    for h in 0..2 {
                        isum[h] = _mm256_sub_epi32(isum[h], _mm256_slli_epi32::<5>(off[h]));
                    }
                }
                let dy = _mm256_set1_ps(*rows.dys[t].get_unchecked(b));
                for h in 0..2 {
                    let term =
                        _mm256_mul_ps(_mm256_mul_ps(terms.d()[h], dy), _mm256_cvtepi32_ps(isum[h]));
                    let v = if K::SUBS == 8 {
                        let m_term = _mm256_mul_ps(
                            _mm256_mul_ps(terms.dmin()[h], dy),
                            _mm256_cvtepi32_ps(summ[h]),
                        );
                        _mm256_sub_ps(term, m_term)
                    } else {
                        term
                    };
                    f[h] = _mm256_add_ps(f[h], v);
                }
            }
        }
    }
    f
}

/// Every group of `w` with tokens `t0..t0 + T` of `acts`, into `outs`.
///
/// # Safety
/// As [`run`], with `T` = `outs.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups<const TY: u8, const T: usize>(
    w: &[u8],
    group_bytes: usize,
    acts: &Activations<'_>,
    t0: usize,
    outs: &mut [&mut [f32]],
) {
    let nb = acts.blocks;
    let rows = acts.token_rows::<T>(t0);
    let zero = [_mm256_setzero_si256(); 2];
    let buffered = match TY {
        3 => T > Q4K::DIRECT_TOKENS,
        4 => T > Q6K::DIRECT_TOKENS,
        5 => T > Q5K::DIRECT_TOKENS,
        _ => false,
    };
    let mut buf = Buffers {
        chunks: if buffered { vec![zero; 64] } else { Vec::new() },
    };
    for (g, group) in w.chunks_exact(group_bytes).enumerate() {
        let p = group.as_ptr();
        let buf = &mut buf;
        // SAFETY: `group` is one whole group of `nb` blocks of the type `TY` names; `rows`
        // holds `T` activation rows of `nb` blocks with the terms the type reads (`run`);
        // CPU features are the caller's.
        let f = unsafe {
            match TY {
                0 => legacy_group::<Q8_0, T>(p, nb, &rows),
                1 => legacy_group::<Q4_0, T>(p, nb, &rows),
                2 => legacy_group::<Q5_0, T>(p, nb, &rows),
                3 => kquant_group::<Q4K, T>(p, nb, &rows, buf),
                5 => kquant_group::<Q5K, T>(p, nb, &rows, buf),
                6 => legacy_group::<Q4_1, T>(p, nb, &rows),
                7 => legacy_group::<Q5_1, T>(p, nb, &rows),
                _ => kquant_group::<Q6K, T>(p, nb, &rows, buf),
            }
        };
        for (o, f) in outs.iter_mut().zip(&f) {
            let o = &mut o[g * GROUP_ROWS..][..GROUP_ROWS];
            for (h, f) in f.iter().enumerate() {
                // SAFETY: `o` is 16 writable f32; lanes 8h..8h+8 of them.
                unsafe { _mm256_storeu_ps(o[8 * h..].as_mut_ptr(), *f) };
            }
        }
    }
}

/// The product of the rows16 groups `w` with activation rows `tokens` of `acts`, into `outs`
/// (one slice per token).
///
/// # Safety
/// AVX2, FMA and F16C; `w` whole groups of the activations' weight type and width; `tokens`
/// 1..=[`MAX_TOKENS`] of its rows, whose terms it holds ([`super::fast`] was true when they
/// were computed); `outs` one slice of at least `rows` values per row of `tokens`.
#[target_feature(enable = "avx2,fma,f16c")]
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
        3 | 5 => acts.bsums.len().min(acts.min_pairs.len()),
        4 => acts.bsums.len(),
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
        "rows16 AVX2 geometry"
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
