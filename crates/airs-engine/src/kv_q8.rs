//! The q8_0 K cache in columns: where a tile holds each position's blocks, and the attention
//! scores of up to 16 positions against a query's heads as integer dot products in the lanes.
//!
//! A q8_0 K row is ggml's `block_q8_0` per 32 values (an f16 scale, 32 signed codes). A tile of
//! `width` positions of one KV head holds block `b` of every position together, `width × 34`
//! bytes from `b × width × 34`: first the positions' scales, then the codes four values at a
//! time — values `4g..4g + 4` of every position ([`tile_codes`]) — so one 64-byte load holds 16
//! positions' four codes, the operand of one integer dot instruction (`vpdpbusd`, `pmaddubsw`
//! + `pmaddwd`, NEON's widening multiplies) against the same four codes of the query.
//!
//! Design: llama.cpp's CPU attention over a q8_0 cache quantizes the query to q8_0 and takes
//! `vec_dot_q8_0_q8_0` with each K row (block sums scaled by `d_k · d_q`); that is the
//! reference here ([`score_row`]), and every kernel computes its bits: the block sums are exact
//! integers, and each block's `sum += isum · (d_k · d_q)` is the same two multiplies and add
//! per lane, unfused. In rows (the previous layout) each score was a 32-lane dot summed across
//! its lanes, which held q8_0 attention at about twice an f16 call; in columns the 16 scores
//! accumulate in the lanes (BENCHMARKS.md).
//!
//! Cost: a chunk of 16 positions and `H` heads is `H × head_dim / 4` dot instructions of 16
//! lanes (AVX-512 VNNI), four times as many 4-lane `sdot` (NEON with the dot-product
//! extension), twice to four times as many (AVX2, plain NEON), plus four float operations
//! per block and head. Codes are what ggml's quantizer writes, within [-127, 127]; the AVX2 and
//! NEON kernels rely on it (a pair of products fits 16 bits).

use crate::kv::{CHUNK_ROWS, MAX_HEAD_DIM, f16_to_f32};

/// Bytes of a q8_0 block: an f16 scale and 32 codes.
pub(crate) const BLOCK_BYTES: usize = 34;

/// Where, in a q8_0 K tile `width` positions wide, the f16 scale of block `b` of position `col`
/// lies.
#[inline(always)]
pub(crate) fn tile_scale(width: usize, b: usize, col: usize) -> usize {
    b * width * BLOCK_BYTES + 2 * col
}

/// Where, in a q8_0 K tile `width` positions wide, the 4 codes of values `4g..4g + 4` of block
/// `b` of position `col` lie: after the block's scales, group `g` of every position, 4 bytes a
/// position.
#[inline(always)]
pub(crate) fn tile_codes(width: usize, b: usize, g: usize, col: usize) -> usize {
    b * width * BLOCK_BYTES + 2 * width + (g * width + col) * 4
}

/// Write one position's q8_0 row (`row.len() / 34` blocks) as column `col` of a tile `width`
/// positions wide.
pub(crate) fn store_column(row: &[u8], tile: &mut [u8], width: usize, col: usize) {
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let at = tile_scale(width, b, col);
        tile[at..at + 2].copy_from_slice(&block[..2]);
        for (g, codes) in block[2..].chunks_exact(4).enumerate() {
            let at = tile_codes(width, b, g, col);
            tile[at..at + 4].copy_from_slice(codes);
        }
    }
}

/// The scale of a q8_0 block (its first two bytes, an f16) as f32.
#[inline(always)]
pub(crate) fn block_scale(block: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([block[0], block[1]]))
}

/// A query's heads quantized to q8_0, as K tiles are scored against them: each head's row
/// (`row_bytes` bytes), its blocks' scales as f32 and its blocks' code sums.
pub(crate) struct Query {
    rows: Vec<u8>,
    row_bytes: usize,
    scales: Vec<f32>,
    /// Σ of each block's codes (the VNNI kernel's correction for its unsigned K codes).
    #[cfg(target_arch = "x86_64")]
    sums: Vec<i32>,
}

