//! rows16 products on Intel's AMX tile unit: a block of 16 rows × up to 16 tokens in one
//! `tdpbssd`/`tdpbsud`, for the legacy types (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1) and for Q4_K and
//! Q5_K (each 32-value sub-block one tile product). Not Q6_K, whose VNNI kernel serves it: a
//! tile product per 16-value sub-block (depth 16, the `tile_step` below with a 16-byte A and a
//! 4-row B) was tried and measured slower (`decode_dram`, 16 tokens from cache, one thread,
//! 2048×5632: 1,606 µs against the VNNI kernel's 1,408; without its integer step, 1,330). Twice
//! Q4_K's tile products per superblock, each with its 1 KiB store, cost as much as the VNNI
//! kernel's whole `vpdpbusd` work, and the per-sub-block scale step (`vpmulld` per token) is the
//! same on both paths.
//!
//! What: the rows16 layout keeps, per 32 values, 8 chunks of 64 bytes, chunk `k` holding codes
//! `4k..4k+4` of row `r` at `4r`. That is exactly AMX's B operand for K = 32 (8 tile rows of
//! 16 columns × 4 bytes), so a block's Q8_0 codes are loaded into a tile straight from the
//! weight stream, and the nibbles of the others (with their fifth bits) are unpacked once into
//! 512-byte buffers for all the tokens. The A operand is the tokens' 32 activation codes of the
//! block, copied once per product into tile order (`Activations::tile_codes`); the product
//! tile is the block's exact integer dots, tokens × 16 rows. Those leave the tile unit through a
//! 1 KiB store and take the same integer and float steps as every other path (`(d·dy)·sumi`,
//! plus `m·(dy·Σy)` for Q4_1/Q5_1, summed in block order; for the k-quants `Σ sc·sumi`, then
//! the superblock's float step), so the results are bit-identical to the scalar reference, as
//! the tests check.
//!
//! Why: a batched decode step (issue 10: 4-16 sessions reading each weight once) and a prompt are
//! bound by the integer multiplies, and AVX-512's `vpdpbusd` spends one instruction per 4 codes ×
//! 16 rows × token: 8 per block and token. The tile unit does a block for 16 tokens in one
//! instruction at ~1,000 multiply-adds a cycle; what remains per block and token is the float step
//! (a conversion, two multiplies, an add), which the VNNI kernel pays as well. Where the design
//! comes from: Intel's AMX guide and llama.cpp's `ggml-cpu/amx` (which quantizes the activations to
//! the tile layout per product); here the repacked weights already are the tile layout. Cost: per
//! block, one tile store and one reload of the product per token, and but for Q8_0 the unpacking
//! into the buffer; the tile configuration is loaded once per call and the tile state released at
//! its end (`tilerelease`), so a thread keeps no AMX state between products. The tile instructions
//! run in order and do not forward stores, so each buffer is read a few blocks after it was written
//! (`LAG`, [`tile_step`]). Measured (BENCHMARKS.md, `decode_dram`, two threads): with 16 tokens
//! 1.45-1.75× the VNNI kernels' speed (Q8_0, Q4_0, Q5_0, Q4_K; Q5_K 1.2×), with 10-12 tokens
//! 1.2-1.5×, with 8 even, with 4 slower (the float step, not the multiplies, bounds a block then):
//! hence [`super::AMX_MIN_TOKENS`].
//!
//! Linux hands the tile registers to a process only on request (`arch_prctl
//! ARCH_REQ_XCOMP_PERM`, once, in [`available`]); where the CPU lacks AMX-INT8 or the kernel
//! refuses, [`available`] says no and the VNNI kernels run.

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::x86::{for_groups, prefetch_ahead};
use super::{Activations, GROUP_ROWS};
use crate::GgmlType;

/// Activation rows one pass takes: a tile's rows.
pub(super) const MAX_TOKENS: usize = 16;

