//! The 16-row interleaved weight layout ("rows16") and its matrix products: weights repacked
//! once, at load, so that the multi-row kernels read one sequential stream and never
//! transpose at run time.
//!
//! What: a *group* is 16 consecutive rows of a weight matrix (`16 × row_bytes` bytes, the
//! same bytes the GGUF file holds, permuted in place: sizes and offsets do not change). Per
//! 32-value block `b`, the group stores the 16 rows' block `b` side by side:
//! - Q8_0 (34 bytes a block): 16 f16 scales (32 bytes), then 8 chunks of 64 bytes; chunk `k`
//!   holds codes `4k..4k+4` of row `r` at bytes `4r..4r+4`. 544 bytes.
//! - Q4_0 (18): 16 scales, then 4 chunks of 64 bytes of packed nibbles, chunk `k` holding
//!   `qs[4k..4k+4]` of row `r` at `4r`: the low nibbles are codes `4k..4k+4`, the high ones
//!   codes `16+4k..`. 288 bytes.
//! - Q5_0 (22): 16 scales, then a 64-byte plane of fifth bits (byte `4r+i` bit `k` = the
//!   fifth bit of code `4k+i` of row `r`: bit `k` of the plane lines up with chunk `k`, as
//!   Q5_K's `qh` registers), then the nibbles as Q4_0. 352 bytes.
//! - Q4_1 (20) and Q5_1 (24): Q4_0's and Q5_0's layouts with the 16 rows' f16 mins after the
//!   scales. 320 and 384 bytes.
//! - Q4_K, Q5_K and Q6_K, per 256-value superblock: the 16 rows' scales as 16-lane planes and
//!   their codes in 4-code × 16-row chunks (see the `q4k`, `q5k` and `q6k` modules). 2,304,
//!   2,816 and 3,360 bytes.
//!
//! A product then loads, per block, one register of 4 codes × 16 rows per chunk, multiplies
//! it with 4 broadcast activation codes (`vpdpbusd`) into 16 row lanes, and runs the block's
//! float step for 16 rows at once: no horizontal sums, no gathers. (K-quants: the integer
//! sub-block sums are scaled by the lanes' integer scales and summed per superblock, then the
//! superblock's float step runs once for 16 rows, as the scalar reference orders it.) Exactness as everywhere
//! here: the integer block dots are exact and the float steps are the scalar reference's
//! (`sum += sumi · (d·dy)` per block, in block order), so a repacked matrix gives results
//! bit-identical to `dot(Isa::Scalar, ..)` on the GGUF bytes, for any number of tokens.
//!
//! Where the design comes from: ik_llama.cpp's `_R4`/`_R8` row-interleaved types (`-rtr`), which
//! repack at load into a new type; here the type stays the file's and the permutation is a view the
//! kernels know, so every other path (dequantize, the reference `dot`) keeps working through
//! [`unpack_group`]. Cost: repacking reads and writes each byte once (done by the loader while the
//! bytes are in cache after the read); a product reads each weight byte once per 16 tokens: per 64
//! weight bytes and token one load and unpack shared by the tokens, a broadcast and a `vpdpbusd`,
//! plus the float step per block (speeds: BENCHMARKS.md, `decode_dram`). The activations' per-block
//! terms (scales as f32, offset sums, sub-block sums) are computed once per product
//! ([`Activations`]) and the kernels are compiled once per activation-row count 1..=16, so a
//! group's 16-lane row dots for every token stay in registers. The k-quant layouts are read in
//! address order. On AMD's cores one token of any type but Q5_K (whose fifth bits are read beside
//! its codes: `x86::prefetch_q5k_one`) is left to the hardware prefetchers (with
//! software prefetches, `prefetcht0` of every line 4 KiB ahead, it streamed Q4_K at 15-17 GB/s per
//! thread against 22-24 without; Q4_0 and Q5_0 `prefetcht1` 8 KiB ahead ran 12-14 % slower on Zen 4
//! than without); on Intel's it prefetches into L2 (1.2-1.55× faster there 8 KiB ahead, and
//! faster again 3 KiB ahead with each block's prefetches kept ahead of its loads:
//! `x86::is_intel`, `x86::ONE_TOKEN_AHEAD`, `x86::prefetch_ahead`); several tokens,
//! which work on each line longer, prefetch into L2 8 KiB ahead (`x86::prefetch_ahead`;
//! BENCHMARKS.md), the k-quant kernels on Intel's cores into L1, a line or two per chunk of codes
//! (`x86::prefetch_kquant_ahead`). (On AVX2, one token of every type prefetches, 2 KiB ahead:
//! `mod avx2`.) On Intel's cores 2 to 8 tokens' outputs leave with streaming stores where their
//! rows start on cache lines, as the engine's buffers do (`x86::for_groups`).
//! Kernels ([`fast`]): AVX-512 VNNI (`mod x86`), and for every type but Q6_K from
//! [`AMX_MIN_TOKENS`] activation rows on, Intel's AMX tiles (`mod amx`, where the CPU has
//! AMX-INT8 and Linux grants it), AVX2 with FMA and F16C (`mod avx2`: `vpmaddubsw` into i16, AMD
//! Zen 2/3 and older Intel) and NEON with the dot product (`sdot`, the Pi 5; `mod neon`,
//! unmeasured: no aarch64 hardware here); elsewhere (a Pi 4's NEON without `sdot`, SSE-only x86)
//! the loaders do not repack, and a repacked group is unpacked into a buffer and multiplied by
//! the GGUF-layout kernels.

use crate::{GgmlType, Isa, KernelError};

/// A Q4_K/Q5_K superblock-group's 6-bit sub-block scales as i32 lanes (one register per
/// sub-block) and its mins as i16 pairs (sub-blocks 2s, 2s + 1) for `vpdpwssd`, every row in its
/// lane, as `([__m512i; 8], [__m512i; 4])`: ggml's `get_scale_min_k4` on the layout's three
/// planes at `$blk` (a `*const u8` to one whole superblock-group; ggml's `scales[0..4]`: scales
/// 0..4 and the top bits of 4..8; `[4..8]`: mins 0..4 and the top bits of 4..8; `[8..12]`: the
/// low nibbles of scales and mins 4..8; sub-blocks 4..8 take their top two bits from bits 6-7 of
/// the bytes of sub-blocks 0..4). For the VNNI (`q4k::x86::k4`) and AMX kernels, inside code
/// with AVX-512 F/BW, inside an `unsafe` block whose safety argument covers reading the
/// superblock-group: a macro (a shared `#[inline]` function measured 7 % slower in the VNNI
/// kernel with 4 tokens, two alternations).
#[cfg(target_arch = "x86_64")]
macro_rules! q4k_scales_mins {
    ($blk:expr) => {{
        // The three 64-byte planes at 64..256 of the superblock-group.
        let sc03 = _mm512_loadu_si512($blk.add(64).cast());
        let m03 = _mm512_loadu_si512($blk.add(128).cast());
        let nib47 = _mm512_loadu_si512($blk.add(192).cast());
        let six = _mm512_set1_epi8(0x3F);
        let nib = _mm512_set1_epi8(0x0F);
        let top = _mm512_set1_epi8(0x30);
        let top_of = |x: __m512i| _mm512_and_si512(_mm512_srli_epi32::<2>(x), top);
        let sc_bytes = [
            _mm512_and_si512(sc03, six),
            _mm512_or_si512(_mm512_and_si512(nib47, nib), top_of(sc03)),
        ];
        let m_bytes = [
            _mm512_and_si512(m03, six),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(nib47), nib),
                top_of(m03),
            ),
        ];
        // Each dword's bytes `b` (indices into the dword; `-1`: a zero byte).
        let pick = |x: __m512i, b: [i8; 4]| {
            let control: [i8; 16] = std::array::from_fn(|i| {
                if b[i % 4] < 0 {
                    -1
                } else {
                    (i & !3) as i8 + b[i % 4]
                }
            });
            let control = _mm_loadu_si128(control.as_ptr().cast());
            _mm512_shuffle_epi8(x, _mm512_broadcast_i32x4(control))
        };
        let sc = std::array::from_fn(|s| pick(sc_bytes[s / 4], [(s % 4) as i8, -1, -1, -1]));
        let m_pairs = std::array::from_fn(|s| {
            let b = (2 * (s % 2)) as i8;
            pick(m_bytes[s / 2], [b, -1, b + 1, -1])
        });
        (sc, m_pairs)
    }};
}

/// A legacy type's block bytes and group bytes for the VNNI and AMX group kernels, after
/// checking that `acts` holds the terms of its first `tokens_end` rows.
#[cfg(target_arch = "x86_64")]
fn legacy_group_geometry(acts: &Activations<'_>, tokens_end: usize) -> (usize, usize) {
    let nb = acts.blocks;
    assert!(acts.dy.len() >= tokens_end * nb && acts.offset_sum.len() >= tokens_end * nb);
    let layout = geometry(acts.ty).expect("a legacy rows16 type");
    assert!(!layout.min || acts.min_sum.len() >= tokens_end * nb);
    (layout.block, GROUP_ROWS * nb * layout.block)
}