impl Query {
    /// The query `q` (`heads × head_dim` values) quantized by `quantize` (one head's values into
    /// one q8_0 row of `row_bytes` bytes).
    pub(crate) fn new(
        q: &[f32],
        head_dim: usize,
        row_bytes: usize,
        quantize: impl Fn(&[f32], &mut [u8]),
    ) -> Query {
        let heads = q.len() / head_dim;
        let mut rows = vec![0u8; heads * row_bytes];
        for (src, dst) in q
            .chunks_exact(head_dim)
            .zip(rows.chunks_exact_mut(row_bytes))
        {
            quantize(src, dst);
        }
        let blocks = rows.chunks_exact(BLOCK_BYTES);
        let scales = blocks.clone().map(block_scale).collect();
        #[cfg(target_arch = "x86_64")]
        let sums = blocks
            .map(|b| b[2..].iter().map(|&c| i32::from(c as i8)).sum())
            .collect();
        Query {
            rows,
            row_bytes,
            scales,
            #[cfg(target_arch = "x86_64")]
            sums,
        }
    }

    fn heads(&self) -> usize {
        self.rows.len() / self.row_bytes
    }

    fn blocks(&self) -> usize {
        self.row_bytes / BLOCK_BYTES
    }

    /// Head `h`'s 4 codes of values `4g..4g + 4` of block `b`, as one little-endian word.
    #[inline(always)]
    fn codes(&self, h: usize, b: usize, g: usize) -> i32 {
        let at = h * self.row_bytes + b * BLOCK_BYTES + 2 + 4 * g;
        i32::from_le_bytes(self.rows[at..at + 4].try_into().expect("4 codes"))
    }
}

/// Which kernel [`scores`] runs, decided once per attention call by [`Kernel::detect`], the
/// only way to make one outside this module: a SIMD kernel is named only where the CPU runs it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Kernel(Kind);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// Rows gathered from the tile, then [`score_row`] (any CPU).
    Portable,
    /// AVX2's `pmaddubsw` and `pmaddwd`, 8 positions a register.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 VNNI's `vpdpbusd`, 16 positions a register.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// NEON's widening multiplies and pairwise adds, 4 positions a register (the Pi 4).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// NEON's `sdot`, 4 positions a register (the dot-product extension: the Pi 5).
    #[cfg(target_arch = "aarch64")]
    NeonDot,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub(crate) fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                return Kernel(Kind::Vnni);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Kernel(Kind::Avx2);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                return Kernel(Kind::NeonDot);
            }
            return Kernel(Kind::Neon);
        }
        Kernel(Kind::Portable)
    }
}