/// Whether this process may run AMX-INT8 tile instructions: the CPU reports AMX-TILE and
/// AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25) and Linux granted the tile data state. Asked
/// once.
pub fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        if __cpuid(0).eax < 7 {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        tile && int8 && request_tile_data()
    })
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: asks Linux for the tile data state
/// (process-wide, from then on for every thread). Returns whether it was granted.
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain syscall with two integer arguments; it changes only which register
    // state the kernel saves for this process, and fails cleanly (EINVAL, ENOSPC) where it
    // cannot.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    ret == 0
}

/// A tile configuration (`ldtilecfg`'s 64-byte operand, palette 1) for `tokens` activation
/// rows: tmm0/tmm1 the products (tokens × 16 i32), tmm2/tmm3 the activations (tokens × 32
/// bytes), tmm4/tmm5 the weights (8 × 64 bytes); two of each, so that one block's tiles work
/// while the other's product is read.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const _: () = assert!(std::mem::size_of::<TileConfig>() == 64);

impl TileConfig {
    fn new(tokens: usize) -> TileConfig {
        assert!((1..=MAX_TOKENS).contains(&tokens));
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes = [
            (tokens, 64),
            (tokens, 64),
            (tokens, 32),
            (tokens, 32),
            (8, 64),
            (8, 64),
        ];
        for (tmm, (rows, bytes)) in shapes.into_iter().enumerate() {
            c[16 + 2 * tmm..18 + 2 * tmm].copy_from_slice(&(bytes as u16).to_le_bytes());
            c[48 + tmm] = rows as u8;
        }
        TileConfig(c)
    }
}

/// Blocks between a block's unpacking and its tiles, and between its tiles and its float step:
/// a tile load waits for the stores that wrote its bytes to reach the cache (no store
/// forwarding into tiles, nor out of them into vector loads), so each buffer is read
/// [`LAG`] blocks after it was written, not at once.
const LAG: usize = 2;
/// Buffers of each kind in flight: a power of two above [`LAG`].
const RING: usize = 4;
const _: () = assert!(RING > LAG && RING.is_power_of_two());

/// 64-byte aligned buffers of the blocks in flight: the unpacked weight codes (8 × 64 bytes)
/// and the products read back (16 × 16 i32).
#[repr(C, align(64))]
struct Scratch {
    codes: [[u8; 512]; RING],
    dots: [[i32; 256]; RING],
}

/// # Safety
/// [`available`] returned true; AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` whole groups of the
/// activations' weight type (a legacy rows16 type, Q4_K or Q5_K); `tokens` 1..=[`MAX_TOKENS`] of
/// its rows, whose terms and tile codes it holds; `outs` one slice of at least `rows` values per
/// row of `tokens`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn run(
    w: &[u8],
    acts: &Activations<'_>,
    tokens: Range<usize>,
    outs: &mut [&mut [f32]],
) {
    let ty = acts.ty;
    assert!((1..=MAX_TOKENS).contains(&tokens.len()));
    let config = TileConfig::new(tokens.len());
    // SAFETY: AMX was granted (caller); the configuration is a valid palette-1 one.
    unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
    if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) {
        macro_rules! dispatch {
            ($($t:literal)*) => {
                match (ty, tokens.len()) {
                    $(
                        (GgmlType::Q4K, $t) => kquant_groups::<false, $t>(w, acts, tokens.start, outs),
                        (_, $t) => kquant_groups::<true, $t>(w, acts, tokens.start, outs),
                    )*
                    _ => unreachable!("1..=16 activation rows"),
                }
            };
        }
        // SAFETY: CPU features and the geometry are as `kquant_groups` requires (caller);
        // the tiles are configured for `tokens.len()` rows.
        unsafe { dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16) }
    } else {
        let (bb, group_bytes) = super::legacy_group_geometry(acts, tokens.end);
        // SAFETY: CPU features and the geometry are as `groups` requires (caller, asserted);
        // the tiles are configured for `tokens.len()` rows.
        unsafe {
            legacy_groups!(
                groups,
                ty,
                tokens.len(),
                (w, group_bytes, bb, acts, tokens.start, outs)
            )
        }
    }
    // SAFETY: releases the tile state this call configured.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Every group of `w` with `T` activation rows (`t0..t0 + T` of `acts`).