/// Calls `$groups::<TY, T>$args` for a legacy type `$ty` (`TY`: 0 = Q8_0, 1 = Q4_0, 2 = Q5_0,
/// 3 = Q4_1, 4 = Q5_1, the codes the VNNI and AMX group kernels take) and `$tokens` activation
/// rows (`T`, 1..=16): the one table from runtime type and count to their const generics.
#[cfg(target_arch = "x86_64")]
macro_rules! legacy_groups {
    ($groups:ident, $ty:expr, $tokens:expr, $args:tt) => {
        legacy_groups!(@rows $groups, $ty, $tokens, $args, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    };
    (@rows $groups:ident, $ty:expr, $tokens:expr, $args:tt, $($t:literal)*) => {
        match ($ty, $tokens) {
            $(
                (GgmlType::Q8_0, $t) => $groups::<0, $t> $args,
                (GgmlType::Q4_0, $t) => $groups::<1, $t> $args,
                (GgmlType::Q5_0, $t) => $groups::<2, $t> $args,
                (GgmlType::Q4_1, $t) => $groups::<3, $t> $args,
                (_, $t) => $groups::<4, $t> $args,
            )*
            _ => unreachable!("1..=16 activation rows"),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
pub(crate) use neon::legacy_tile_half;

/// Rows per group.
pub const GROUP_ROWS: usize = 16;

/// A legacy rows16 type's block: where its fields lie in a GGUF block and in a block-group
/// of the layout (the module documentation).
#[derive(Copy, Clone, Debug)]
struct Legacy {
    /// Bytes of one GGUF block (32 values).
    block: usize,
    /// Whether the block has a min `m` (Q4_1, Q5_1), after `d`.
    min: bool,
    /// Whether the block has fifth bits `qh` (Q5_0, Q5_1), after `d` (and `m`).
    five: bool,
}

impl Legacy {
    /// Bytes of codes in a GGUF block (at its end): 32 for Q8_0, 16 nibble pairs otherwise.
    const fn code_bytes(self) -> usize {
        if self.block == 34 { 32 } else { 16 }
    }

    /// In a block-group: the 16 `m` (after the 16 `d`), the fifth-bit plane, the codes.
    const fn mins_at(self) -> usize {
        32
    }
    const fn plane_at(self) -> usize {
        32 + if self.min { 32 } else { 0 }
    }
    const fn codes_at(self) -> usize {
        self.plane_at() + if self.five { 64 } else { 0 }
    }

    /// Where `qh` lies in a GGUF block.
    const fn qh_at(self) -> usize {
        if self.min { 4 } else { 2 }
    }

    /// Write GGUF row `r` (`row`: whole blocks) into the packed group `packed`.
    fn pack_row(self, packed: &mut [u8], r: usize, row: &[u8]) {
        let (bb, code_bytes) = (self.block, self.code_bytes());
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let dst = &mut packed[b * GROUP_ROWS * bb..(b + 1) * GROUP_ROWS * bb];
            dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
            if self.min {
                let at = self.mins_at() + 2 * r;
                dst[at..at + 2].copy_from_slice(&blk[2..4]);
            }
            for (k, four) in blk[bb - code_bytes..].chunks_exact(4).enumerate() {
                let at = self.codes_at() + 64 * k + 4 * r;
                dst[at..at + 4].copy_from_slice(four);
            }
            if self.five {
                // Byte 4r + i, bit k: the fifth bit of code 4k + i (bit 4k + i of `qh`).
                let qh = u32::from_le_bytes(blk[self.qh_at()..][..4].try_into().expect("4"));
                for i in 0..4 {
                    let plane = (0..8).fold(0u8, |byte, k| {
                        byte | ((((qh >> (4 * k + i)) & 1) as u8) << k)
                    });
                    dst[self.plane_at() + 4 * r + i] = plane;
                }
            }
        }
    }

    /// Read row `r` of the packed group `packed` back into GGUF blocks (`row`).
    fn unpack_row(self, packed: &[u8], r: usize, row: &mut [u8]) {
        let (bb, code_bytes) = (self.block, self.code_bytes());
        for (b, blk) in row.chunks_exact_mut(bb).enumerate() {
            let src = &packed[b * GROUP_ROWS * bb..(b + 1) * GROUP_ROWS * bb];
            blk[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
            if self.min {
                let at = self.mins_at() + 2 * r;
                blk[2..4].copy_from_slice(&src[at..at + 2]);
            }
            for k in 0..code_bytes / 4 {
                let at = self.codes_at() + 64 * k + 4 * r;
                let d = bb - code_bytes + 4 * k;
                blk[d..d + 4].copy_from_slice(&src[at..at + 4]);
            }
            if self.five {
                let mut qh = 0u32;
                for i in 0..4 {
                    let plane = src[self.plane_at() + 4 * r + i];
                    for k in 0..8 {
                        qh |= u32::from((plane >> k) & 1) << (4 * k + i);
                    }
                }
                let at = self.qh_at();
                blk[at..at + 4].copy_from_slice(&qh.to_le_bytes());
            }
        }
    }
}

/// The block of a legacy rows16 type.
fn geometry(ty: GgmlType) -> Option<Legacy> {
    let (block, min, five) = match ty {
        GgmlType::Q8_0 => (34, false, false),
        GgmlType::Q4_0 => (18, false, false),
        GgmlType::Q5_0 => (22, false, true),
        GgmlType::Q4_1 => (20, true, false),
        GgmlType::Q5_1 => (24, true, true),
        _ => return None,
    };
    Some(Legacy { block, min, five })
}

/// Row packers of every rows16 layout: (pack row `r` into a group, unpack it).
fn pack_rows(ty: GgmlType, packed: &mut [u8], r: usize, row: &[u8]) {
    match (geometry(ty), ty) {
        (Some(l), _) => l.pack_row(packed, r, row),
        (None, GgmlType::Q4K) => q4k::pack_row(packed, r, row),
        (None, GgmlType::Q5K) => q5k::pack_row(packed, r, row),
        (None, GgmlType::Q6K) => q6k::pack_row(packed, r, row),
        _ => unreachable!("{ty} has no rows16 layout"),
    }
}
fn unpack_rows(ty: GgmlType, packed: &[u8], r: usize, row: &mut [u8]) {
    match (geometry(ty), ty) {
        (Some(l), _) => l.unpack_row(packed, r, row),
        (None, GgmlType::Q4K) => q4k::unpack_row(packed, r, row),
        (None, GgmlType::Q5K) => q5k::unpack_row(packed, r, row),
        (None, GgmlType::Q6K) => q6k::unpack_row(packed, r, row),
        _ => unreachable!("{ty} has no rows16 layout"),
    }
}

/// The types with a rows16 layout.
pub const TYPES: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Whether `ty` has a rows16 layout.
pub fn has_layout(ty: GgmlType) -> bool {
    TYPES.contains(&ty)
}

/// Whether `ty` is one of the k-quants with a rows16 layout (256-value superblocks, Q8_K
/// activations).
fn is_kquant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
}

/// Whether `isa` multiplies rows16 groups of `ty` with its own kernels on this CPU (else they
/// are unpacked per call, which is correct but slower than the GGUF layout: a loader should
/// then not repack).
pub fn fast(isa: Isa, ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_layout(ty) && (crate::legacy::has_avx512_vnni(isa) || crate::legacy::has_avx2(isa))
    }
    #[cfg(target_arch = "aarch64")]
    {
        has_layout(ty) && crate::legacy::has_neon_dotprod(isa)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (isa, ty);
        false
    }
}

/// Checks that `bytes` holds whole groups of `ty` rows of `n` values: returns the bytes per
/// group.
fn check_groups(ty: GgmlType, n: usize, bytes: usize) -> Result<usize, KernelError> {
    if !has_layout(ty) {
        return Err(KernelError::UnsupportedType(ty));
    }
    let row_bytes = crate::check_row(ty, n)?;
    let group_bytes = GROUP_ROWS * row_bytes;
    if group_bytes == 0 || !bytes.is_multiple_of(group_bytes) {
        return Err(KernelError::LengthMismatch {
            what: "rows16 groups",
            expected: bytes.div_ceil(group_bytes.max(1)) * group_bytes,
            got: bytes,
        });
    }
    Ok(group_bytes)
}

/// Values per block of a rows16 type: 256 for the k-quants' superblocks, else 32.
fn block_values(ty: GgmlType) -> usize {
    if is_kquant(ty) { 256 } else { 32 }
}

/// Repack one group: `natural` is 16 GGUF rows of `ty` with `n` values each, `packed` the
/// same number of bytes in the rows16 layout.
pub fn repack_group(
    ty: GgmlType,
    n: usize,
    natural: &[u8],
    packed: &mut [u8],
) -> Result<(), KernelError> {
    let group_bytes = check_groups(ty, n, natural.len())?;
    crate::check_len("rows16 packed group", group_bytes, packed.len())?;
    if natural.len() != group_bytes {
        return Err(KernelError::LengthMismatch {
            what: "rows16 natural group",
            expected: group_bytes,
            got: natural.len(),
        });
    }
    let row_bytes = group_bytes / GROUP_ROWS;
    for (r, row) in natural.chunks_exact(row_bytes).enumerate() {
        pack_rows(ty, packed, r, row);
    }
    Ok(())
}

/// The inverse of [`repack_group`]: the 16 GGUF rows of a packed group.
pub fn unpack_group(
    ty: GgmlType,
    n: usize,
    packed: &[u8],
    natural: &mut [u8],
) -> Result<(), KernelError> {
    let group_bytes = check_groups(ty, n, packed.len())?;
    crate::check_len("rows16 natural group", group_bytes, natural.len())?;
    if packed.len() != group_bytes {
        return Err(KernelError::LengthMismatch {
            what: "rows16 packed group",
            expected: group_bytes,
            got: packed.len(),
        });
    }
    let row_bytes = group_bytes / GROUP_ROWS;
    for (r, row) in natural.chunks_exact_mut(row_bytes).enumerate() {
        unpack_rows(ty, packed, r, row);
    }
    Ok(())
}

/// Decode row `r` (of 16) of the packed group `packed` into `dst` (`n` values), as
/// [`crate::dequantize_row`] decodes the row in the file's layout.
pub fn dequantize_row(
    ty: GgmlType,
    n: usize,
    packed: &[u8],
    r: usize,
    dst: &mut [f32],
) -> Result<(), KernelError> {
    let group_bytes = check_groups(ty, n, packed.len())?;
    if packed.len() != group_bytes || r >= GROUP_ROWS {
        return Err(KernelError::LengthMismatch {
            what: "rows16 group row",
            expected: group_bytes,
            got: packed.len(),
        });
    }
    let mut row = vec![0u8; group_bytes / GROUP_ROWS];
    unpack_rows(ty, packed, r, &mut row);
    crate::dequantize_row(ty, &row, dst)
}

/// Activation rows of one product with a rows16 weight type, and the per-block terms its
/// kernels read: computed once per product and shared by every chunk of rows (and thread)
/// multiplied with them, rather than once per call.
///
/// The terms (only where [`fast`] says the kernels run): per row and block, the activation
/// scale as f32; for Q8_0/Q4_0/Q5_0 the weight offset times the sum of the block's codes
/// (`−off · Σ y`, exact in i32), for Q4_1/Q5_1 `dy · Σy` (the scalar reference's factor of
/// the min); for Q4_K/Q5_K/Q6_K the 16 sub-block sums and, for Q4_K/Q5_K, their
/// 32-value pairs packed as i16 for `vpdpwssd`. Cost: one pass over the activation rows.
pub struct Activations<'a> {
    ty: GgmlType,
    n: usize,
    /// Bytes of one activation row.
    row_bytes: usize,
    rows: &'a [u8],
    /// Blocks (or superblocks) per row.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    blocks: usize,
    dy: Vec<f32>,
    offset_sum: Vec<i32>,
    /// Q4_1/Q5_1: `dy · Σy` per block, the factor of the weights' min.
    min_sum: Vec<f32>,
    bsums: Vec<[i32; 16]>,
    min_pairs: Vec<[i32; 4]>,
    /// Q6_K only: `−32 · bsum` of each sub-block, the codes' offset 32 that the AVX-512
    /// kernel starts each chain from, broadcast from memory (from `bsums`, the compiler
    /// multiplied in a general register and broadcast from there: a vector uop each).
    /// `decode_dram` from cache, one thread, Q6_K 2048×5632, 4 tokens 479-488 → 446-472 µs;
    /// one token, and from DRAM, level.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    offsets: Vec<[i32; 16]>,
    /// Where products run on AMX tiles ([`tiles_serve`]): the activation codes as the tiles
    /// load them, per window of 16 rows (the last one shorter) and 32-value block (k-quants:
    /// sub-block), the window's rows' 32 codes one after another: window `t0 / 16` starts at
    /// byte `32 · nb · t0` (k-quants `256 · nb · t0`), its block `b` at `32 · b ·
    /// rows_in_window` after that. Aligned, so no tile row straddles a cache line.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    tile_codes: Vec<Line>,
    /// With `tile_codes`: the block terms in the same order (window, block, row): `dy`, the
    /// offset sums and (Q4_1/Q5_1) the min sums, so a block's terms for a window's rows are
    /// adjacent.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    tile_terms: Vec<(f32, i32, f32)>,
}

/// A cache line of bytes, 64-byte aligned.
#[derive(Copy, Clone)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl<'a> Activations<'a> {
    /// `acts`: whole activation rows (the weight type's activation type) of `n` values, for
    /// products with weights of type `ty`.
    pub fn new(
        isa: Isa,
        ty: GgmlType,
        n: usize,
        acts: &'a [u8],
    ) -> Result<Activations<'a>, KernelError> {
        Activations::with_tiles(isa, ty, n, acts, Tiles::Auto)
    }

    /// [`Activations::new`] with the AMX choice `tiles`: the tile codes and terms are prepared
    /// (and the products then run on tiles) only where `tiles` asks for them and
    /// [`tiles_serve`] allows, so a one-token product on an AMX host copies nothing.
    fn with_tiles(
        isa: Isa,
        ty: GgmlType,
        n: usize,
        acts: &'a [u8],
        tiles: Tiles,
    ) -> Result<Activations<'a>, KernelError> {
        if !has_layout(ty) {
            return Err(KernelError::UnsupportedType(ty));
        }
        crate::check_row(ty, n)?;
        let row_bytes = crate::act_type(ty)?.row_bytes(n);
        let tokens = acts.len() / row_bytes.max(1);
        crate::check_len("rows16 activations", tokens * row_bytes, acts.len())?;
        let kquant = is_kquant(ty);
        let blocks = n / block_values(ty);
        let on_tiles = tiles_serve(isa, ty)
            && match tiles {
                Tiles::Auto => tokens >= AMX_MIN_TOKENS,
                Tiles::Always => true,
                Tiles::Never => false,
            };
        let mut a = Activations {
            ty,
            n,
            row_bytes,
            rows: acts,
            blocks,
            dy: Vec::new(),
            offset_sum: Vec::new(),
            min_sum: Vec::new(),
            bsums: Vec::new(),
            min_pairs: Vec::new(),
            offsets: Vec::new(),
            tile_codes: Vec::new(),
            tile_terms: Vec::new(),
        };
        if !fast(isa, ty) {
            return Ok(a);
        }
        // Fixed-size blocks (`as_chunks`), so the sums below compile to vector code: this
        // pass runs on the calling thread before every product's pool job.
        if kquant {
            if on_tiles {
                // Unit u = 8b + s (superblock b, sub-block s) of window t0 (W rows): its rows'
                // 32 codes at 256·nb·t0 + 32·(W·u + t).
                a.tile_codes = vec![Line([0; 64]); tokens * a.blocks * 4];
                // SAFETY: `Line` is 64 plain bytes without padding.
                let dst: &mut [u8] = unsafe {
                    std::slice::from_raw_parts_mut(
                        a.tile_codes.as_mut_ptr().cast(),
                        a.tile_codes.len() * 64,
                    )
                };
                for t0 in (0..tokens).step_by(GROUP_ROWS) {
                    let window = (tokens - t0).min(GROUP_ROWS);
                    for t in 0..window {
                        let row = &acts[(t0 + t) * row_bytes..][..row_bytes];
                        for (b, y) in row.as_chunks::<292>().0.iter().enumerate() {
                            for s in 0..8 {
                                let at = 256 * a.blocks * t0 + 32 * (window * (8 * b + s) + t);
                                dst[at..at + 32].copy_from_slice(&y[4 + 32 * s..][..32]);
                            }
                        }
                    }
                }
            }
            let blocks = acts.as_chunks::<292>().0;
            a.dy.reserve_exact(blocks.len());
            a.bsums.reserve_exact(blocks.len());
            a.min_pairs.reserve_exact(blocks.len());
            for y in blocks {
                a.dy.push(f32::from_le_bytes([y[0], y[1], y[2], y[3]]));
                let bs: [i32; 16] = std::array::from_fn(|t| {
                    i32::from(i16::from_le_bytes([y[260 + 2 * t], y[261 + 2 * t]]))
                });
                a.bsums.push(bs);
                if ty == GgmlType::Q6K {
                    a.offsets.push(bs.map(|s| -32 * s));
                }
                // |pair| ≤ 32 · 128: an i16.
                a.min_pairs.push(std::array::from_fn(|s| {
                    let lo = bs[4 * s] + bs[4 * s + 1];
                    let hi = bs[4 * s + 2] + bs[4 * s + 3];
                    (lo & 0xFFFF) | (hi << 16)
                }));
            }
        } else {
            // The codes' offset (Q4_1/Q5_1 have none: their min term is `m · (dy·Σy)`).
            let off = match ty {
                GgmlType::Q8_0 => 128,
                GgmlType::Q4_0 => 8,
                GgmlType::Q5_0 => 16,
                _ => 0,
            };
            let min = geometry(ty).is_some_and(|l| l.min);
            let blocks = acts.as_chunks::<34>().0;
            a.dy.reserve_exact(blocks.len());
            a.offset_sum.reserve_exact(blocks.len());
            if min {
                a.min_sum.reserve_exact(blocks.len());
            }
            for b in blocks {
                let dy = crate::legacy::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                let codes: &[u8; 32] = b[2..].try_into().expect("34-byte Q8_0 block");
                let sum = crate::tiled::sum_i8(codes);
                a.dy.push(dy);
                a.offset_sum.push(-off * sum);
                if min {
                    a.min_sum.push(dy * sum as f32);
                }
            }
            if on_tiles {
                a.tile_codes = vec![Line([0; 64]); (tokens * a.blocks).div_ceil(2)];
                // SAFETY: `Line` is 64 plain bytes without padding.
                let dst: &mut [u8] = unsafe {
                    std::slice::from_raw_parts_mut(
                        a.tile_codes.as_mut_ptr().cast(),
                        a.tile_codes.len() * 64,
                    )
                };
                a.tile_terms = vec![(0.0, 0, 0.0); tokens * a.blocks];
                for t0 in (0..tokens).step_by(GROUP_ROWS) {
                    let window = (tokens - t0).min(GROUP_ROWS);
                    for t in 0..window {
                        let row = &acts[(t0 + t) * row_bytes..][..row_bytes];
                        for (b, blk) in row.as_chunks::<34>().0.iter().enumerate() {
                            let at = a.blocks * t0 + b * window + t;
                            dst[32 * at..32 * at + 32].copy_from_slice(&blk[2..]);
                            let from = (t0 + t) * a.blocks + b;
                            a.tile_terms[at] = (
                                a.dy[from],
                                a.offset_sum[from],
                                a.min_sum.get(from).copied().unwrap_or(0.0),
                            );
                        }
                    }
                }
            }
        }
        Ok(a)
    }

    /// Activation rows held.
    pub fn tokens(&self) -> usize {
        self.rows.len() / self.row_bytes.max(1)
    }

    /// Per-token views of rows `t0..t0 + T`, as the AVX2 and NEON kernels read them.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn token_rows<const T: usize>(&self, t0: usize) -> TokenRows<'_, T> {
        let nb = self.blocks;
        // Token t's `nb` terms of `v`, or none where the type has no such terms.
        fn of<X>(v: &[X], t: usize, nb: usize) -> &[X] {
            v.get(t * nb..(t + 1) * nb).unwrap_or(&[])
        }
        TokenRows {
            ys: std::array::from_fn(|t| self.rows[(t0 + t) * self.row_bytes..].as_ptr()),
            dys: std::array::from_fn(|t| &self.dy[(t0 + t) * nb..][..nb]),
            offs: std::array::from_fn(|t| of(&self.offset_sum, t0 + t, nb)),
            mins: std::array::from_fn(|t| of(&self.min_sum, t0 + t, nb)),
            bsums: std::array::from_fn(|t| of(&self.bsums, t0 + t, nb)),
            min_pairs: std::array::from_fn(|t| of(&self.min_pairs, t0 + t, nb)),
        }
    }
}