/// `scores[h · n_ctx + j0 + j] = score_row(k_(col0 + j), q_h) · scale` for the `n ≤ 16`
/// positions from column `col0` of a q8_0 K tile `width` positions wide and every head `h` of
/// `q`, by `kernel` (the same bits from each). The SIMD kernels read 16 columns, so they run
/// where `col0 + 16 ≤ width`; elsewhere (a run that starts inside a block) the portable one does.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn scores(
    kernel: Kernel,
    tile: &[u8],
    width: usize,
    col0: usize,
    n: usize,
    q: &Query,
    scale: f32,
    scores: &mut [f32],
    n_ctx: usize,
    j0: usize,
) {
    assert!(
        (1..=CHUNK_ROWS).contains(&n)
            && col0 + n <= width
            && tile.len() >= q.blocks() * width * BLOCK_BYTES
            && scores.len() >= (q.heads() - 1) * n_ctx + j0 + n,
        "a q8_0 chunk out of its tile or scores"
    );
    let whole = col0 + CHUNK_ROWS <= width;
    let chunk = Chunk {
        tile,
        width,
        col0,
        n,
        scale,
        n_ctx,
        j0,
    };
    match kernel.0 {
        // SAFETY: a `Kernel` holds `Vnni` only where AVX-512 F and VNNI were detected
        // (`Kernel::detect`; this module's tests detect them too); the chunk's 16 columns lie in
        // the tile (`whole`, and the assertion above).
        #[cfg(target_arch = "x86_64")]
        Kind::Vnni if whole => unsafe { x86::scores_vnni(&chunk, q, scores) },
        // SAFETY: `Avx2` only where AVX2 and F16C were detected; 16 columns in the tile as above.
        #[cfg(target_arch = "x86_64")]
        Kind::Avx2 if whole => unsafe { x86::scores_avx2(&chunk, q, scores) },
        // SAFETY: `Neon` only where NEON was detected; 16 columns in the tile as above.
        #[cfg(target_arch = "aarch64")]
        Kind::Neon if whole => unsafe { neon::scores(&chunk, q, scores) },
        // SAFETY: `NeonDot` only where NEON and the dot-product extension were detected; 16
        // columns in the tile as above.
        #[cfg(target_arch = "aarch64")]
        Kind::NeonDot if whole => unsafe { neon::scores_dot(&chunk, q, scores) },
        _ => scores_portable(&chunk, q, scores),
    }
}

/// The columns of a tile one call scores, and where their scores go.
struct Chunk<'a> {
    tile: &'a [u8],
    width: usize,
    col0: usize,
    n: usize,
    scale: f32,
    n_ctx: usize,
    j0: usize,
}

/// ggml's `vec_dot_q8_0_q8_0` of a K row with query head `h`, times `scale`: per 32-value
/// block an exact integer dot scaled by `d_k · d_q`, summed in block order.
#[inline(always)]
fn score_row(row: &[u8], q: &Query, h: usize, k_scales: &[f32], scale: f32) -> f32 {
    let qh = &q.rows[h * q.row_bytes..(h + 1) * q.row_bytes];
    let dq = &q.scales[h * q.blocks()..(h + 1) * q.blocks()];
    let mut sum = 0.0f32;
    for (b, (x, y)) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(qh.chunks_exact(BLOCK_BYTES))
        .enumerate()
    {
        let x: &[u8; 32] = x[2..].try_into().expect("32 codes");
        let y: &[u8; 32] = y[2..].try_into().expect("32 codes");
        let mut isum = 0i32;
        for (&p, &q) in x.iter().zip(y) {
            isum += i32::from(p as i8) * i32::from(q as i8);
        }
        sum += isum as f32 * (k_scales[b] * dq[b]);
    }
    sum * scale
}

/// [`scores`] on any CPU: the chunk's rows gathered from the tile once for all the heads, each
/// scored by [`score_row`].
fn scores_portable(c: &Chunk<'_>, q: &Query, scores: &mut [f32]) {
    let blocks = q.blocks();
    let mut rows = [[0u8; BLOCK_BYTES]; CHUNK_ROWS * MAX_HEAD_DIM / 32];
    for b in 0..blocks {
        let scales = &c.tile[tile_scale(c.width, b, c.col0)..][..2 * c.n];
        for (j, d) in scales.as_chunks::<2>().0.iter().enumerate() {
            rows[j * blocks + b][..2].copy_from_slice(d);
        }
        for g in 0..8 {
            let codes = &c.tile[tile_codes(c.width, b, g, c.col0)..][..4 * c.n];
            for (j, w) in codes.as_chunks::<4>().0.iter().enumerate() {
                rows[j * blocks + b][2 + 4 * g..6 + 4 * g].copy_from_slice(w);
            }
        }
    }
    let mut k_scales = [0.0f32; MAX_HEAD_DIM / 32];
    for j in 0..c.n {
        let row = rows[j * blocks..(j + 1) * blocks].as_flattened();
        for (d, block) in k_scales.iter_mut().zip(row.chunks_exact(BLOCK_BYTES)) {
            *d = block_scale(block);
        }
        for h in 0..q.heads() {
            scores[h * c.n_ctx + c.j0 + j] = score_row(row, q, h, &k_scales, c.scale);
        }
    }
}