///
/// # Safety
/// As [`run`], with the tiles configured for `T` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn groups<const TY: u8, const T: usize>(
    w: &[u8],
    group_bytes: usize,
    bb: usize,
    acts: &Activations<'_>,
    t0: usize,
    outs: &mut [&mut [f32]],
) {
    let nb = acts.blocks;
    // The window's tile codes (`Activations::tile_codes`): T rows × 32 bytes a block.
    assert!(t0.is_multiple_of(MAX_TOKENS) && acts.tile_codes.len() * 64 >= 32 * nb * (t0 + T));
    let ys = acts
        .tile_codes
        .as_ptr()
        .cast::<u8>()
        .wrapping_add(32 * nb * t0);
    assert!(acts.tile_terms.len() >= nb * (t0 + T));
    let terms = acts.tile_terms[nb * t0..].as_ptr();
    let mut scratch = Scratch {
        codes: [[0; 512]; RING],
        dots: [[0; 256]; RING],
    };
    for_groups(w, group_bytes, outs, |group, f| {
        // SAFETY: `group` is one whole group of this geometry (`for_groups`); `ys` addresses
        // the window's `nb` blocks of `T` rows × 32 codes (asserted), and the term pointers
        // `nb` values of each row; CPU features and the tile configuration
        // are the caller's.
        let dots = unsafe { blocks::<TY, T>(group, nb, bb, ys, terms, &mut scratch) };
        f.copy_from_slice(&dots);
    });
}

/// One block on tile set `S` (0 or 1): multiplies the activation codes at `a` (T rows of 32
/// bytes, one after another) with the weight codes at `b` (8 rows of 64 bytes), signed ×
/// signed (`SIGNED_B`, Q8_0) or signed × unsigned, into the set's product tile; then stores
/// the *other* set's product (the block before) to `before`. The tile unit runs its
/// instructions in order: storing a product right after its multiply would wait out the
/// multiply's latency before the next block's loads could start.
///
/// # Safety
/// The tiles configured as [`TileConfig`] with `T` rows; `a` readable for T rows of 32 bytes;
/// `b` 512 readable bytes; `before` 1 KiB writable.
#[inline(always)]
unsafe fn tile_step<const S: u8, const SIGNED_B: bool>(
    a: *const u8,
    b: *const u8,
    before: *mut i32,
) {
    macro_rules! step {
        ($c:literal, $a:literal, $b:literal, $other:literal, $op:literal) => {
            // SAFETY: as the function's contract.
            unsafe {
                asm!(
                    concat!("tilezero tmm", $c),
                    concat!("tileloadd tmm", $a, ", [{a} + {sa}*1]"),
                    concat!("tileloadd tmm", $b, ", [{b} + {sb}*1]"),
                    concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
                    concat!("tilestored [{c} + {sb}*1], tmm", $other),
                    a = in(reg) a,
                    sa = in(reg) 32usize,
                    b = in(reg) b,
                    sb = in(reg) 64usize,
                    c = in(reg) before,
                    options(nostack),
                )
            }
        };
    }
    match (S, SIGNED_B) {
        (0, true) => step!("0", "2", "4", "1", "tdpbssd"),
        (0, false) => step!("0", "2", "4", "1", "tdpbsud"),
        (_, true) => step!("1", "3", "5", "0", "tdpbssd"),
        (_, false) => step!("1", "3", "5", "0", "tdpbsud"),
    }
}