/// Per-token views of one product ([`Activations::token_rows`]): each token's activation row
/// and its per-block scales and integer terms (offset sums, mins, k-quant sub-block sums and
/// their pairs; empty where the type has none).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct TokenRows<'a, const T: usize> {
    ys: [*const u8; T],
    dys: [&'a [f32]; T],
    offs: [&'a [i32]; T],
    mins: [&'a [f32]; T],
    bsums: [&'a [[i32; 16]]; T],
    /// Read by the AVX2 kernels (NEON pairs the sub-block sums itself).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    min_pairs: [&'a [[i32; 4]]; T],
}

/// `out[t · out_stride + r] = row r · activation row t` for every row of the packed groups
/// `w` (rows16 layout of `ty`, `n` values a row) and every activation row in `acts` (in
/// `act_type(ty)`: Q8_0, or Q8_K for the k-quants). Bit-identical to `dot(Isa::Scalar, ..)`
/// on the unpacked rows.
pub fn matmul(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    matmul_with(
        isa,
        w,
        &Activations::new(isa, ty, n, acts)?,
        out,
        out_stride,
    )
}

/// [`matmul`] with activation rows prepared once ([`Activations`], whose weight type and
/// width `w` must have).
pub fn matmul_with(
    isa: Isa,
    w: &[u8],
    acts: &Activations<'_>,
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    let group_bytes = check_groups(acts.ty, acts.n, w.len())?;
    let tokens = acts.tokens();
    let rows = w.len() / group_bytes * GROUP_ROWS;
    if tokens == 0 || rows == 0 {
        return Ok(());
    }
    let needed = (tokens - 1) * out_stride + rows;
    if out.len() < needed || (tokens > 1 && out_stride < rows) {
        return Err(KernelError::LengthMismatch {
            what: "rows16 output",
            expected: needed,
            got: out.len(),
        });
    }
    let mut outs: Vec<&mut [f32]> = if tokens == 1 {
        vec![out]
    } else {
        out.chunks_mut(out_stride).take(tokens).collect()
    };
    matmul_rows(isa, w, acts, &mut outs)
}

/// Whether a product's activations are prepared for AMX tiles (x86-64 with AVX-512 VNNI and
/// AMX-INT8, the types [`tiles_serve`] names), so that it runs on them: from [`AMX_MIN_TOKENS`]
/// activation rows on (`Auto`), whatever the count (`Always`, for tests), or never.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Tiles {
    Auto,
    #[cfg_attr(not(test), allow(dead_code))]
    Always,
    #[cfg_attr(not(test), allow(dead_code))]
    Never,
}

/// The fewest activation rows a product runs on AMX tiles for: with 8 the tiles and the VNNI
/// kernels were even, with 10 the tiles 1.2-1.5× faster, with 4 slower (BENCHMARKS.md).
pub const AMX_MIN_TOKENS: usize = 9;

/// Whether this process runs rows16 products on AMX tiles for [`AMX_MIN_TOKENS`] activation
/// rows or more with `isa` (the CPU has AMX-INT8 and Linux granted it), for the types
/// [`tiles_serve`] names.
pub fn uses_amx(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::legacy::has_avx512_vnni(isa) && amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether products of `ty` run on AMX tiles with `isa` here, for any number of activation
/// rows from [`AMX_MIN_TOKENS`] on (every rows16 type but Q6_K): then a long input (a prompt)
/// is best multiplied 16 rows at a time by [`matmul_rows`] rather than by the tiled kernels.
pub fn tiles_serve(isa: Isa, ty: GgmlType) -> bool {
    fast(isa, ty) && ty != GgmlType::Q6K && uses_amx(isa)
}

/// [`matmul_with`] into one output slice per activation row (`outs[t][r]` = row r · activation
/// row t; each slice at least as long as `w` has rows): rows of disjoint output ranges, as a
/// row-chunked product over threads writes them, need no staging copy.
pub fn matmul_rows(
    isa: Isa,
    w: &[u8],
    acts: &Activations<'_>,
    outs: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    let (ty, n) = (acts.ty, acts.n);
    let group_bytes = check_groups(ty, n, w.len())?;
    let tokens = acts.tokens();
    let rows = w.len() / group_bytes * GROUP_ROWS;
    if tokens == 0 || rows == 0 {
        return Ok(());
    }
    if outs.len() != tokens || outs.iter().any(|o| o.len() < rows) {
        return Err(KernelError::LengthMismatch {
            what: "rows16 output rows",
            expected: tokens * rows,
            got: outs.iter().map(|o| o.len().min(rows)).sum(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if fast(isa, ty) && !crate::legacy::has_avx512_vnni(isa) {
        assert_eq!(acts.dy.len(), tokens * acts.blocks, "terms of a fast ISA");
        for t0 in (0..tokens).step_by(avx2::MAX_TOKENS) {
            let t1 = (t0 + avx2::MAX_TOKENS).min(tokens);
            // SAFETY: `fast` checked AVX2, FMA and F16C; the geometry is checked above (whole
            // groups, whole activation rows, an output row of at least `rows` values per
            // activation row) and the terms cover every row (asserted).
            unsafe { avx2::run(w, acts, t0..t1, &mut outs[t0..t1]) };
        }
        return Ok(());
    }
    // The tiles run where the activations were prepared for them (`Activations::with_tiles`).
    #[cfg(target_arch = "x86_64")]
    if !acts.tile_codes.is_empty() && tiles_serve(isa, ty) {
        assert_eq!(acts.dy.len(), tokens * acts.blocks, "terms of a fast ISA");
        for t0 in (0..tokens).step_by(amx::MAX_TOKENS) {
            let t1 = (t0 + amx::MAX_TOKENS).min(tokens);
            // SAFETY: `uses_amx` checked AVX-512 VNNI (+ AVX2/FMA/F16C) and that AMX was
            // granted; the geometry is checked above (whole groups of a legacy type, whole
            // activation rows, an output row of at least `rows` values per activation row)
            // and the terms cover every row (asserted).
            unsafe { amx::run(w, acts, t0..t1, &mut outs[t0..t1]) };
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if fast(isa, ty) {
        assert_eq!(acts.dy.len(), tokens * acts.blocks, "terms of a fast ISA");
        for t0 in (0..tokens).step_by(x86::MAX_TOKENS) {
            let t1 = (t0 + x86::MAX_TOKENS).min(tokens);
            let outs = &mut outs[t0..t1];
            // SAFETY: `fast` checked AVX-512 F/BW/VL/VNNI (+ AVX2/FMA/F16C); the geometry is
            // checked above (whole groups, whole activation rows, an output row of at least
            // `rows` values per activation row) and the terms cover every row (asserted).
            unsafe {
                if ty == GgmlType::Q4K && x86::is_intel() {
                    x86::run_kquant::<q4k::x86::K4<false, true>>(w, acts, t0..t1, outs);
                } else if ty == GgmlType::Q4K {
                    x86::run_kquant::<q4k::x86::K4<false, false>>(w, acts, t0..t1, outs);
                } else if ty == GgmlType::Q5K {
                    x86::run_kquant::<q4k::x86::K4<true, false>>(w, acts, t0..t1, outs);
                } else if ty == GgmlType::Q6K {
                    x86::run_kquant::<q6k::x86::Kernel>(w, acts, t0..t1, outs);
                } else {
                    x86::run(w, acts, t0..t1, outs);
                }
            }
        }
        return Ok(());
    }
    #[cfg(target_arch = "aarch64")]
    if fast(isa, ty) {
        assert_eq!(acts.dy.len(), tokens * acts.blocks, "terms of a fast ISA");
        for t0 in (0..tokens).step_by(neon::MAX_TOKENS) {
            let t1 = (t0 + neon::MAX_TOKENS).min(tokens);
            // SAFETY: `fast` checked NEON and the dot-product extension; the geometry is
            // checked above (whole groups, whole activation rows, an output row of at least
            // `rows` values per activation row) and the terms cover every row (asserted).
            unsafe { neon::run(w, acts, t0..t1, &mut outs[t0..t1]) };
        }
        return Ok(());
    }
    // Elsewhere: unpack each group and run the GGUF-layout kernels of `isa`.
    let row_bytes = group_bytes / GROUP_ROWS;
    let mut natural = vec![0u8; group_bytes];
    let mut tile = vec![0f32; tokens * GROUP_ROWS];
    for (g, packed) in w.chunks_exact(group_bytes).enumerate() {
        unpack_group(ty, n, packed, &mut natural)?;
        debug_assert_eq!(natural.len(), GROUP_ROWS * row_bytes);
        crate::matmul(isa, ty, n, &natural, acts.rows, &mut tile, GROUP_ROWS)?;
        for (o, t) in outs.iter_mut().zip(tile.chunks_exact(GROUP_ROWS)) {
            o[g * GROUP_ROWS..(g + 1) * GROUP_ROWS].copy_from_slice(t);
        }
    }
    Ok(())
}

/// Q4_K in the rows16 layout. Per superblock of 256 values, the 16 rows' 144-byte blocks
/// become 2,304 bytes: the 16 `d` (f16, bytes 0..32), the 16 `dmin` (32..64); the 12 bytes
/// of 6-bit sub-block scales and mins of each row `r` as ggml packs them (`scales[0..4]`,
/// `[4..8]`, `[8..12]`), one u32 at `4r` of each of three 64-byte planes (64..256), so one
/// load gives every row's bytes in its lane and byte operations unpack all 16 rows at once;
/// then the codes (256..2304): for sub-block pair `j` and chunk `k`,
/// 64 bytes holding `qs[32j + 4k ..][..4]` of row `r` at `4r` (low nibbles: codes `4k..4k+4`
/// of sub-block `2j`; high: of `2j + 1`).
pub(crate) mod q4k {
    use super::GROUP_ROWS;

    /// Bytes of one superblock of one row, and of a group.
    pub(crate) const BLOCK: usize = 144;
    pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;

    /// Where, in a superblock-group, the 16 rows' 4-byte pieces at GGUF offset `x` of their
    /// superblock lie side by side (a 64-byte register, row r at `4r`): the scale bytes
    /// (`x` in 4..16) and the codes (16..144); `None` for `d`/`dmin` (0..4), which
    /// [`halves`] places.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn register(x: usize) -> Option<usize> {
        match x {
            4..16 => Some(64 + 64 * ((x - 4) / 4)),
            16..BLOCK => Some(256 + 512 * ((x - 16) / 32) + 64 * ((x - 16) % 32 / 4)),
            _ => None,
        }
    }

    /// Where the 16 rows' f16 at GGUF offset `x` (0: `d`, 2: `dmin`) lie side by side.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn halves(x: usize) -> usize {
        16 * x
    }

    /// Write GGUF row `r` (`row`: whole Q4_K blocks) into the packed group `packed`.
    pub(super) fn pack_row(packed: &mut [u8], r: usize, row: &[u8]) {
        for (b, x) in row.chunks_exact(BLOCK).enumerate() {
            let dst = &mut packed[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            dst[2 * r..2 * r + 2].copy_from_slice(&x[0..2]);
            dst[32 + 2 * r..34 + 2 * r].copy_from_slice(&x[2..4]);
            for p in 0..3 {
                let at = 64 + 64 * p + 4 * r;
                dst[at..at + 4].copy_from_slice(&x[4 + 4 * p..8 + 4 * p]);
            }
            for j in 0..4 {
                for k in 0..8 {
                    let at = 256 + 512 * j + 64 * k + 4 * r;
                    let q = 16 + 32 * j + 4 * k;
                    dst[at..at + 4].copy_from_slice(&x[q..q + 4]);
                }
            }
        }
    }

    /// Read row `r` of the packed group `packed` back into GGUF blocks (`row`).
    pub(super) fn unpack_row(packed: &[u8], r: usize, row: &mut [u8]) {
        for (b, x) in row.chunks_exact_mut(BLOCK).enumerate() {
            let src = &packed[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            x[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
            x[2..4].copy_from_slice(&src[32 + 2 * r..34 + 2 * r]);
            for p in 0..3 {
                let at = 64 + 64 * p + 4 * r;
                x[4 + 4 * p..8 + 4 * p].copy_from_slice(&src[at..at + 4]);
            }
            for j in 0..4 {
                for k in 0..8 {
                    let at = 256 + 512 * j + 64 * k + 4 * r;
                    let q = 16 + 32 * j + 4 * k;
                    x[q..q + 4].copy_from_slice(&src[at..at + 4]);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod x86 {
        use std::arch::x86_64::*;

        use super::GROUP_BLOCK;
        use crate::rows16::x86::{KquantGroup, Q8kAct};

        /// The Q4_K (`FIVE` false) and Q5_K kernel for [`crate::rows16::x86::run_kquant`];
        /// `DPWSSD`: Q4_K's sub-block scales applied with `vpdpwssd` (`k4`).
        pub(in super::super) struct K4<const FIVE: bool, const DPWSSD: bool>;

        impl<const FIVE: bool, const DPWSSD: bool> KquantGroup for K4<FIVE, DPWSSD> {
            const GROUP_BLOCK: usize = if FIVE {
                crate::rows16::q5k::GROUP_BLOCK
            } else {
                GROUP_BLOCK
            };

            unsafe fn superblocks<const T: usize>(
                group: &[u8],
                nb: usize,
                acts: &[Q8kAct<'_>],
            ) -> [__m512; T] {
                // SAFETY: the trait method's contract is `k4`'s.
                unsafe { k4::<T, FIVE, DPWSSD>(group, nb, acts) }
            }
        }

        /// The Q4_K (`FIVE` false) and Q5_K (`FIVE`: the fifth bits of the q5k layout's
        /// `qh` registers added to the nibbles) group kernel; `f[t]` the 16 row dots with
        /// activation row `t`. Per superblock, the scalar reference's integers
        /// `isum = Σ sc·sumi` and `summ = Σ m·Σy` (exact), then its float step
        /// `sum + ((d·dy)·isum − (dmin·dy)·summ)`.
        ///
        /// The kernel prefetches (`prefetch_kquant_ahead`; one token only on Intel's cores, but
        /// Q5_K on AMD's too: `prefetch_q5k_one`) a thirty-second of the superblock per 64-byte
        /// chunk of codes it loads, not a quarter per quarter: `decode_dram`, one token, two
        /// threads from DRAM, three passes, 214-219 → 206-208 µs (Q4_K 5632×2048; the stream
        /// over the same bytes 205), 77-79 → 72-75
        /// (Q4_K 896×4864; stream 74), 274-279 → 246-254 (Q5_K 5632×2048; stream 243), an
        /// eighth or a sixteenth per part in between; several tokens (into L2), two passes,
        /// Q4_K 5632×2048 2 tokens 261 → 202-212, 4 tokens 266 → 219-233, 8 tokens 370-374 →
        /// 308-317, 896×4864 4 tokens 102 → 80.
        ///
        /// # Safety
        /// As [`crate::rows16::x86::run_kquant`]; `group` one whole group of `nb` superblocks
        /// of the layout (`q4k`, or `q5k` when `FIVE`).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(in super::super) unsafe fn k4<const T: usize, const FIVE: bool, const DPWSSD: bool>(
            group: &[u8],
            nb: usize,
            acts: &[Q8kAct<'_>],
        ) -> [__m512; T] {
            // Bytes of a superblock-group, and where its codes start (after the scales, and
            // for Q5_K the `qh` registers).
            let (group_block, codes) = if FIVE {
                (crate::rows16::q5k::GROUP_BLOCK, crate::rows16::q5k::CODES)
            } else {
                (GROUP_BLOCK, 256)
            };
            let mut f = [_mm512_setzero_ps(); T];
            let acts: &[Q8kAct<'_>; T] = acts.try_into().expect("T activation rows");
            let low = _mm512_set1_epi8(0x0F);
            let p = group.as_ptr();
            for b in 0..nb {
                // SAFETY: superblock b of the group spans [group_block·b, group_block·(b+1))
                // of `group` (caller).
                unsafe {
                    let blk = p.add(group_block * b);
                    let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
                    let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast()));
                    // The 6-bit scales and mins of every row, in its lane.
                    let (sc, m_pairs): ([__m512i; 8], [__m512i; 4]) = q4k_scales_mins!(blk);
                    let mut isum = [_mm512_setzero_si512(); T];
                    for j in 0..4 {
                        // An eighth of the quarter per chunk `k` worked on (`k4`'s docs).
                        let part = group_block / 4;
                        let qs = blk.add(codes + 512 * j);
                        macro_rules! y_of {
                            ($t:expr) => {
                                acts.get_unchecked($t)
                                    .blocks
                                    .get_unchecked(b)
                                    .as_ptr()
                                    .add(4 + 64 * j)
                                    .cast::<i32>()
                            };
                        }
                        // The scales as i32 (the i16 pair (sc, 0) read as one lane).
                        let (sc_lo, sc_hi) = (sc[2 * j], sc[2 * j + 1]);
                        // A token's four chains `[a, b, c, d]` (sub-block 2j's chunks k even
                        // and odd, then 2j + 1's) scaled into its `isum`: a sub-block's two
                        // chains added and scaled with `vpmulld`, exact in i32 (|Σ q·y| ≤
                        // 32·31·128); or, with `DPWSSD` (Q4_K on Intel's cores), each chain
                        // scaled by `vpdpwssd` against the (sc, 0) pair, exact because Q4_K's
                        // chains of 16 values stay in i16 (|Σ q·y| ≤ 16·15·128; Q5_K's,
                        // 16·31·128, do not). On AMD's Zen 4 `vpmulld` runs beside the
                        // `vpdpbusd` ports and `vpdpwssd` takes their slots (a microbenchmark
                        // of 32 `vpdpbusd` with 8 `vpdpwssd` ran 180-183 G MAC/s, with 4
                        // `vpaddd` + 2 `vpmulld` + 2 `vpaddd` 197-206). On the Intel Xeon with
                        // AMX every 512-bit integer instruction shares two ports, `vpmulld`
                        // is two uops and `vpdpwssd` one (a loop of 16 `vpdpbusd` with 4
                        // `vpmulld` took 13.1 cycles, with 8 `vpdpwssd` 13.1, alone 8.5), so
                        // four `vpdpwssd` take the place of 4 adds and 2 multiplies (8 uops):
                        // `decode_dram` from cache (ring 1 MiB), one thread, Q4_K 5632×2048,
                        // µs, three alternations: 4 tokens 324-332 → 303-315, 8 tokens 591-596
                        // → 526-580 (one token, back to back: 201 → 200).
                        macro_rules! apply {
                            ($is:expr, $s:expr) => {{
                                let [a, b, c, d] = $s;
                                if FIVE || !DPWSSD {
                                    let lo = _mm512_mullo_epi32(_mm512_add_epi32(a, b), sc_lo);
                                    let hi = _mm512_mullo_epi32(_mm512_add_epi32(c, d), sc_hi);
                                    _mm512_add_epi32($is, _mm512_add_epi32(lo, hi))
                                } else {
                                    let x = crate::rows16::x86::dpwssd_held($is, a, sc_lo);
                                    let x = crate::rows16::x86::dpwssd_held(x, c, sc_hi);
                                    let x = crate::rows16::x86::dpwssd_held(x, b, sc_lo);
                                    crate::rows16::x86::dpwssd_held(x, d, sc_hi)
                                }
                            }};
                        }
                        // Chunk `k`'s codes of the pair (sub-block 2j, 2j + 1), each loaded
                        // after its prefetch.
                        let mut lo = [_mm512_setzero_si512(); 8];
                        let mut hi4 = [_mm512_setzero_si512(); 8];
                        for k in 0..8 {
                            let at = blk.add(part * j + part / 8 * k);
                            if FIVE && T == 1 {
                                crate::rows16::x86::prefetch_q5k_one(at, part / 8);
                            } else {
                                crate::rows16::x86::prefetch_kquant_ahead::<T>(at, part / 8);
                            }
                            let v = _mm512_loadu_si512(qs.add(64 * k).cast());
                            lo[k] = _mm512_and_si512(v, low);
                            hi4[k] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                            if FIVE {
                                // Bits 2j (low nibbles) and 2j + 1 (high) of `qh` are the
                                // codes' fifth bits: +16 where set.
                                let qh = _mm512_loadu_si512(
                                    blk.add(crate::rows16::q5k::QH + 64 * k).cast(),
                                );
                                let sixteen = _mm512_set1_epi8(0x10);
                                let (u1, u2) = (1i8 << (2 * j), (2u8 << (2 * j)) as i8);
                                let m1 = _mm512_test_epi8_mask(qh, _mm512_set1_epi8(u1));
                                let m2 = _mm512_test_epi8_mask(qh, _mm512_set1_epi8(u2));
                                lo[k] = _mm512_mask_add_epi8(lo[k], m1, lo[k], sixteen);
                                hi4[k] = _mm512_mask_add_epi8(hi4[k], m2, hi4[k], sixteen);
                            }
                        }
                        // Tokens in pairs: eight independent `vpdpbusd` chains in flight
                        // (four per token, each four deep: its 5-cycle latency hidden), so
                        // the two ports that run them stay busy; an odd last token alone.
                        // (One pass over the codes for up to four tokens at once, sixteen
                        // chains, ran slower: `decode_dram` from cache, one thread, 4 tokens
                        // 279 → 308 µs, 2 tokens 206 → 246.)
                        // (Macros, not closures: a closure's body does not inherit the
                        // function's target features, and its intrinsics become calls.)
                        // The four chains of each of the `$n` tokens of `$ys` (activation
                        // codes at sub-block pair j): sub-block 2j's chunks k even and odd,
                        // then 2j + 1's; the tokens' `vpdpbusd` interleaved.
                        macro_rules! chains {
                            ($n:literal, $ys:expr) => {{
                                let ys: [*const i32; $n] = $ys;
                                let mut s = [[_mm512_setzero_si512(); 4]; $n];
                                for k in 0..8 {
                                    for (y, s) in ys.iter().zip(s.iter_mut()) {
                                        let lo_y = _mm512_set1_epi32(y.add(k).read_unaligned());
                                        s[k % 2] = _mm512_dpbusd_epi32(s[k % 2], lo[k], lo_y);
                                    }
                                    for (y, s) in ys.iter().zip(s.iter_mut()) {
                                        let hi_y = _mm512_set1_epi32(y.add(8 + k).read_unaligned());
                                        s[2 + k % 2] =
                                            _mm512_dpbusd_epi32(s[2 + k % 2], hi4[k], hi_y);
                                    }
                                }
                                s
                            }};
                        }
                        for t in (0..T - T % 2).step_by(2) {
                            let [s0, s1] = chains!(2, [y_of!(t), y_of!(t + 1)]);
                            isum[t] = apply!(isum[t], s0);
                            isum[t + 1] = apply!(isum[t + 1], s1);
                        }
                        if T % 2 == 1 {
                            let [s] = chains!(1, [y_of!(T - 1)]);
                            isum[T - 1] = apply!(isum[T - 1], s);
                        }
                    }
                    for ((a, is), ft) in acts.iter().zip(isum.iter()).zip(f.iter_mut()) {
                        // Σ m_s · (bsum_2s + bsum_2s+1), exact: |pair| ≤ 32 · 128 fits i16.
                        let pairs = a.min_pairs.get_unchecked(b);
                        let mut summ = _mm512_setzero_si512();
                        for (mp, &yp) in m_pairs.iter().zip(pairs) {
                            summ = _mm512_dpwssd_epi32(summ, *mp, _mm512_set1_epi32(yp));
                        }
                        let dy = _mm512_set1_ps(*a.dy.get_unchecked(b));
                        let term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(*is));
                        let m_term =
                            _mm512_mul_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(summ));
                        *ft = _mm512_add_ps(*ft, _mm512_sub_ps(term, m_term));
                    }
                }
            }
            f
        }
    }
}

/// Q5_K in the rows16 layout: Q4_K's with the fifth bits. Per superblock of 256 values, the
/// 16 rows' 176-byte blocks become 2,816 bytes: `d`, `dmin` and the three scale planes as in
/// [`q4k`] (0..256); then `qh` (256..768) as 8 registers, register `k` holding
/// `qh[4k..4k + 4]` of row `r` at `4r` (bit `u` of `qh[l]`: the fifth bit of value `32u + l`);
/// then the codes (768..2816) as Q4_K's. A register of fifth bits lines up with code
/// chunk `k` of every sub-block pair (`qs[32j + 4k ..]`, values `64j + 4k..` and
/// `64j + 32 + 4k..`), whose bits are `2j` and `2j + 1` of its bytes; the kernel reads it
/// with the first pair and from cache after, so a token still reads the group in address order.
pub(crate) mod q5k {
    use super::GROUP_ROWS;

    pub(crate) const BLOCK: usize = 176;
    pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;
    /// Where the `qh` registers and the codes start in a superblock-group.
    pub(crate) const QH: usize = 256;
    pub(crate) const CODES: usize = 768;

    /// Where, in a superblock-group, the 16 rows' 4-byte pieces at GGUF offset `x` of their
    /// superblock lie side by side (a 64-byte register, row r at `4r`): the scale bytes
    /// (`x` in 4..16), `qh` (16..48) and the codes (48..176); `None` for `d`/`dmin` (0..4),
    /// which [`halves`] places.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn register(x: usize) -> Option<usize> {
        match x {
            4..16 => Some(64 + 64 * ((x - 4) / 4)),
            16..48 => Some(QH + 64 * ((x - 16) / 4)),
            48..BLOCK => Some(CODES + 512 * ((x - 48) / 32) + 64 * ((x - 48) % 32 / 4)),
            _ => None,
        }
    }

    /// Where the 16 rows' f16 at GGUF offset `x` (0: `d`, 2: `dmin`) lie side by side.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn halves(x: usize) -> usize {
        16 * x
    }

    /// (offset in row `r`'s superblock, offset in the superblock-group) of every field of
    /// 2 or 4 bytes, and its length.
    fn pieces(r: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        let halves = [0, 2].map(|x| (x, halves(x) + 2 * r, 2));
        let quads = (4..BLOCK)
            .step_by(4)
            .map(move |x| (x, register(x).expect("a 4-byte field") + 4 * r, 4));
        halves.into_iter().chain(quads)
    }

    /// Write GGUF row `r` (`row`: whole Q5_K blocks) into the packed group `packed`.
    pub(super) fn pack_row(packed: &mut [u8], r: usize, row: &[u8]) {
        for (b, x) in row.chunks_exact(BLOCK).enumerate() {
            let dst = &mut packed[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            for (from, to, len) in pieces(r) {
                dst[to..to + len].copy_from_slice(&x[from..from + len]);
            }
        }
    }

    /// Read row `r` of the packed group `packed` back into GGUF blocks (`row`).
    pub(super) fn unpack_row(packed: &[u8], r: usize, row: &mut [u8]) {
        for (b, x) in row.chunks_exact_mut(BLOCK).enumerate() {
            let src = &packed[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            for (to, from, len) in pieces(r) {
                x[to..to + len].copy_from_slice(&src[from..from + len]);
            }
        }
    }
}

/// Q6_K in the rows16 layout. Per superblock of 256 values the 16 rows' 210-byte blocks
/// become 3,360 bytes: the 16 `d` (f16, 0..32); the 16 int8 sub-block scales of each row `r`
/// as four u32 at `4r` of four 64-byte planes (plane `p`: scales `4p..4p+4`; 32..288); then
/// the codes (288..3360), for half `h` (1,536 bytes each) and `k` in 0..8 a 192-byte record
/// of three 64-byte chunks, each holding 4 bytes of row `r` at `4r`: `ql[64h + 4k ..]` (low
/// nibbles: values `128h + 4k..+4`, high: `128h + 64 + 4k..`), `ql[64h + 32 + 4k ..]`
/// (values `128h + 32 + 4k..`, `128h + 96 + 4k..`) and `qh[32h + 4k ..]` (bit pair `f`:
/// values `128h + 32f + 4k..+4`). A record gives the codes of all four 32-value quarters of
/// its half at `4k`, so decoding one token reads the group strictly in address order, which
/// the hardware prefetchers follow: one token streams at 21-23 GB/s per thread, where the
/// earlier layout (a `ql` plane and a `qh` plane, read in turn and revisited per quarter) gave
/// 10-16 with software prefetch and 7 without (BENCHMARKS.md).
pub(crate) mod q6k {
    use super::GROUP_ROWS;

    pub(crate) const BLOCK: usize = 210;
    pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;
    pub(super) const SCALES: usize = 32;
    /// Where the code records start.
    const CODES: usize = 288;

    /// Offset in a superblock-group of `ql` chunk `c` (0..16: `ql[64h + 4c ..]`) of half `h`.
    pub(super) const fn ql(h: usize, c: usize) -> usize {
        CODES + 1536 * h + 192 * (c % 8) + 64 * (c / 8)
    }

    /// Offset in a superblock-group of `qh` chunk `k` (0..8: `qh[32h + 4k ..]`) of half `h`.
    pub(super) const fn qh(h: usize, k: usize) -> usize {
        CODES + 1536 * h + 192 * k + 128
    }

    /// Where, in a superblock-group, the 16 rows' 4-byte pieces at GGUF offset `x` of their
    /// superblock lie side by side (a 64-byte register, row r at `4r`): `ql` (0..128), `qh`
    /// (128..192) and the scales (192..208); `None` for `d` (208..210), at [`halves`].
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn register(x: usize) -> Option<usize> {
        match x {
            0..128 => Some(ql(x / 64, x % 64 / 4)),
            128..192 => Some(qh((x - 128) / 32, (x - 128) % 32 / 4)),
            192..208 => Some(SCALES + 64 * ((x - 192) / 4)),
            _ => None,
        }
    }

    /// Where the 16 rows' f16 `d` (GGUF offset 208) lie side by side.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn halves(x: usize) -> usize {
        debug_assert!(x == 208);
        0
    }

    /// (GGUF offset within a block, rows16 offset within a superblock-group) of every
    /// 4-byte piece of row `r`, scales included; the `d` is handled apart.
    fn pieces(r: usize) -> impl Iterator<Item = (usize, usize)> {
        let scales = (0..4).map(move |p| (192 + 4 * p, SCALES + 64 * p + 4 * r));
        let ql = (0..2)
            .flat_map(|h| (0..16).map(move |c| (64 * h + 4 * c, ql(h, c))))
            .map(move |(g, d)| (g, d + 4 * r));
        let qh = (0..2)
            .flat_map(|h| (0..8).map(move |k| (128 + 32 * h + 4 * k, qh(h, k))))
            .map(move |(g, d)| (g, d + 4 * r));
        scales.chain(ql).chain(qh)
    }

    pub(super) fn pack_row(packed: &mut [u8], r: usize, row: &[u8]) {
        for (b, x) in row.chunks_exact(BLOCK).enumerate() {
            let dst = &mut packed[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            dst[2 * r..2 * r + 2].copy_from_slice(&x[208..210]);
            for (g, d) in pieces(r) {
                dst[d..d + 4].copy_from_slice(&x[g..g + 4]);
            }
        }
    }

    pub(super) fn unpack_row(packed: &[u8], r: usize, row: &mut [u8]) {
        for (b, x) in row.chunks_exact_mut(BLOCK).enumerate() {
            let src = &packed[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            x[208..210].copy_from_slice(&src[2 * r..2 * r + 2]);
            for (g, d) in pieces(r) {
                x[g..g + 4].copy_from_slice(&src[d..d + 4]);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod x86 {
        use std::arch::x86_64::*;

        use super::{GROUP_BLOCK, SCALES, qh, ql};
        use crate::rows16::x86::{KquantGroup, Q8kAct};

        /// The Q6_K kernel for [`crate::rows16::x86::run_kquant`].
        pub(in super::super) struct Kernel;

        impl KquantGroup for Kernel {
            const GROUP_BLOCK: usize = GROUP_BLOCK;

            unsafe fn superblocks<const T: usize>(
                group: &[u8],
                nb: usize,
                acts: &[Q8kAct<'_>],
            ) -> [__m512; T] {
                // SAFETY: the trait method's contract is this module's `superblocks`'.
                unsafe { superblocks::<T>(group, nb, acts) }
            }
        }

        /// Superblock `blk`'s 16 row scales `d`, and sub-block `t`'s int8 scale,
        /// sign-extended, in every row's lane (from the four scale planes).
        ///
        /// # Safety
        /// `blk` one whole superblock of a group.
        #[inline]
        #[target_feature(enable = "avx512f,f16c")]
        unsafe fn scales(blk: *const u8) -> (__m512, [__m512i; 16]) {
            // SAFETY: `d` at 0..32 and the planes at SCALES..SCALES + 256 lie in the
            // superblock (caller).
            let (d, planes): (_, [__m512i; 4]) = unsafe {
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast())),
                    std::array::from_fn(|q| _mm512_loadu_si512(blk.add(SCALES + 64 * q).cast())),
                )
            };
            let sc = std::array::from_fn(|t| {
                let up =
                    _mm512_sll_epi32(planes[t / 4], _mm_cvtsi32_si128((24 - 8 * (t % 4)) as i32));
                _mm512_srai_epi32::<24>(up)
            });
            (d, sc)
        }

        /// [`superblocks`] for one activation row (decode of one sequence), in the order the
        /// bytes lie: per half and chunk `k`, the two `ql` chunks `k` and `8 + k` and the `qh`
        /// chunk `k` are loaded once and give the codes of all four 32-value quarters, which
        /// feed eight `vpdpbusd` chains (quarter × sub-block). The many-token order (one
        /// quarter at a time, its codes shared by the tokens) reads `ql` twice and `qh` four
        /// times per half, out of address order. Same integers, same float step: the same
        /// bits. Where one token prefetches (Intel: `prefetch_ahead`), a sixteenth of the
        /// superblock per chunk `k`, not half of it per half: `decode_dram`, one token, two
        /// threads from DRAM, three passes, Q6_K 2048×5632 336-342 → 304-308 µs (the stream
        /// over the same bytes: 295), 896×4864 127-130 → 114-116 (stream 112); a quarter or
        /// an eighth of the superblock per part were in between.
        ///
        /// # Safety
        /// As [`superblocks`] with one activation row.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn superblocks_one(group: &[u8], nb: usize, a: &Q8kAct<'_>) -> __m512 {
            let mut f = _mm512_setzero_ps();
            let low = _mm512_set1_epi8(0x0F);
            let top = _mm512_set1_epi8(0x30);
            // Read once: the prefetches' `asm!` may write memory, so a check inside the loop
            // reloads the flag after every one.
            let intel = crate::rows16::x86::is_intel();
            let p = group.as_ptr();
            for b in 0..nb {
                // SAFETY: superblock b spans [3360·b, 3360·(b+1)) of `group`, and block b of
                // the activation row is inside it (caller).
                unsafe {
                    let blk = p.add(GROUP_BLOCK * b);
                    let (d, sc) = scales(blk);
                    let y = a.blocks.get_unchecked(b).as_ptr().add(4);
                    let offs = a.offsets.get_unchecked(b);
                    let mut isum = _mm512_setzero_si512();
                    for h in 0..2 {
                        // Where one token prefetches (Intel): a sixteenth of the superblock
                        // per chunk `k` worked on (`superblocks_one`'s docs).
                        let half = GROUP_BLOCK / 2;
                        // Chunk `k`'s four `vpdpbusd` into `acc[fq]` (sub-block 8h + 2fq for
                        // k < 4, 8h + 2fq + 1 after). Two arrays, each indexed by constants
                        // only, so they stay in registers: with one indexed by `k / 4` the
                        // compiler, which did not unroll this loop, kept it on the stack, a
                        // store and a reload around every `vpdpbusd`. Together with
                        // `dpbusd_at`, from DRAM, two threads, three alternations: 2048×5632
                        // 321-346 → 308-326 µs (stream 294-305), 896×4864 123-130 → 118-119
                        // (stream 113-117).
                        macro_rules! chunk {
                            ($k:expr, $acc:expr) => {{
                                let k = $k;
                                if intel {
                                    let at = blk.add(half * h + half / 8 * k);
                                    crate::rows16::x86::prefetch_held(at, half / 8);
                                }
                                let ql0 = _mm512_loadu_si512(blk.add(ql(h, k)).cast());
                                let ql1 = _mm512_loadu_si512(blk.add(ql(h, 8 + k)).cast());
                                let qh = _mm512_loadu_si512(blk.add(qh(h, k)).cast());
                                let codes = [
                                    (_mm512_and_si512(ql0, low), _mm512_slli_epi16::<4>(qh)),
                                    (_mm512_and_si512(ql1, low), _mm512_slli_epi16::<2>(qh)),
                                    (_mm512_and_si512(_mm512_srli_epi16::<4>(ql0), low), qh),
                                    (
                                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), low),
                                        _mm512_srli_epi16::<2>(qh),
                                    ),
                                ];
                                let c = codes.map(|(nib, hb)| {
                                    _mm512_or_si512(nib, _mm512_and_si512(hb, top))
                                });
                                // The four quarters' dwords, 32 bytes apart.
                                let yk = y.add(128 * h + 4 * k).cast::<i32>();
                                use crate::rows16::x86::dpbusd_at;
                                $acc[0] = dpbusd_at::<0>($acc[0], c[0], yk);
                                $acc[1] = dpbusd_at::<8>($acc[1], c[1], yk);
                                $acc[2] = dpbusd_at::<16>($acc[2], c[2], yk);
                                $acc[3] = dpbusd_at::<24>($acc[3], c[3], yk);
                            }};
                        }
                        // Each chain starts from its sub-block's offset term.
                        let mut acc0: [__m512i; 4] =
                            std::array::from_fn(|fq| _mm512_set1_epi32(offs[8 * h + 2 * fq]));
                        let mut acc1: [__m512i; 4] =
                            std::array::from_fn(|fq| _mm512_set1_epi32(offs[8 * h + 2 * fq + 1]));
                        for k in 0..4 {
                            chunk!(k, acc0);
                        }
                        for k in 4..8 {
                            chunk!(k, acc1);
                        }
                        for (fq, (s0, s1)) in acc0.into_iter().zip(acc1).enumerate() {
                            let t0 = 8 * h + 2 * fq;
                            let t = _mm512_add_epi32(
                                _mm512_mullo_epi32(sc[t0], s0),
                                _mm512_mullo_epi32(sc[t0 + 1], s1),
                            );
                            isum = _mm512_add_epi32(isum, t);
                        }
                    }
                    let dy = _mm512_set1_ps(*a.dy.get_unchecked(b));
                    let term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum));
                    f = _mm512_add_ps(f, term);
                }
            }
            f
        }

        /// One group: per superblock the scalar reference's `isum = Σ sc·Σ(q − 32)·y` over
        /// the 16 sub-blocks (exact), then `sum + (d·dy)·isum`.
        ///
        /// # Safety
        /// As [`crate::rows16::x86::run_kquant`]; `group` one whole group of `nb` superblocks.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(in super::super) unsafe fn superblocks<const T: usize>(
            group: &[u8],
            nb: usize,
            acts: &[Q8kAct<'_>],
        ) -> [__m512; T] {
            if T == 1 {
                // SAFETY: the caller's contract, with one activation row.
                let one = unsafe { superblocks_one(group, nb, &acts[0]) };
                return [one; T];
            }
            let mut f = [_mm512_setzero_ps(); T];
            let acts: &[Q8kAct<'_>; T] = acts.try_into().expect("T activation rows");
            let low = _mm512_set1_epi8(0x0F);
            let top = _mm512_set1_epi8(0x30);
            let p = group.as_ptr();
            for b in 0..nb {
                // SAFETY: superblock b spans [3360·b, 3360·(b+1)) of `group` (caller).
                unsafe {
                    let blk = p.add(GROUP_BLOCK * b);
                    let (d, sc) = scales(blk);
                    let mut isum = [_mm512_setzero_si512(); T];
                    for h in 0..2 {
                        for fq in 0..4 {
                            // A sixty-fourth of the superblock per chunk `k` worked on, not
                            // an eighth per eighth: `decode_dram` from DRAM, two threads, two
                            // passes, into L2, 2048×5632 2 tokens 363-367 → 278-291 µs, 4
                            // tokens 394-396 → 292-312, 8 tokens 509-513 → 465-498, 16 717-747
                            // → 715-764; 896×4864 4 tokens 149-151 → 110.
                            let part = GROUP_BLOCK / 8;
                            let at = blk.add(part * (4 * h + fq));
                            // Values 128h + 32fq + 4k ..+4 for k in 0..8: sub-blocks
                            // 8h + 2fq (k < 4) and 8h + 2fq + 1.
                            let mut codes = [_mm512_setzero_si512(); 8];
                            for (k, c) in codes.iter_mut().enumerate() {
                                let chunk = at.add(part / 8 * k);
                                crate::rows16::x86::prefetch_kquant_ahead::<T>(chunk, part / 8);
                                let ql =
                                    _mm512_loadu_si512(blk.add(ql(h, 8 * (fq % 2) + k)).cast());
                                let nib = if fq < 2 {
                                    _mm512_and_si512(ql, low)
                                } else {
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low)
                                };
                                let qh = _mm512_loadu_si512(blk.add(qh(h, k)).cast());
                                let hb = match fq {
                                    0 => _mm512_slli_epi16::<4>(qh),
                                    1 => _mm512_slli_epi16::<2>(qh),
                                    2 => qh,
                                    _ => _mm512_srli_epi16::<2>(qh),
                                };
                                *c = _mm512_or_si512(nib, _mm512_and_si512(hb, top));
                            }
                            let t0 = 8 * h + 2 * fq;
                            for (a, is) in acts.iter().zip(isum.iter_mut()) {
                                let y = a
                                    .blocks
                                    .get_unchecked(b)
                                    .as_ptr()
                                    .add(4 + 128 * h + 32 * fq)
                                    .cast::<i32>();
                                // The codes' offset 32, removed exactly per sub-block.
                                let offs = a.offsets.get_unchecked(b);
                                let mut s0 = _mm512_set1_epi32(offs[t0]);
                                let mut s1 = _mm512_set1_epi32(offs[t0 + 1]);
                                // (Intrinsics, not `dpbusd_at`: with it `decode_dram`
                                // from DRAM, two threads, 2048×5632, read 4 tokens 338-353
                                // → 379-380 µs, 8 tokens 463-468 → 553, 16 tokens 853-878
                                // → 797-828.)
                                for k in 0..4 {
                                    s0 = _mm512_dpbusd_epi32(
                                        s0,
                                        codes[k],
                                        _mm512_set1_epi32(y.add(k).read_unaligned()),
                                    );
                                    s1 = _mm512_dpbusd_epi32(
                                        s1,
                                        codes[4 + k],
                                        _mm512_set1_epi32(y.add(4 + k).read_unaligned()),
                                    );
                                }
                                let t = _mm512_add_epi32(
                                    _mm512_mullo_epi32(sc[t0], s0),
                                    _mm512_mullo_epi32(sc[t0 + 1], s1),
                                );
                                *is = _mm512_add_epi32(*is, t);
                            }
                        }
                    }
                    for ((a, is), ft) in acts.iter().zip(isum.iter()).zip(f.iter_mut()) {
                        let dy = _mm512_set1_ps(*a.dy.get_unchecked(b));
                        let term = _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(*is));
                        *ft = _mm512_add_ps(*ft, term);
                    }
                }
            }
            f
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Activations, GROUP_ROWS};
    use crate::GgmlType;

    /// Activation rows one pass takes.
    pub(super) const MAX_TOKENS: usize = 16;

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` whole groups of the activations' weight
    /// type (Q8_0, Q4_0 or Q5_0); `tokens` 1..=[`MAX_TOKENS`] of its rows, whose terms it
    /// holds; `outs` one slice of at least `rows` values per row of `tokens`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run(
        w: &[u8],
        acts: &Activations<'_>,
        tokens: Range<usize>,
        outs: &mut [&mut [f32]],
    ) {
        let ty = acts.ty;
        assert!((1..=MAX_TOKENS).contains(&tokens.len()));
        let (bb, group_bytes) = super::legacy_group_geometry(acts, tokens.end);
        // SAFETY: CPU features are the caller's; the geometry is as `groups` requires.
        unsafe {
            legacy_groups!(
                groups,
                ty,
                tokens.len(),
                (w, group_bytes, bb, acts, tokens.start, outs)
            )
        }
    }

    /// [`for_groups`] over [`blocks`] with `T` activation rows, the 16 row dots of every row
    /// kept in registers across the group.
    ///
    /// # Safety
    /// As [`run`], with rows `t0..t0 + T` of `acts`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
        let ys: [*const u8; T] =
            std::array::from_fn(|t| acts.rows[(t0 + t) * acts.row_bytes..].as_ptr());
        let dys: [*const f32; T] = std::array::from_fn(|t| acts.dy[(t0 + t) * nb..].as_ptr());
        let sums: [*const i32; T] =
            std::array::from_fn(|t| acts.offset_sum[(t0 + t) * nb..].as_ptr());
        // Q4_1/Q5_1 only (else unread).
        let mins: [*const f32; T] = std::array::from_fn(|t| {
            acts.min_sum
                .get((t0 + t) * nb..)
                .map_or(std::ptr::null(), <[f32]>::as_ptr)
        });
        for_groups(w, group_bytes, outs, |group, f| {
            // SAFETY: `group` is one whole group of this geometry (`for_groups`); the
            // pointers address `nb` blocks of each of the `T` activation rows (`mins` for
            // Q4_1/Q5_1, asserted in `run`); CPU features are the caller's.
            let dots = unsafe { blocks::<TY, T>(group, nb, bb, &ys, &dys, &sums, &mins) };
            f.copy_from_slice(&dots);
        });
    }

    /// One Q8_K activation row as the k-quant kernels read it: per superblock its codes, its
    /// scale `dy`, the sums of its 32-value sub-block pairs (as i16: Q4_K's and Q5_K's mins)
    /// and Q6_K's offset terms.
    pub(super) struct Q8kAct<'a> {
        pub(super) blocks: &'a [[u8; 292]],
        pub(super) dy: &'a [f32],
        pub(super) min_pairs: &'a [[i32; 4]],
        /// Q6_K: the sub-blocks' offset terms (`Activations::offsets`); else empty.
        pub(super) offsets: &'a [[i32; 16]],
    }

    impl<'a> Q8kAct<'a> {
        /// Row `t` of `acts` (a k-quant product's).
        pub(super) fn row(acts: &'a Activations<'a>, t: usize) -> Q8kAct<'a> {
            let nb = acts.blocks;
            let y = &acts.rows[t * acts.row_bytes..(t + 1) * acts.row_bytes];
            Q8kAct {
                blocks: &y.as_chunks::<292>().0[..nb],
                dy: &acts.dy[t * nb..(t + 1) * nb],
                min_pairs: &acts.min_pairs[t * nb..(t + 1) * nb],
                offsets: acts.offsets.get(t * nb..(t + 1) * nb).unwrap_or(&[]),
            }
        }
    }

    /// A k-quant layout's group kernel, for `T` activation rows.
    pub(super) trait KquantGroup {
        /// Bytes of one superblock of a group.
        const GROUP_BLOCK: usize;
        /// The 16 row dots of `group` (`nb` superblocks a row) with each of the `T` rows of
        /// `acts`.
        ///
        /// # Safety
        /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `group` one whole group of the layout;
        /// `acts` exactly `T` Q8_K rows of `nb` superblocks.
        unsafe fn superblocks<const T: usize>(
            group: &[u8],
            nb: usize,
            acts: &[Q8kAct<'_>],
        ) -> [__m512; T];
    }

    /// The k-quant product of layout `K` over every group of `w`, with activation rows
    /// `tokens` of `acts`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` whole groups of the kernel's type and
    /// width; `tokens` 1..=16 rows of `acts`, whose terms it holds; `outs` one slice of at
    /// least `rows` values per row of `tokens`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run_kquant<K: KquantGroup>(
        w: &[u8],
        acts: &Activations<'_>,
        tokens: Range<usize>,
        outs: &mut [&mut [f32]],
    ) {
        let nb = acts.blocks;
        assert!(acts.bsums.len() >= tokens.end * nb);
        assert!(acts.ty != GgmlType::Q6K || acts.offsets.len() >= tokens.end * nb);
        let rows: Vec<Q8kAct<'_>> = tokens.clone().map(|t| Q8kAct::row(acts, t)).collect();
        let group_bytes = nb * K::GROUP_BLOCK;
        macro_rules! dispatch {
            ($($t:literal)*) => {
                match rows.len() {
                    $(
                        $t => for_groups(w, group_bytes, outs, |group, f| {
                            // SAFETY: `group` is one whole group (`for_groups`); the kernel
                            // reads inside it and inside the `$t` activation rows; CPU
                            // features are the caller's.
                            f.copy_from_slice(&unsafe { K::superblocks::<$t>(group, nb, &rows) })
                        }),
                    )*
                    _ => unreachable!("1..=16 activation rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    /// Runs `group_dots(group, f)` for every whole group of `group_bytes` in `w` (`f[t]`: the
    /// 16 row dots with activation row `t`, for one row per slice of `outs`) and stores them at
    /// `outs[t][16g ..]`.
    ///
    /// Several tokens' dots go out with streaming stores (`vmovntps`, then one `sfence`) on
    /// Intel's cores ([`is_intel`]) where every row of `outs` starts on a 64-byte line. Each
    /// token's outputs are a stream of their own, a row's length apart, and an ordinary store
    /// first reads its line (the weight stream has long evicted it from L1 and L2) while the
    /// weight stream holds the line fill buffers. `decode_dram` from DRAM, Q4_K 5632×2048, two
    /// threads, outputs laid out as the engine's (one call a thread's share, rows of a token
    /// `rows` apart; three alternations, µs): 4 tokens 273-300 → 238-258, 2 tokens 233-264 →
    /// 213-236; outputs that stay in L1 (64-row calls writing one 1 KiB window) 238-250, the
    /// same as streamed; 64-byte-aligned rows with ordinary stores 263-284. One token's outputs
    /// are one stream the hardware prefetches, and stay ordinary stores.
    #[target_feature(enable = "avx512f")]
    pub(super) fn for_groups(
        w: &[u8],
        group_bytes: usize,
        outs: &mut [&mut [f32]],
        mut group_dots: impl FnMut(&[u8], &mut [__m512]),
    ) {
        let groups = w.len() / group_bytes;
        let tokens = outs.len();
        assert!(
            (1..=MAX_TOKENS).contains(&tokens)
                && w.len() == groups * group_bytes
                && outs.iter().all(|o| o.len() >= groups * GROUP_ROWS)
        );
        let stream = (2..=8).contains(&tokens)
            && is_intel()
            && outs.iter().all(|o| o.as_ptr().addr().is_multiple_of(64));
        let mut f = [_mm512_setzero_ps(); MAX_TOKENS];
        for (g, group) in w.chunks_exact(group_bytes).enumerate() {
            group_dots(group, &mut f[..tokens]);
            for (o, ft) in outs.iter_mut().zip(&f[..tokens]) {
                let o = &mut o[g * GROUP_ROWS..][..GROUP_ROWS];
                if stream {
                    // SAFETY: `o` is 16 writable f32 on one 64-byte line (its row starts on
                    // one, and 16g floats are whole lines).
                    unsafe { _mm512_stream_ps(o.as_mut_ptr(), *ft) };
                } else {
                    // SAFETY: `o` is 16 writable f32.
                    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *ft) };
                }
            }
        }
        if stream {
            // The streaming stores are weakly ordered: fenced before the caller hands the
            // outputs to another thread.
            _mm_sfence();
        }
    }

    /// Whether this CPU is Intel's, where one token's stream prefetches too
    /// ([`prefetch_ahead`]); not on AMD's. Measured (`decode_dram`, one token, two threads from
    /// DRAM, GB/s of weights): on an Intel Xeon with AMX (2 vCPUs, stream probe 39-41 GB/s)
    /// Q5_0 4864×896 20.2 → 30.8-32.2, Q4_0 24.1-24.7 → 31.7-32.1, Q4_K 5632×2048 21.6-22.0 →
    /// 29.2-29.7, Q5_K 20.1-20.6 → 29.8-30.5, Q8_0 5632×2048 30.3-30.6 → 35.7-36.6; on AMD Zen
    /// 4 the same prefetch made Q4_0 and Q5_0 12-14 % slower and Q8_0 slower still (above).
    /// The CPU's vendor, read once; it also sends the k-quant kernels' several-token prefetches
    /// into L1 ([`prefetch_kquant_ahead`]), several tokens' outputs out with streaming stores
    /// ([`for_groups`]) and Q4_K's scales onto `vpdpwssd` (`q4k::x86::k4`), all measured on
    /// Intel's cores only.
    pub(super) fn is_intel() -> bool {
        static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *INTEL.get_or_init(|| {
            let id = __cpuid(0);
            let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .collect();
            vendor == b"GenuineIntel"
        })
    }

    /// `vpdpwssd`: `acc` plus the pairwise i16 products of `a` and `b` lane by lane, as one
    /// instruction the compiler keeps (it splits a chain of `_mm512_dpwssd_epi32` into
    /// `vpmaddwd` and `vpaddd`, two vector uops where this is one).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) fn dpwssd_held(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        let mut acc = acc;
        // SAFETY: one register-to-register AVX-512 VNNI instruction: no memory, stack or
        // flags; the callers run with AVX-512 VNNI enabled (their target features).
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        acc
    }

    /// One `vpdpbusd`: `acc + codes · y[DWORD]`, the activation dword `DWORD` of `y` broadcast
    /// from memory (`{1to16}`), one fused uop. With `_mm512_set1_epi32` and the intrinsic the
    /// compiler loaded several tokens' dwords ahead into general registers, spilled them, and
    /// broadcast them with `vpbroadcastd` from a register: a uop on a vector port per dword,
    /// on the ports the products need (`q4k::x86::k4`'s docs); or, in Q6_K's one-token
    /// kernel, hoisted the broadcasts of a whole half and spilled them to the stack.
    /// `decode_dram` on the Intel Xeon with AMX, µs, intrinsics → this, two alternations:
    /// legacy 4864×896 from DRAM, two threads, 4 tokens Q5_0 130-139 → 110-113, Q4_0 114-117
    /// → 91-95, Q8_0 190-195 → 175-179, 8 tokens Q5_0 158-161 → 149-152, Q8_0 225-239 →
    /// 204-212, one and two tokens level (two tokens' prefetches stay per chunk: per half of
    /// the dot, Q8_0 5632×2048 read 404-417 → 442-461); from cache, one thread, 4 tokens Q5_0
    /// 201-202 → 123-130, Q4_0 165-168 → 109-114, Q8_0 level, 8 tokens level (Q8_0 197-204 →
    /// 219). Q6_K one token, three alternations: from cache 303-315 → 290-299, from DRAM
    /// 2048×5632 321-346 → 308-326 (its several tokens keep the intrinsics).
    ///
    /// # Safety
    /// `y` addresses at least `4 · (DWORD + 1)` readable bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn dpbusd_at<const DWORD: usize>(
        acc: __m512i,
        codes: __m512i,
        y: *const i32,
    ) -> __m512i {
        let mut acc = acc;
        // SAFETY: an AVX-512 VNNI register product with one dword load at `y + 4 · DWORD`,
        // readable (caller); no stack, no flags; the callers run with AVX-512 VNNI enabled.
        unsafe {
            std::arch::asm!(
                "vpdpbusd {acc}, {codes}, dword ptr [{y} + {at}]{{1to16}}",
                acc = inout(zmm_reg) acc,
                codes = in(zmm_reg) codes,
                y = in(reg) y,
                at = const 4 * DWORD,
                options(pure, readonly, nostack, preserves_flags)
            )
        };
        acc
    }

    /// How far ahead a product of several tokens prefetches ([`prefetch_ahead`]).
    const SEVERAL_TOKENS_AHEAD: usize = 8192;

    /// How far ahead one token's product prefetches where it does (Intel). On an Intel Xeon with
    /// AMX (2 vCPUs, 480 MiB L3, read probe 33 GB/s), with the prefetches issued as the compiler
    /// placed them: 8 KiB against 2 KiB, two builds alternated five times (`airs bench decode
    /// --prompt-tokens 16 --gen-tokens 128 --reps 3 --loader eager`, medians of the five):
    /// TinyLlama-1.1B Q8_0 24.7 → 25.4 tokens/s (faster in 5 of 5 pairs), Q4_K_M 39.0 → 39.6 (4
    /// of 5), Qwen2.5-0.5B 65.7 → 66.2 (3 of 5); `decode_dram` from DRAM, two threads, two
    /// alternations, Q6_K 2048×5632 374-376 → 351-366 µs, Q4_K 5632×2048 246-249 → 225-242. 4,
    /// 16 and 24 KiB were within the noise of 8, 1 KiB slower; `prefetcht2` within the noise,
    /// `prefetcht0` 25-30 % slower. With the prefetches kept ahead of the loads
    /// ([`prefetch_ahead`]), `decode_dram` one token, two threads from DRAM, two passes each
    /// (µs; Q5_0 and Q4_0 4864×896, Q8_0, Q4_K and Q5_K 5632×2048, Q6_K 2048×5632): 1 KiB
    /// 122/86-87/386-387/246/-/361-366, 2 KiB 112-113/77-80/382-399/219-230/-/342-343, 2.5 KiB
    /// 107-109/77-80/377/228-234/275-285/323-331, **3 KiB** 106-110/76-80/371-383/215-224/
    /// 279-281/337-347, 3.5 KiB 106-107/79-81/385-392/225/279-280/350-356, 4 KiB and more
    /// slower again (the k-quants then prefetched a quarter and a half superblock a part);
    /// `airs bench decode` alternated, 2.5 against 3 KiB: TinyLlama-1.1B Q4_K_M 41.8-43.4
    /// against 43.6-44.0 tokens/s, Qwen2.5-0.5B 72.2-76.3 against 71.6-76.6.
    const ONE_TOKEN_AHEAD: usize = 3072;

    /// Software prefetch, into L2 (`prefetcht1`), of the group stream `T` activation rows read:
    /// 8 KiB ahead for several tokens; for one only on Intel's cores, 3 KiB ahead.
    ///
    /// Why (BENCHMARKS.md, `decode_dram`, huge pages as the loaders map them): one token streams
    /// every type at the read rate on the hardware prefetchers alone, and a software prefetch made
    /// it slower (Q8_0 5632×2048, two threads: 278-296 µs without, 325-379 with `prefetcht0` 16 KiB
    /// ahead, 333-425 with this one). Q4_0 and Q5_0, which unpack nibbles and spend longer per
    /// byte, gained 5-10 % from it on an earlier host; on Zen 4 they ran 12-14 % faster without it
    /// (one thread, 4864×896: Q5_0 21.6-21.8 → 24.1-25.4 GB/s, Q4_0 21.5-22.7 → 25.1-25.7), and
    /// Qwen2.5-0.5B's decode, mostly Q5_0, 8-25 % faster. With several tokens each line is worked
    /// on several times as long, the out-of-order window covers fewer lines ahead, and the product
    /// from DRAM took twice as long as from cache, and far longer than one token's stream (Q6_K
    /// 2048×5632, 4 tokens: 460 µs from DRAM, 221 from L3, one token 293); this prefetch closes
    /// much of that (Q6_K 4 tokens 420-450 µs, 16 tokens 1,307 → 965-1,100; Q4_K 5632×2048 4 tokens
    /// 295 → 219-262; Q8_0 4864×896 4 tokens 191-196 → 149-152; these on AMD Zen 4). Into L1
    /// (`prefetcht0`) it evicted the activation rows the tokens re-read and was twice as slow. The
    /// k-quant kernels prefetch a superblock in parts, one per part of it they work on, not all
    /// 37-53 lines at once: Q6_K 4 tokens 419-430 → 293-361 µs (2048×5632), 167-169 → 110-116
    /// (896×4864); now one or two lines per chunk of codes ([`prefetch_kquant_ahead`], into L1 on
    /// Intel's cores). Those figures ran on rings partly on base pages; with every matrix on huge
    /// pages, 8 KiB into L2 is still the best or equal of eight distances and hints at 4 tokens,
    /// while Q8_0 at 2 tokens is faster without it (BENCHMARKS.md, "The read probe on huge
    /// pages").
    ///
    /// One token prefetches as well on Intel's cores ([`is_intel`]), 3 KiB ahead
    /// ([`ONE_TOKEN_AHEAD`]), and there the prefetches stay where the kernel calls this, before
    /// the loads of the block they are issued for: an `asm!` block that may touch memory, which
    /// the compiler does not move loads across. With `_mm_prefetch` the compiler had placed them
    /// at the end of the block's work, after its loads and arithmetic, and the same product from
    /// DRAM was slower (`decode_dram`, one token, two threads, 2 KiB ahead, three alternations,
    /// µs; every figure but Q4_0's from a build that also loaded the next block-group's vectors
    /// a block early, which changed nothing but Q4_0's): Q4_0 4864×896 96-101 → 76-78 (the
    /// stream over the same bytes: 76; 80-85 with the early loads), Q8_0 5632×2048 431-445 →
    /// 380-410, Q4_K 5632×2048 232-239 → 217-227, Q6_K 2048×5632 344-354 → 336-349, Q5_0
    /// 4864×896 104-107 → 105-110. Several tokens keep `_mm_prefetch`, placed by the
    /// compiler: held ahead of the loads, 4 tokens of Q4_K took 300-302 µs against 271-272.
    #[inline]
    pub(super) fn prefetch_ahead<const T: usize>(p: *const u8, bytes: usize) {
        if T > 1 {
            prefetch_lines::<_MM_HINT_T1>(p, SEVERAL_TOKENS_AHEAD, bytes);
        } else if is_intel() {
            prefetch_held(p, bytes);
        }
    }

    /// One token's prefetch of [`prefetch_ahead`] on Intel's cores, without the vendor check
    /// (for a kernel that reads [`is_intel`] once): `prefetcht1` of every line of `bytes` bytes
    /// from `p` + [`ONE_TOKEN_AHEAD`], held where the kernel issues it.
    #[inline]
    pub(super) fn prefetch_held(p: *const u8, bytes: usize) {
        prefetch_held_from(p, ONE_TOKEN_AHEAD, bytes);
    }

    /// One token's prefetch for Q5_K (`q4k::x86::k4` with `FIVE`): [`prefetch_held`] on
    /// Intel's cores; on AMD's, which prefetch no other type for one token, the same held
    /// `prefetcht1` [`SEVERAL_TOKENS_AHEAD`] ahead. Q5_K's kernel reads each superblock's
    /// fifth-bit planes (512 bytes) interleaved with its codes 512 bytes further on, and
    /// re-reads them for every quarter; on the hardware prefetchers alone it ran at half the
    /// read rate. `decode_dram` from DRAM, Q5_K 5632×2048, two threads, AMD Zen 4 (2 vCPUs),
    /// the product's time over the stream's over the same bytes, median of 4-10 runs: no
    /// prefetch 1.65 (380-445 µs), 3 KiB ahead 1.48, 6 KiB 1.08, 9 KiB 1.07, 12 KiB 1.09, 16
    /// KiB 1.01, this 8 KiB 1.01 (10 runs; 240-287 µs against 388-445 for the build before,
    /// alternated four times). TinyLlama-1.1B Q5_K_M decode 23.5-26.1 → 36.5-42.5 tokens/s
    /// (BENCHMARKS.md).
    #[inline]
    pub(super) fn prefetch_q5k_one(p: *const u8, bytes: usize) {
        if is_intel() {
            prefetch_held(p, bytes);
        } else {
            prefetch_held_from(p, SEVERAL_TOKENS_AHEAD, bytes);
        }
    }

    /// `prefetcht1` of every line of `bytes` bytes from `p + ahead`, held where the kernel
    /// issues it ([`prefetch_ahead`]).
    #[inline]
    fn prefetch_held_from(p: *const u8, ahead: usize, bytes: usize) {
        for l in 0..bytes.div_ceil(64) {
            let line = p.wrapping_add(ahead + 64 * l);
            // SAFETY: `prefetcht1` is a hint that never faults, whatever the address
            // (`wrapping_add` keeps the arithmetic defined); it writes no register and no
            // flags, and touches no stack. The block is not marked `nomem` or `readonly` on
            // purpose: the compiler must not move the kernel's loads across it
            // ([`prefetch_ahead`]).
            unsafe {
                std::arch::asm!(
                    "prefetcht1 [{}]",
                    in(reg) line,
                    options(nostack, preserves_flags)
                )
            };
        }
    }

    /// [`prefetch_ahead`] for the k-quant VNNI kernels, which prefetch a superblock-group in
    /// parts of one or two lines, one per chunk of codes they load: on Intel's cores
    /// ([`is_intel`]) several tokens prefetch into L1 (`prefetcht0`), 8 KiB ahead.
    /// `decode_dram` from DRAM, two threads, two alternations, µs, L2 → L1: Q4_K 5632×2048 2
    /// tokens 202-206 → 192-202, 4 tokens 219-233 → 198-222, 8 tokens 315-317 → 306; Q6_K
    /// 2048×5632 2 tokens 278-287 → 274-283, 4 tokens 300-312 → 294-305, 8 tokens 484-498 →
    /// 453-485, 16 tokens 736-764 → 727-739. The legacy kernels (Q8_0 4864×896, 2 tokens
    /// 157 → 184-233; Q5_0 124-127 → 164) and the AMX tiles (Q4_K 16 tokens 471-474 → 507-508)
    /// were slower into L1, and keep [`prefetch_ahead`]. On AMD's cores, where into L1 was
    /// twice as slow with a quarter superblock a part (above), several tokens keep L2.
    #[inline]
    pub(super) fn prefetch_kquant_ahead<const T: usize>(p: *const u8, bytes: usize) {
        if T > 1 && is_intel() {
            prefetch_lines::<_MM_HINT_T0>(p, SEVERAL_TOKENS_AHEAD, bytes);
        } else {
            prefetch_ahead::<T>(p, bytes);
        }
    }

    /// `_mm_prefetch` with `HINT` of every line of `bytes` bytes from `p + ahead`, where the
    /// compiler places them (several tokens' prefetches).
    #[inline]
    fn prefetch_lines<const HINT: i32>(p: *const u8, ahead: usize, bytes: usize) {
        for l in 0..bytes.div_ceil(64) {
            let line = p.wrapping_add(ahead + 64 * l);
            // SAFETY: a software prefetch is a hint: it never faults, whatever the address
            // (`wrapping_add` keeps the arithmetic defined).
            unsafe { _mm_prefetch::<HINT>(line.cast()) };
        }
    }

    /// One group: `TY` 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = Q4_1, 4 = Q5_1; returns the 16 row
    /// dots with each of the `T` activation rows (`ys[t]`: its blocks, `dys[t]`: their
    /// scales, `sums[t]`: their offset terms, `mins[t]`: Q4_1/Q5_1's `dy·Σy`).
    ///
    /// # Safety
    /// As [`run`]; `group` is one whole group of `nb` blocks of `bb` bytes per row; each
    /// pointer addresses `nb` blocks (or values) of its activation row (`mins` only read for
    /// Q4_1/Q5_1).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn blocks<const TY: u8, const T: usize>(
        group: &[u8],
        nb: usize,
        bb: usize,
        ys: &[*const u8; T],
        dys: &[*const f32; T],
        sums: &[*const i32; T],
        mins: &[*const f32; T],
    ) -> [__m512; T] {
        let mut f = [_mm512_setzero_ps(); T];
        let low = _mm512_set1_epi8(0x0F);
        let p = group.as_ptr();
        // The layout's offsets in a block-group (`Legacy`): mins after the scales, then the
        // fifth-bit plane, then the codes.
        let (min, five) = (TY >= 3, TY == 2 || TY == 4);
        let plane_at = if min { 64 } else { 32 };
        let codes_at = plane_at + if five { 64 } else { 0 };
        for b in 0..nb {
            // SAFETY: block-group b spans bytes [16·bb·b, 16·bb·(b+1)) of `group`: scales at
            // 0..32, mins (Q4_1/Q5_1) at 32..64, the plane (Q5_0/Q5_1) 64 bytes, codes after them
            // — all inside (caller); block b of every activation row is inside its row
            // (caller).
            unsafe {
                let blk = p.add(GROUP_ROWS * bb * b);
                // One token prefetches the whole block-group ahead at once; two spread it over
                // the work on it, a line or so per chunk `k` of each token's dot; more, a
                // `T`-th of it per token, but Q8_0 the whole block-group at once. `decode_dram`
                // from DRAM, two threads, two passes, µs, 4864×896: Q5_0 2 tokens 124-129 →
                // 96-103, 4 tokens 139-147 → 117-126, 8 tokens 163-168 → 141-152; Q4_0 2
                // tokens 100 → 81, 4 tokens 112 → 103; Q8_0 2 tokens 156-166 → 137-145 (5632×2048
                // 414-435 → 349-373). Per chunk with 3 or more tokens, or a `T`-th per token
                // with 2, was slower or level; Q8_0 by token parts was level with 4 tokens from
                // DRAM (faster with 8), and TinyLlama-1.1B Q8_0's four sessions read 2-6 %
                // slower with it (`airs bench batch`, within the host's drift: BENCHMARKS.md),
                // so Q8_0 keeps its one prefetch a block-group.
                let part = (GROUP_ROWS * bb).div_ceil(T);
                let (by_chunk, by_token) = (T == 2, T > 2 && TY != 0);
                if !(by_chunk || by_token) {
                    prefetch_ahead::<T>(blk, GROUP_ROWS * bb);
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
                let mut codes = [_mm512_setzero_si512(); 8];
                match TY {
                    0 => {
                        for (k, c) in codes.iter_mut().enumerate() {
                            let v = _mm512_loadu_si512(blk.add(32 + 64 * k).cast());
                            *c = _mm512_xor_si512(v, _mm512_set1_epi8(0x80u8 as i8));
                        }
                    }
                    _ => {
                        let qs = blk.add(codes_at);
                        for k in 0..4 {
                            let v = _mm512_loadu_si512(qs.add(64 * k).cast());
                            codes[k] = _mm512_and_si512(v, low);
                            codes[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                        }
                        if five {
                            // Bit k of the plane's bytes: the fifth bits of chunk k.
                            let plane = _mm512_loadu_si512(blk.add(plane_at).cast());
                            for (k, c) in codes.iter_mut().enumerate() {
                                let bit = _mm512_set1_epi8((1u8 << k) as i8);
                                let m = _mm512_test_epi8_mask(plane, bit);
                                *c = _mm512_mask_add_epi8(*c, m, *c, _mm512_set1_epi8(0x10));
                            }
                        }
                    }
                }
                for t in 0..T {
                    if by_token {
                        prefetch_ahead::<T>(blk.add(part * t), part);
                    }
                    let y = ys[t].add(34 * b + 2).cast::<i32>();
                    // Two chains (integer sums are exact in any order), as one `vpdpbusd`
                    // chain of 8 waits on its latency.
                    let mut acc = [_mm512_set1_epi32(*sums[t].add(b)), _mm512_setzero_si512()];
                    // With two tokens a line or so of the block-group before each chunk `k`.
                    let lines = (GROUP_ROWS * bb).div_ceil(64);
                    macro_rules! dots {
                        ($($k:literal)*) => {$(
                            if by_chunk {
                                let i = 8 * t + $k;
                                let (l0, l1) = (i * lines / (8 * T), (i + 1) * lines / (8 * T));
                                if l1 > l0 {
                                    prefetch_ahead::<T>(blk.add(64 * l0), 64 * (l1 - l0));
                                }
                            }
                            acc[$k % 2] = dpbusd_at::<$k>(acc[$k % 2], codes[$k], y);
                        )*};
                    }
                    dots!(0 1 2 3 4 5 6 7);
                    let acc = _mm512_add_epi32(acc[0], acc[1]);
                    let dy = _mm512_set1_ps(*dys[t].add(b));
                    let mut prod = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, dy));
                    if min {
                        // The reference's `(d·dy)·sumi + m·(dy·Σy)`, then the sum.
                        let m = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast()));
                        let ms = _mm512_set1_ps(*mins[t].add(b));
                        prod = _mm512_add_ps(prod, _mm512_mul_ps(m, ms));
                    }
                    f[t] = _mm512_add_ps(f[t], prod);
                }
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
            })
            .collect()
    }

    /// `groups` groups of `ty` rows with `n` values, GGUF layout.
    fn weights(ty: GgmlType, n: usize, groups: usize) -> Vec<u8> {
        let row_bytes = crate::row_bytes(ty, n).unwrap();
        let mut w = vec![0u8; groups * GROUP_ROWS * row_bytes];
        for (r, row) in w.chunks_exact_mut(row_bytes).enumerate() {
            crate::quantize_row(ty, &floats(n, r as u64 + 7), row).unwrap();
        }
        w
    }

    fn packed(ty: GgmlType, n: usize, natural: &[u8]) -> Vec<u8> {
        let group_bytes = GROUP_ROWS * crate::row_bytes(ty, n).unwrap();
        let mut p = vec![0u8; natural.len()];
        for (src, dst) in natural
            .chunks_exact(group_bytes)
            .zip(p.chunks_exact_mut(group_bytes))
        {
            repack_group(ty, n, src, dst).unwrap();
        }
        p
    }

    #[test]
    fn unpacking_a_repacked_group_restores_the_gguf_bytes_and_rows() {
        for ty in TYPES {
            let widths: &[usize] = if is_kquant(ty) {
                &[256, 768]
            } else {
                &[32, 96, 896]
            };
            for &n in widths {
                let natural = weights(ty, n, 1);
                let p = packed(ty, n, &natural);
                assert_ne!(p, natural, "{ty} {n}: the layout permutes");
                let mut back = vec![0u8; natural.len()];
                unpack_group(ty, n, &p, &mut back).unwrap();
                assert_eq!(back, natural, "{ty} {n}");
                let row_bytes = crate::row_bytes(ty, n).unwrap();
                for r in [0, 5, 15] {
                    let (mut want, mut got) = (vec![0f32; n], vec![1f32; n]);
                    crate::dequantize_row(ty, &natural[r * row_bytes..][..row_bytes], &mut want)
                        .unwrap();
                    dequantize_row(ty, n, &p, r, &mut got).unwrap();
                    assert_eq!(got, want, "{ty} {n} row {r}");
                }
            }
        }
    }

    #[test]
    fn products_on_repacked_groups_equal_the_scalar_reference_on_gguf_rows() {
        for ty in TYPES {
            let n = if is_kquant(ty) { 1024 } else { 896 };
            let natural = weights(ty, n, 3);
            let p = packed(ty, n, &natural);
            let row_bytes = crate::row_bytes(ty, n).unwrap();
            let rows = natural.len() / row_bytes;
            for tokens in [1, 2, 5, 16, 17, 33] {
                let act = crate::act_type(ty).unwrap();
                let act_bytes = act.row_bytes(n);
                let mut acts = vec![0u8; tokens * act_bytes];
                for (t, a) in acts.chunks_exact_mut(act_bytes).enumerate() {
                    crate::quantize_act(act, &floats(n, 1000 + t as u64), a).unwrap();
                }
                let stride = rows + 3;
                for isa in Isa::all_available() {
                    let mut out = vec![f32::NAN; (tokens - 1) * stride + rows];
                    matmul(isa, ty, n, &p, &acts, &mut out, stride).unwrap();
                    for t in 0..tokens {
                        let a = &acts[t * act_bytes..(t + 1) * act_bytes];
                        for r in 0..rows {
                            let row = &natural[r * row_bytes..(r + 1) * row_bytes];
                            let want = crate::dot(Isa::Scalar, ty, n, row, a).unwrap();
                            let got = out[t * stride + r];
                            let exact = got.to_bits() == want.to_bits();
                            // Without fast kernels an ISA's own GGUF-layout kernels run: those
                            // match the scalar reference only where `matmul_matches_scalar`.
                            let close = (got - want).abs() <= 1e-4 * want.abs().max(1.0);
                            assert!(
                                exact || (!crate::matmul_matches_scalar(isa, ty) && close),
                                "{ty} {isa:?} tokens {tokens} t {t} row {r}: {got} vs {want}"
                            );
                        }
                    }
                    // One output slice per token, prepared activations: the same bits.
                    let prepared = Activations::new(isa, ty, n, &acts).unwrap();
                    let mut rows_out = vec![vec![f32::NAN; rows]; tokens];
                    let mut outs: Vec<&mut [f32]> =
                        rows_out.iter_mut().map(|r| r.as_mut_slice()).collect();
                    matmul_rows(isa, &p, &prepared, &mut outs).unwrap();
                    for (t, row) in rows_out.iter().enumerate() {
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(row), bits(&out[t * stride..t * stride + rows]));
                    }
                    outs = Vec::new();
                    assert!(matmul_rows(isa, &p, &prepared, &mut outs).is_err());
                }
            }
        }
    }

    /// GGUF rows of `ty` (`n` values) whose codes, scales and mins are all at one extreme:
    /// the largest codes with the largest scales (`max`), or the smallest codes with the most
    /// negative (Q6_K) or largest (Q4_K/Q5_K mins) scales.
    fn extreme_weights(ty: GgmlType, n: usize, rows: usize, max: bool) -> Vec<u8> {
        let row_bytes = crate::row_bytes(ty, n).unwrap();
        let bb = row_bytes / (n / block_values(ty));
        let mut w = vec![0u8; rows * row_bytes];
        let code = if max { 0xFF } else { 0x00 };
        for blk in w.chunks_exact_mut(bb) {
            match ty {
                GgmlType::Q8_0 => {
                    blk[..2].copy_from_slice(&0x3800u16.to_le_bytes());
                    blk[2..].fill(if max { 0x7F } else { 0x80 });
                }
                GgmlType::Q4_0 | GgmlType::Q5_0 => {
                    blk[..2].copy_from_slice(&0x3800u16.to_le_bytes());
                    blk[2..].fill(code);
                }
                // The min at its most negative with the largest codes, positive with zeros.
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    blk[..2].copy_from_slice(&0x3800u16.to_le_bytes());
                    blk[2..4]
                        .copy_from_slice(&(if max { 0xC400u16 } else { 0x4400 }).to_le_bytes());
                    blk[4..].fill(code);
                }
                // (Q5_K: its `qh` at 16..48 sets or clears every fifth bit with the codes.)
                GgmlType::Q4K | GgmlType::Q5K => {
                    blk[..2].copy_from_slice(&0x2C00u16.to_le_bytes());
                    blk[2..4].copy_from_slice(&0x2400u16.to_le_bytes());
                    blk[4..16].fill(0xFF);
                    blk[16..].fill(code);
                }
                _ => {
                    blk[..192].fill(code);
                    blk[192..208].fill(if max { 0x7F } else { 0x80 });
                    blk[208..].copy_from_slice(&0x2000u16.to_le_bytes());
                }
            }
        }
        w
    }

    /// One activation row of `n` values in `act` whose codes are all `q`.
    fn constant_acts(act: crate::ActType, n: usize, q: i8) -> Vec<u8> {
        let mut a = vec![0u8; act.row_bytes(n)];
        if act == crate::ActType::Q8_0 {
            for b in a.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&0x3400u16.to_le_bytes());
                b[2..].fill(q as u8);
            }
        } else {
            for b in a.chunks_exact_mut(292) {
                b[..4].copy_from_slice(&0.25f32.to_le_bytes());
                b[4..260].fill(q as u8);
                for s in b[260..].chunks_exact_mut(2) {
                    s.copy_from_slice(&(16 * i16::from(q)).to_le_bytes());
                }
            }
        }
        a
    }

    #[test]
    fn repacked_products_are_exact_for_every_token_count_and_extreme_codes() {
        for ty in TYPES {
            #[cfg(target_arch = "aarch64")]
            assert_eq!(
                fast(Isa::Neon, ty),
                std::arch::is_aarch64_feature_detected!("dotprod"),
                "{ty}: NEON with dotprod multiplies rows16 groups itself"
            );
            let n = if is_kquant(ty) { 512 } else { 96 };
            let act = crate::act_type(ty).unwrap();
            let act_bytes = act.row_bytes(n);
            let weight_sets = [
                weights(ty, n, 2),
                extreme_weights(ty, n, 32, true),
                extreme_weights(ty, n, 32, false),
            ];
            // Random rows mixed with all-max and all-min codes, for every kernel's token
            // count (1..=16) and a split past 16.
            let mut acts = Vec::new();
            for t in 0..18 {
                let a = match t % 3 {
                    0 => {
                        let mut a = vec![0u8; act_bytes];
                        crate::quantize_act(act, &floats(n, 500 + t as u64), &mut a).unwrap();
                        a
                    }
                    1 => constant_acts(act, n, 127),
                    // −127: the activation quantizers' range (the AVX2 kernels' sign trick
                    // needs it).
                    _ => constant_acts(act, n, -127),
                };
                acts.extend(a);
            }
            for natural in &weight_sets {
                let p = packed(ty, n, natural);
                let row_bytes = crate::row_bytes(ty, n).unwrap();
                let rows = natural.len() / row_bytes;
                for tokens in 1..=18 {
                    let acts = &acts[..tokens * act_bytes];
                    // Output rows on 64-byte lines (several tokens' streaming stores where
                    // they are used) and a float past one (ordinary stores).
                    for (isa, misalign) in Isa::all_available()
                        .into_iter()
                        .flat_map(|isa| [(isa, 0), (isa, 1)])
                    {
                        let mut store = vec![f32::NAN; tokens * rows + 17];
                        let skip = store.as_ptr().align_offset(64) + misalign;
                        let out = &mut store[skip..skip + tokens * rows];
                        matmul(isa, ty, n, &p, acts, out, rows).unwrap();
                        for t in 0..tokens {
                            let a = &acts[t * act_bytes..(t + 1) * act_bytes];
                            for r in 0..rows {
                                let row = &natural[r * row_bytes..(r + 1) * row_bytes];
                                let want = crate::dot(Isa::Scalar, ty, n, row, a).unwrap();
                                let got = out[t * rows + r];
                                let close = (got - want).abs() <= 1e-4 * want.abs().max(1.0);
                                assert!(
                                    got.to_bits() == want.to_bits() || (!fast(isa, ty) && close),
                                    "{ty} {isa:?} tokens {tokens} t {t} row {r} misaligned \
                                     {misalign}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The AMX tile kernels (where this CPU and Linux allow them) against the scalar
    /// reference, for every token count a tile takes and a split past it, on random weights
    /// and on weights and activations at their extremes; and the VNNI kernels on the same
    /// inputs, which `Auto` would not pick for more than one token.
    #[test]
    fn tile_products_are_exact_for_every_token_count_and_extreme_codes() {
        let isa = Isa::Avx512;
        if !uses_amx(isa) {
            eprintln!("no AMX-INT8 here: the tile kernels are not exercised");
            return;
        }
        for ty in TYPES.into_iter().filter(|&ty| tiles_serve(isa, ty)) {
            let n = if is_kquant(ty) { 512 } else { 160 };
            let act = crate::act_type(ty).unwrap();
            let act_bytes = act.row_bytes(n);
            let mut acts = Vec::new();
            for t in 0..18 {
                acts.extend(match t % 4 {
                    1 => constant_acts(act, n, 127),
                    3 => constant_acts(act, n, -127),
                    _ => {
                        let mut a = vec![0u8; act_bytes];
                        crate::quantize_act(act, &floats(n, 900 + t as u64), &mut a).unwrap();
                        a
                    }
                });
            }
            for natural in [
                weights(ty, n, 3),
                extreme_weights(ty, n, 32, true),
                extreme_weights(ty, n, 32, false),
            ] {
                let p = packed(ty, n, &natural);
                let row_bytes = crate::row_bytes(ty, n).unwrap();
                let rows = natural.len() / row_bytes;
                for tokens in 1..=18 {
                    let acts = &acts[..tokens * act_bytes];
                    for tiles in [Tiles::Always, Tiles::Never] {
                        let prepared = Activations::with_tiles(isa, ty, n, acts, tiles).unwrap();
                        let mut rows_out = vec![vec![f32::NAN; rows]; tokens];
                        let mut outs: Vec<&mut [f32]> =
                            rows_out.iter_mut().map(|r| r.as_mut_slice()).collect();
                        matmul_rows(isa, &p, &prepared, &mut outs).unwrap();
                        for (t, out) in rows_out.iter().enumerate() {
                            let a = &acts[t * act_bytes..(t + 1) * act_bytes];
                            for (r, got) in out.iter().enumerate() {
                                let row = &natural[r * row_bytes..(r + 1) * row_bytes];
                                let want = crate::dot(Isa::Scalar, ty, n, row, a).unwrap();
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{ty} {tiles:?} tokens {tokens} t {t} row {r}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn partial_groups_and_other_types_are_refused() {
        let natural = weights(GgmlType::Q8_0, 64, 1);
        let mut out = vec![0u8; natural.len() - 68];
        assert!(repack_group(GgmlType::Q8_0, 64, &natural[68..], &mut out).is_err());
        assert!(!has_layout(GgmlType::Q3K));
        let mut o = vec![0u8; 16];
        assert!(repack_group(GgmlType::Q3K, 256, &[0u8; 16], &mut o).is_err());
    }
}