/// Store lanes `0..n` of each head's 16 scores (`sums[p]`, head `h0 + p`) times the scale.
#[inline(always)]
fn store<const P: usize>(c: &Chunk<'_>, h0: usize, sums: &[[f32; CHUNK_ROWS]; P], out: &mut [f32]) {
    for (p, sum) in sums.iter().enumerate() {
        let at = (h0 + p) * c.n_ctx + c.j0;
        for (o, &s) in out[at..at + c.n].iter_mut().zip(sum) {
            *o = s * c.scale;
        }
    }
}

/// `$pass::<P>($chunk, $q, h0, $out)` over the query's heads in passes of at most 4.
macro_rules! in_passes {
    ($pass:ident, $chunk:expr, $q:expr, $out:expr) => {{
        let heads = $q.heads();
        let mut h0 = 0;
        while h0 < heads {
            let p = (heads - h0).min(4);
            match p {
                4 => $pass::<4>($chunk, $q, h0, $out),
                3 => $pass::<3>($chunk, $q, h0, $out),
                2 => $pass::<2>($chunk, $q, h0, $out),
                _ => $pass::<1>($chunk, $q, h0, $out),
            }
            h0 += p;
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CHUNK_ROWS, Chunk, Query, store, tile_codes, tile_scale};

    /// [`super::scores`] with AVX-512 VNNI, 16 positions a register: per group of 4 values one
    /// `vpdpbusd` of the positions' codes (made unsigned by adding 128, which adds
    /// `128 · Σ q` to each exact block sum, taken off before the sum is scaled) with the
    /// head's 4 codes.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and VNNI; the chunk's 16 columns lie in its tile.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn scores_vnni(c: &Chunk<'_>, q: &Query, out: &mut [f32]) {
        #[target_feature(enable = "avx512f,avx512vnni")]
        fn pass<const P: usize>(c: &Chunk<'_>, q: &Query, h0: usize, out: &mut [f32]) {
            let flip = _mm512_set1_epi8(i8::MIN);
            let mut sums = [_mm512_setzero_ps(); P];
            for b in 0..q.blocks() {
                let scales = &c.tile[tile_scale(c.width, b, c.col0)..][..2 * CHUNK_ROWS];
                // SAFETY: the 32 bytes of `scales` (16 f16), an unaligned load.
                let dk = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(scales.as_ptr().cast()) });
                let mut acc = [_mm512_setzero_si512(); P];
                for g in 0..8 {
                    let codes = &c.tile[tile_codes(c.width, b, g, c.col0)..][..4 * CHUNK_ROWS];
                    // SAFETY: the 64 bytes of `codes`, an unaligned load.
                    let k = unsafe { _mm512_loadu_si512(codes.as_ptr().cast()) };
                    let k = _mm512_xor_si512(k, flip);
                    for (p, acc) in acc.iter_mut().enumerate() {
                        let qg = _mm512_set1_epi32(q.codes(h0 + p, b, g));
                        *acc = _mm512_dpbusd_epi32(*acc, k, qg);
                    }
                }
                for (p, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
                    let at = (h0 + p) * q.blocks() + b;
                    let isum = _mm512_sub_epi32(acc, _mm512_set1_epi32(128 * q.sums[at]));
                    let d = _mm512_mul_ps(dk, _mm512_set1_ps(q.scales[at]));
                    *sum = _mm512_add_ps(*sum, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d));
                }
            }
            let mut lanes = [[0.0f32; CHUNK_ROWS]; P];
            for (l, s) in lanes.iter_mut().zip(sums) {
                // SAFETY: 16 floats into a 16-float array.
                unsafe { _mm512_storeu_ps(l.as_mut_ptr(), s) };
            }
            store(c, h0, &lanes, out);
        }
        in_passes!(pass, c, q, out);
    }

    /// [`super::scores`] with AVX2, 8 positions a register: per group of 4 values the
    /// positions' codes signed like the head's (`psignb`) times the head's magnitudes
    /// (`pmaddubsw`, pairs of products: at most 2 · 127² in 16 bits), the pairs added into
    /// 32 bits (`pmaddwd` by 1).
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; the chunk's 16 columns lie in its tile.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn scores_avx2(c: &Chunk<'_>, q: &Query, out: &mut [f32]) {
        #[target_feature(enable = "avx2,f16c")]
        fn pass<const P: usize>(c: &Chunk<'_>, q: &Query, h0: usize, out: &mut [f32]) {
            let ones = _mm256_set1_epi16(1);
            let mut sums = [[_mm256_setzero_ps(); 2]; P];
            for b in 0..q.blocks() {
                let scales = &c.tile[tile_scale(c.width, b, c.col0)..][..2 * CHUNK_ROWS];
                // SAFETY: the two 16-byte halves of `scales`, unaligned loads.
                let dk = unsafe {
                    [
                        _mm256_cvtph_ps(_mm_loadu_si128(scales.as_ptr().cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(scales[16..].as_ptr().cast())),
                    ]
                };
                let mut acc = [[_mm256_setzero_si256(); 2]; P];
                for g in 0..8 {
                    let codes = &c.tile[tile_codes(c.width, b, g, c.col0)..][..4 * CHUNK_ROWS];
                    // SAFETY: the two 32-byte halves of `codes`, unaligned loads.
                    let k = unsafe {
                        [
                            _mm256_loadu_si256(codes.as_ptr().cast()),
                            _mm256_loadu_si256(codes[32..].as_ptr().cast()),
                        ]
                    };
                    for (p, acc) in acc.iter_mut().enumerate() {
                        let qg = _mm256_set1_epi32(q.codes(h0 + p, b, g));
                        let magnitude = _mm256_sign_epi8(qg, qg);
                        for (acc, k) in acc.iter_mut().zip(k) {
                            let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(k, qg));
                            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
                        }
                    }
                }
                for (p, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
                    let at = (h0 + p) * q.blocks() + b;
                    let dq = _mm256_set1_ps(q.scales[at]);
                    for ((s, a), dk) in sum.iter_mut().zip(acc).zip(dk) {
                        let d = _mm256_mul_ps(dk, dq);
                        *s = _mm256_add_ps(*s, _mm256_mul_ps(_mm256_cvtepi32_ps(a), d));
                    }
                }
            }
            let mut lanes = [[0.0f32; CHUNK_ROWS]; P];
            for (l, s) in lanes.iter_mut().zip(sums) {
                // SAFETY: two 8-float stores into a 16-float array.
                unsafe {
                    _mm256_storeu_ps(l.as_mut_ptr(), s[0]);
                    _mm256_storeu_ps(l[8..].as_mut_ptr(), s[1]);
                }
            }
            store(c, h0, &lanes, out);
        }
        in_passes!(pass, c, q, out);
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::{CHUNK_ROWS, Chunk, Query, store, tile_codes, tile_scale};
    use crate::kv::f16_to_f32;

    /// [`super::scores`] with NEON, 4 positions a register: per group of 4 values the
    /// positions' codes times the head's (`smull`, 16-bit products), adjacent products added
    /// (`addp`: at most 2 · 127² in 16 bits), and the pairs added into 32 bits (`sadalp`).
    ///
    /// # Safety
    /// The CPU must support NEON; the chunk's 16 columns lie in its tile.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn scores(c: &Chunk<'_>, q: &Query, out: &mut [f32]) {
        #[target_feature(enable = "neon")]
        fn pass<const P: usize>(c: &Chunk<'_>, q: &Query, h0: usize, out: &mut [f32]) {
            // SAFETY: NEON is enabled here; without `sdot`.
            unsafe { blocks::<P, false>(c, q, h0, out) };
        }
        in_passes!(pass, c, q, out);
    }

    /// [`super::scores`] with NEON's `sdot`, 4 positions a register: per group of 4 values
    /// one `sdot` of the positions' codes with the head's 4 codes in every lane.
    ///
    /// # Safety
    /// The CPU must support NEON and the dot-product extension; the chunk's 16 columns lie in
    /// its tile.
    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn scores_dot(c: &Chunk<'_>, q: &Query, out: &mut [f32]) {
        #[target_feature(enable = "neon,dotprod")]
        fn pass<const P: usize>(c: &Chunk<'_>, q: &Query, h0: usize, out: &mut [f32]) {
            // SAFETY: NEON and the dot-product extension are enabled here.
            unsafe { blocks::<P, true>(c, q, h0, out) };
        }
        in_passes!(pass, c, q, out);
    }

    /// Heads `h0..h0 + P` against the chunk's 16 positions, block by block: each 32-bit lane
    /// gains the dot of one position's 4 codes with the head's 4 codes (`sdot` if `SDOT`,
    /// else `smull`, `addp`, `sadalp`); then each block's exact sums are scaled as ggml does.
    ///
    /// # Safety
    /// The caller enables NEON, and the dot-product extension if `SDOT`; the chunk's 16
    /// columns lie in its tile.
    #[inline(always)]
    unsafe fn blocks<const P: usize, const SDOT: bool>(
        c: &Chunk<'_>,
        q: &Query,
        h0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller's features cover every intrinsic below (`sdot` only if `SDOT`),
        // and the loads read inside the slices named beside them.
        unsafe {
            let mut sums = [[vdupq_n_f32(0.0); 4]; P];
            for b in 0..q.blocks() {
                let scales = &c.tile[tile_scale(c.width, b, c.col0)..][..2 * CHUNK_ROWS];
                let mut dk = [0.0f32; CHUNK_ROWS];
                for (d, h) in dk.iter_mut().zip(scales.as_chunks::<2>().0) {
                    *d = f16_to_f32(u16::from_le_bytes(*h));
                }
                let mut acc = [[vdupq_n_s32(0); 4]; P];
                for g in 0..8 {
                    let codes = &c.tile[tile_codes(c.width, b, g, c.col0)..][..4 * CHUNK_ROWS];
                    // Four 16-byte loads inside the 64 bytes of `codes`.
                    let k: [int8x16_t; 4] =
                        std::array::from_fn(|i| vld1q_s8(codes[16 * i..].as_ptr().cast()));
                    for (p, acc) in acc.iter_mut().enumerate() {
                        let qg = vreinterpretq_s8_s32(vdupq_n_s32(q.codes(h0 + p, b, g)));
                        for (acc, k) in acc.iter_mut().zip(k) {
                            *acc = if SDOT {
                                airs_kernels::sdot(*acc, k, qg)
                            } else {
                                let low = vmull_s8(vget_low_s8(k), vget_low_s8(qg));
                                vpadalq_s16(*acc, vpaddq_s16(low, vmull_high_s8(k, qg)))
                            };
                        }
                    }
                }
                for (p, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
                    let dq = q.scales[(h0 + p) * q.blocks() + b];
                    for (i, (s, a)) in sum.iter_mut().zip(acc).enumerate() {
                        // 4 floats of the 16-float array `dk`.
                        let dk = vld1q_f32(dk[4 * i..].as_ptr());
                        let d = vmulq_f32(dk, vdupq_n_f32(dq));
                        *s = vaddq_f32(*s, vmulq_f32(vcvtq_f32_s32(a), d));
                    }
                }
            }
            let mut lanes = [[0.0f32; CHUNK_ROWS]; P];
            for (l, s) in lanes.iter_mut().zip(sums) {
                for (i, v) in s.into_iter().enumerate() {
                    // 4 floats into the 16-float array.
                    vst1q_f32(l[4 * i..].as_mut_ptr(), v);
                }
            }
            store(c, h0, &lanes, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(head_dim: usize, seed: usize) -> Vec<f32> {
        (0..head_dim)
            .map(|j| (((j * 37 + seed * 11) % 97) as f32 - 48.0) * 0.013 * (1 + seed % 5) as f32)
            .collect()
    }

    fn quantize(src: &[f32], dst: &mut [u8]) {
        airs_kernels::quantize_row(airs_gguf::GgmlType::Q8_0, src, dst).unwrap();
    }

    #[test]
    fn every_kernel_scores_each_position_as_its_row_alone_bit_for_bit() {
        // Every kernel this CPU runs (the same detection as `Kernel::detect`).
        let mut kernels = vec![Kernel(Kind::Portable)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                kernels.push(Kernel(Kind::Avx2));
            }
            if Kernel::detect() == Kernel(Kind::Vnni) {
                kernels.push(Kernel(Kind::Vnni));
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                kernels.push(Kernel(Kind::Neon));
            }
            if Kernel::detect() == Kernel(Kind::NeonDot) {
                kernels.push(Kernel(Kind::NeonDot));
            }
        }
        for head_dim in [32, 64, 256] {
            let row_bytes = head_dim / 32 * BLOCK_BYTES;
            let heads = 11;
            let q_values: Vec<f32> = (0..heads).flat_map(|h| values(head_dim, 100 + h)).collect();
            let q = Query::new(&q_values, head_dim, row_bytes, quantize);
            let row = |seed: usize| {
                let mut row = vec![0u8; row_bytes];
                quantize(&values(head_dim, seed), &mut row);
                row
            };
            for width in [16, 32] {
                let mut tile = vec![0u8; width * row_bytes];
                for col in 0..width {
                    store_column(&row(col), &mut tile, width, col);
                }
                // Whole chunks, a chunk's first positions, chunks that start inside the tile.
                for (col0, n) in [(0, 16), (0, 5), (width - 16, 16), (3, 9), (width - 1, 1)] {
                    let (n_ctx, j0) = (20, 2);
                    for &kernel in &kernels {
                        let mut out = vec![f32::NAN; heads * n_ctx];
                        scores(
                            kernel, &tile, width, col0, n, &q, 0.125, &mut out, n_ctx, j0,
                        );
                        for h in 0..heads {
                            for j in 0..n {
                                let k = row(col0 + j);
                                let k_scales: Vec<f32> =
                                    k.chunks_exact(BLOCK_BYTES).map(block_scale).collect();
                                let alone = score_row(&k, &q, h, &k_scales, 0.125);
                                let got = out[h * n_ctx + j0 + j];
                                assert_eq!(
                                    got.to_bits(),
                                    alone.to_bits(),
                                    "{kernel:?} {head_dim}, width {width}, {col0}+{j}, head {h}"
                                );
                            }
                            // Nothing outside the chunk's positions is written.
                            let rest = &out[h * n_ctx..(h + 1) * n_ctx];
                            assert!(rest[..j0].iter().chain(&rest[j0 + n..]).all(|x| x.is_nan()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_reference_is_ggml_s_q8_0_dot() {
        let head_dim = 64;
        let row_bytes = 2 * BLOCK_BYTES;
        let q = Query::new(&values(head_dim, 3), head_dim, row_bytes, quantize);
        let mut k = vec![0u8; row_bytes];
        quantize(&values(head_dim, 8), &mut k);
        let k_scales: Vec<f32> = k.chunks_exact(BLOCK_BYTES).map(block_scale).collect();
        let want = airs_kernels::dot(
            airs_kernels::Isa::Scalar,
            airs_gguf::GgmlType::Q8_0,
            head_dim,
            &k,
            &q.rows,
        )
        .unwrap();
        let got = score_row(&k, &q, 0, &k_scales, 1.0);
        assert!((got - want).abs() <= want.abs() * 1e-6, "{got} vs {want}");
    }
}