/// Stores tile set `S`'s product to `dots`.
///
/// # Safety
/// The tiles configured as [`TileConfig`]; `dots` 1 KiB writable.
#[inline(always)]
unsafe fn tile_store<const S: u8>(dots: *mut i32) {
    // SAFETY: as the function's contract.
    unsafe {
        if S == 0 {
            asm!("tilestored [{c} + {s}*1], tmm0", c = in(reg) dots, s = in(reg) 64usize, options(nostack));
        } else {
            asm!("tilestored [{c} + {s}*1], tmm1", c = in(reg) dots, s = in(reg) 64usize, options(nostack));
        }
    }
}

/// One group: `TY` 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = Q4_1, 4 = Q5_1; returns the 16 row dots with
/// each of the `T` activation rows (`ys`: their tile codes, block after block of `T` rows × 32
/// bytes; `terms`: their block terms in the same order, `Activations::tile_terms`). The same float
/// step, in the same order, as the VNNI kernel (`x86::blocks`). Pipelined: block `b`'s tiles run
/// beside block `b + LAG`'s unpacking, the store of block `b − 1`'s product and the float step of
/// block `b − 1 − LAG`.
///
/// # Safety
/// As [`groups`]; `group` is one whole group of `nb` blocks of `bb` bytes per row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn blocks<const TY: u8, const T: usize>(
    group: &[u8],
    nb: usize,
    bb: usize,
    ys: *const u8,
    terms: *const (f32, i32, f32),
    scratch: &mut Scratch,
) -> [__m512; T] {
    let mut f = [_mm512_setzero_ps(); T];
    let p = group.as_ptr();
    let min = TY >= 3;
    let block = |b: usize| {
        // SAFETY: block-group b < nb spans bytes [16·bb·b, 16·bb·(b+1)) of `group`.
        unsafe { p.add(GROUP_ROWS * bb * b) }
    };
    let codes = scratch.codes.as_mut_ptr().cast::<u8>();
    let dots = scratch.dots.as_mut_ptr().cast::<i32>();
    // Buffer `b % RING` of each kind: `wrapping_add` keeps the closures safe; the index
    // modulo RING keeps the pointers inside `scratch`.
    let dots_of = |b: usize| dots.wrapping_add(256 * (b % RING));
    let codes_of = |b: usize| codes.wrapping_add(512 * (b % RING));
    // Block b's float step, from its product in `dots_of(b)` (a macro, not a closure: a
    // closure's call kept the `T` sums in memory, doubling a block's time).
    macro_rules! float_step {
        ($b:expr) => {{
            let b: usize = $b;
            // SAFETY: block b < nb of the group and of every activation row's terms
            // (caller); its product was stored at least LAG blocks earlier.
            unsafe {
                let blk = block(b);
                let c = dots_of(b);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
                let terms = terms.add(T * b);
                for t in 0..T {
                    let (dy, sum, ms) = *terms.add(t);
                    let mut acc = _mm512_load_si512(c.add(16 * t).cast());
                    if TY != 0 {
                        // The codes' offset: the block's `−off·Σy`.
                        acc = _mm512_add_epi32(acc, _mm512_set1_epi32(sum));
                    }
                    let dy = _mm512_set1_ps(dy);
                    let mut prod = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, dy));
                    if min {
                        // The reference's `(d·dy)·sumi + m·(dy·Σy)`, then the sum.
                        let m = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast()));
                        let ms = _mm512_set1_ps(ms);
                        prod = _mm512_add_ps(prod, _mm512_mul_ps(m, ms));
                    }
                    f[t] = _mm512_add_ps(f[t], prod);
                }
            }
        }};
    }
    if TY != 0 {
        for b in 0..LAG.min(nb) {
            // SAFETY: block b is in `group`.
            unsafe { unpack::<TY>(block(b), codes_of(b)) };
        }
    }
    for b in 0..nb {
        // SAFETY: block b (and b + LAG when below nb) is inside `group` and inside every
        // activation row's tile codes (caller); `dots_of(b − 1)` is a 1 KiB buffer (for b = 0
        // the previous set's store lands in the last one, which the block that owns it
        // rewrites before its float step).
        unsafe {
            let blk = block(b);
            prefetch_ahead::<T>(blk, GROUP_ROWS * bb);
            let a = ys.add(32 * T * b);
            let before = dots_of(b + RING - 1);
            if TY == 0 {
                // Q8_0's codes are the B tile as they lie.
                if b % 2 == 0 {
                    tile_step::<0, true>(a, blk.add(32), before);
                } else {
                    tile_step::<1, true>(a, blk.add(32), before);
                }
            } else {
                if b + LAG < nb {
                    unpack::<TY>(block(b + LAG), codes_of(b + LAG));
                }
                if b % 2 == 0 {
                    tile_step::<0, false>(a, codes_of(b), before);
                } else {
                    tile_step::<1, false>(a, codes_of(b), before);
                }
            }
        }
        if b > LAG {
            float_step!(b - 1 - LAG);
        }
    }
    // SAFETY: the last block's product, to its buffer.
    unsafe {
        if (nb - 1).is_multiple_of(2) {
            tile_store::<0>(dots_of(nb - 1));
        } else {
            tile_store::<1>(dots_of(nb - 1));
        }
    }
    for b in nb.saturating_sub(LAG + 1)..nb {
        float_step!(b);
    }
    f
}

/// Unpacks one block-group's nibbles (and Q5_0/Q5_1's fifth bits) of layout `TY` (1..=4) at
/// `blk` into the B tile at `codes`: row `k` holds codes `4k..4k+4` of every weight row.
///
/// # Safety
/// AVX-512 F/BW; `blk` one whole block-group of the layout; `codes` 512 writable bytes,
/// 64-byte aligned.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack<const TY: u8>(blk: *const u8, codes: *mut u8) {
    let (min, five) = (TY >= 3, TY == 2 || TY == 4);
    let plane_at = if min { 64 } else { 32 };
    let codes_at = plane_at + if five { 64 } else { 0 };
    let low = _mm512_set1_epi8(0x0F);
    // SAFETY: the plane and the codes lie inside the block-group, the stores inside `codes`
    // (caller).
    unsafe {
        let qs = blk.add(codes_at);
        let plane = if five {
            _mm512_loadu_si512(blk.add(plane_at).cast())
        } else {
            _mm512_setzero_si512()
        };
        for k in 0..4 {
            let v = _mm512_loadu_si512(qs.add(64 * k).cast());
            let mut lo = _mm512_and_si512(v, low);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
            if five {
                // Bit k of the plane's bytes: the fifth bits of chunk k.
                let sixteen = _mm512_set1_epi8(0x10);
                let m = _mm512_test_epi8_mask(plane, _mm512_set1_epi8((1u8 << k) as i8));
                lo = _mm512_mask_add_epi8(lo, m, lo, sixteen);
                let m = _mm512_test_epi8_mask(plane, _mm512_set1_epi8((1u8 << (k + 4)) as i8));
                hi = _mm512_mask_add_epi8(hi, m, hi, sixteen);
            }
            _mm512_store_si512(codes.add(64 * k).cast(), lo);
            _mm512_store_si512(codes.add(64 * (k + 4)).cast(), hi);
        }
    }
}

/// Q4_K (`FIVE` false) and Q5_K: every group of `w` with `T` activation rows (`t0..t0 + T`
/// of `acts`). Per superblock, each of its 8 sub-blocks of 32 values is one tile product
/// (its codes unpacked into a B tile, a superblock ahead); then per row the scalar
/// reference's integers `isum = Σ sc·sumi` (`vpmulld`, exact) and `summ = Σ m·Σy`, and its
/// float step `sum + ((d·dy)·isum − (dmin·dy)·summ)`, as the VNNI kernel (`q4k::x86::k4`).
///
/// # Safety
/// As [`run`], for a Q4_K or Q5_K product, with the tiles configured for `T` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kquant_groups<const FIVE: bool, const T: usize>(
    w: &[u8],
    acts: &Activations<'_>,
    t0: usize,
    outs: &mut [&mut [f32]],
) {
    let nb = acts.blocks;
    assert!(t0.is_multiple_of(MAX_TOKENS) && acts.tile_codes.len() * 64 >= 256 * nb * (t0 + T));
    assert!(acts.dy.len() >= nb * (t0 + T) && acts.min_pairs.len() >= nb * (t0 + T));
    let ys = acts
        .tile_codes
        .as_ptr()
        .cast::<u8>()
        .wrapping_add(256 * nb * t0);
    let dys = &acts.dy[nb * t0..nb * (t0 + T)];
    let pairs = &acts.min_pairs[nb * t0..nb * (t0 + T)];
    let group_block = if FIVE {
        super::q5k::GROUP_BLOCK
    } else {
        super::q4k::GROUP_BLOCK
    };
    let mut scratch = KScratch {
        codes: [[[0; 512]; 8]; 2],
        dots: [[0; 256]; 16],
    };
    for_groups(w, nb * group_block, outs, |group, f| {
        // SAFETY: `group` is one whole group of `nb` superblocks (`for_groups`); `ys` holds
        // the window's `nb` superblocks of 8 sub-blocks × `T` rows × 32 codes and `dys`,
        // `pairs` their terms (asserted); CPU features and the tile configuration are the
        // caller's.
        let dots = unsafe {
            kquant_superblocks::<FIVE, T>(group, nb, group_block, ys, dys, pairs, &mut scratch)
        };
        f.copy_from_slice(&dots);
    });
}

/// The k-quant kernel's buffers: two superblocks of unpacked codes (8 sub-block B tiles
/// each) and the products of the last 16 sub-blocks.
#[repr(C, align(64))]
struct KScratch {
    codes: [[[u8; 512]; 8]; 2],
    dots: [[i32; 256]; 16],
}

/// Unpacks superblock-group `blk`'s codes (Q4_K, or Q5_K with its fifth bits) into 8 B tiles:
/// sub-block `2j` from the low nibbles of pair `j`, `2j + 1` from the high ones.
///
/// # Safety
/// AVX-512 F/BW; `blk` one whole superblock-group of the layout; `codes` 8 × 512 writable
/// bytes, 64-byte aligned.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_kquant<const FIVE: bool>(blk: *const u8, codes: *mut [u8; 512]) {
    let at = if FIVE { super::q5k::CODES } else { 256 };
    let low = _mm512_set1_epi8(0x0F);
    // SAFETY: the codes (and Q5_K's `qh` registers) lie inside the superblock-group, the
    // stores inside `codes` (caller).
    unsafe {
        for j in 0..4 {
            let (lo_tile, hi_tile) = (
                codes.add(2 * j).cast::<u8>(),
                codes.add(2 * j + 1).cast::<u8>(),
            );
            let qs = blk.add(at + 512 * j);
            for k in 0..8 {
                let v = _mm512_loadu_si512(qs.add(64 * k).cast());
                let mut lo = _mm512_and_si512(v, low);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                if FIVE {
                    // Bits 2j (low nibbles) and 2j + 1 (high) of `qh`: +16 where set.
                    let qh = _mm512_loadu_si512(blk.add(super::q5k::QH + 64 * k).cast());
                    let sixteen = _mm512_set1_epi8(0x10);
                    let (u1, u2) = ((1u8 << (2 * j)) as i8, (2u8 << (2 * j)) as i8);
                    let m1 = _mm512_test_epi8_mask(qh, _mm512_set1_epi8(u1));
                    let m2 = _mm512_test_epi8_mask(qh, _mm512_set1_epi8(u2));
                    lo = _mm512_mask_add_epi8(lo, m1, lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, m2, hi, sixteen);
                }
                _mm512_store_si512(lo_tile.add(64 * k).cast(), lo);
                _mm512_store_si512(hi_tile.add(64 * k).cast(), hi);
            }
        }
    }
}

/// One k-quant group (see [`kquant_groups`]): returns its 16 row dots with each of the `T`
/// activation rows. Superblock `b`'s 8 tile products run beside superblock `b + 1`'s unpacking
/// and superblock `b − 1`'s integer and float steps; each product is stored one sub-block
/// later (as [`tile_step`] says why).
///
/// # Safety
/// As [`kquant_groups`]; `group` one whole group of `nb` superblocks of `group_block` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kquant_superblocks<const FIVE: bool, const T: usize>(
    group: &[u8],
    nb: usize,
    group_block: usize,
    ys: *const u8,
    dys: &[f32],
    pairs: &[[i32; 4]],
    scratch: &mut KScratch,
) -> [__m512; T] {
    let mut f = [_mm512_setzero_ps(); T];
    let p = group.as_ptr();
    let block = |b: usize| p.wrapping_add(group_block * b);
    let codes = scratch.codes.as_mut_ptr();
    let dots = scratch.dots.as_mut_ptr().cast::<i32>();
    // Sub-block unit `u` (superblock u / 8, sub-block u % 8)'s product buffer.
    let dots_of = |u: usize| dots.wrapping_add(256 * (u % 16));
    // Superblock b's integer and float steps, from its 8 stored products.
    macro_rules! float_step {
        ($b:expr) => {{
            let b: usize = $b;
            // SAFETY: superblock b < nb of the group and of every row's terms (caller); its
            // products were stored at least 7 sub-blocks earlier.
            unsafe {
                let blk = block(b);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast()));
                let (sc, m_pairs): ([__m512i; 8], [__m512i; 4]) = q4k_scales_mins!(blk);
                for t in 0..T {
                    let mut isum = _mm512_setzero_si512();
                    for (s, sc) in sc.iter().enumerate() {
                        let c = _mm512_load_si512(dots_of(8 * b + s).add(16 * t).cast());
                        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(c, *sc));
                    }
                    // Σ m_s · (bsum_2s + bsum_2s+1), exact: |pair| ≤ 32 · 128 fits i16.
                    let mut summ = _mm512_setzero_si512();
                    for (mp, &yp) in m_pairs.iter().zip(pairs.get_unchecked(t * nb + b)) {
                        summ = _mm512_dpwssd_epi32(summ, *mp, _mm512_set1_epi32(yp));
                    }
                    let dy = _mm512_set1_ps(*dys.get_unchecked(t * nb + b));
                    let term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum));
                    let m_term = _mm512_mul_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(summ));
                    f[t] = _mm512_add_ps(f[t], _mm512_sub_ps(term, m_term));
                }
            }
        }};
    }
    // SAFETY: superblock 0 is in `group`; slot 0 is 8 tiles.
    unsafe { unpack_kquant::<FIVE>(block(0), codes.cast()) };
    for b in 0..nb {
        // SAFETY: superblocks b (and b + 1 when below nb) are inside `group`, and
        // superblock b of every activation row inside the window's tile codes (caller); the
        // buffers are indexed modulo their counts (for unit 0 the previous set's store lands
        // in buffer 15, which its own unit rewrites before its step reads it).
        unsafe {
            if b + 1 < nb {
                unpack_kquant::<FIVE>(block(b + 1), codes.add((b + 1) % 2).cast());
            }
            let part = group_block / 8;
            let tiles = codes.add(b % 2).cast::<[u8; 512]>();
            for s in 0..8 {
                let u = 8 * b + s;
                prefetch_ahead::<T>(block(b).add(part * s), part);
                let a = ys.add(32 * T * u);
                let wt = tiles.add(s).cast::<u8>();
                let before = dots_of(u + 15);
                if s % 2 == 0 {
                    tile_step::<0, false>(a, wt, before);
                } else {
                    tile_step::<1, false>(a, wt, before);
                }
            }
        }
        if b >= 1 {
            float_step!(b - 1);
        }
    }
    // SAFETY: the last sub-block's product (set 1: sub-block 7), to its buffer.
    unsafe { tile_store::<1>(dots_of(8 * nb - 1)) };
    float_step!(nb - 1);
    f
}
