//! The KV cache interface the forward pass writes keys/values into and attends through, the
//! attention kernel every cache shares, and the contiguous cache (per layer, K in tiles of 16
//! positions and V as one `[capacity × kv_len]` array).
//!
//! The paged cache ([`crate::paged`], PagedAttention over the airs-memory block pool) is the
//! engine's cache; the contiguous cache reserves its whole capacity up front and stays as a
//! test oracle and as the baseline the paged one is measured against.
//!
//! Attention is computed for all the query heads that share a KV head at once (grouped-query
//! attention): each cached K/V row is read and decoded once per group instead of once per
//! query head, while every query head still sees exactly the arithmetic of a one-head kernel
//! (same dot product, f64 softmax sum, in-order accumulation), so results do not depend on how
//! heads are grouped. A prompt's consecutive rows can attend as one block the same way
//! ([`KvCache::attend_queries`]): their queries' heads share every row read, each query stopping
//! at its own position, with the results of attending one by one. Cached positions are read as
//! *runs*: one per K tile of the contiguous cache, one per block of the paged cache.
//!
//! Layout: V is cached in rows (a position's values together), which the weighted sum reads
//! whole; K is cached in columns inside tiles of positions ([`encode_k`]), so that
//! the scores of 16 positions accumulate in the 16 lanes of a register straight from the cache,
//! one load per value (f32, f16) or per four values (q8_0: [`crate::kv_q8`]) — in rows, each
//! score is a dot product whose lanes must be summed across, or the rows transposed first (the
//! previous kernel gathered them; as a whole it was 2.1-3.0× slower with f16/f32, and q8_0 K
//! in rows held its calls at about twice f16's: BENCHMARKS.md). Each f16/f32 score is two fused
//! multiply-add chains in value order (even and odd values), the same in every build.
//!
//! Element types, chosen to match llama.cpp's CPU kernels:
//! - `f32`: everything in f32.
//! - `f16`: ggml multiplies f16 K and V by converting the f32 operand to f16 (its
//!   `vec_dot_type`), so the query and the softmax weights are rounded to f16 before their dot
//!   products; K and V rows convert exactly.
//! - `q8_0`: ggml `block_q8_0` (f16 scale + 32 × i8 per 32 values), V in rows and K's blocks
//!   in columns ([`crate::kv_q8`]). llama.cpp needs flash attention for a quantized V cache;
//!   its CPU kernel quantizes the query to q8_0, takes integer q8_0·q8_0 dot products with the
//!   K rows (block sums scaled by `d_k·d_q`), and accumulates dequantized f32 V rows with f32
//!   weights. We do the same, with the two-pass softmax (f64 sum) of the other types instead
//!   of its online f32 softmax — a difference of about one ulp in the weights. q8_0 needs
//!   `head_dim` to be a multiple of 32.
//!
//! Cost: `store` is O(kv_len) per position; `attend` reads each of the `n_ctx` K and V rows of
//! its KV head once and does O(n_ctx × head_dim) work per query head. On x86-64 with AVX2 the
//! kernel runs as a 256-bit build of the same code, and with AVX-512 F as a build that reads
//! f16/f32 K columns and f16/f32/q8_0 V rows straight from the cache into 512-bit registers,
//! four query heads per pass of the scores (q8_0 K: [`crate::kv_q8`]'s kernels) and up to eight
//! of the weighted sum, whose sums stay in registers across the runs of a window of rows
//! ([`accumulate_runs_avx512`]); on aarch64 (the Pi) the
//! portable build converts f16 values 8 at a time with NEON's `fcvtl`/`fcvtn` — bit-identical
//! results in every build (tested, the aarch64 ones under qemu). The next run is prefetched
//! while one is computed (a paged cache's runs each start a new page). Measured single-thread
//! with `cargo bench -p airs-engine --bench attention` (one decode query against 2048 cached
//! positions, f16): BENCHMARKS.md.

use airs_gguf::GgmlType;

use crate::error::{EngineError, EngineErrorKind};
use crate::kv_q8;

/// Element type of cached keys and values.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
    /// ggml `block_q8_0`: 34 bytes per 32 values.
    Q8_0,
}

/// Largest `head_dim` the attention kernel supports.
pub const MAX_HEAD_DIM: usize = 256;

impl KvType {
    /// Bytes per cached element (on average, for block types).
    pub fn element_bytes(self) -> f64 {
        match self {
            KvType::F32 => 4.0,
            KvType::F16 => 2.0,
            KvType::Q8_0 => 34.0 / 32.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one head's cached row of `head_dim` values, or `None` when this type cannot
    /// hold such a row (q8_0 needs a multiple of 32) or it is longer than [`MAX_HEAD_DIM`].
    pub fn row_bytes(self, head_dim: usize) -> Option<usize> {
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return None;
        }
        match self {
            KvType::F32 => Some(head_dim * 4),
            KvType::F16 => Some(head_dim * 2),
            KvType::Q8_0 => head_dim.is_multiple_of(32).then_some(head_dim / 32 * 34),
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<KvType, String> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(format!("unknown KV type {other:?} (f32, f16 or q8_0)")),
        }
    }
}

/// Geometry of a model's KV cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Values per position per layer for K (and for V).
    pub fn kv_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes one position takes in a cache of type `ty` (K and V of every layer).
    pub fn bytes_per_token(&self, ty: KvType) -> Option<usize> {
        Some(2 * self.layers * self.kv_heads * ty.row_bytes(self.head_dim)?)
    }

    /// The row size of `ty`, or the error explaining why this shape cannot use it.
    pub(crate) fn checked_row_bytes(&self, ty: KvType) -> Result<usize, EngineError> {
        ty.row_bytes(self.head_dim).ok_or_else(|| {
            EngineError::invalid(format!(
                "a {} KV cache cannot hold heads of {} values (q8_0 needs a multiple of 32; at \
                 most {MAX_HEAD_DIM})",
                ty.name(),
                self.head_dim
            ))
        })
    }
}

/// Storage of a sequence's keys and values, as the forward pass uses it.
pub trait KvCache: Send + Sync {
    /// Positions currently stored (the next position to write).
    fn len(&self) -> usize;

    /// Whether no position is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Make room for positions up to `new_len` (exclusive). Called before a forward pass
    /// writes them; fails when the cache cannot grow.
    fn reserve(&mut self, new_len: usize) -> Result<(), EngineError>;

    /// Store K and V for `positions` consecutive positions starting at `start` in `layer`:
    /// `k` and `v` hold `positions × kv_len` values.
    fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]);

    /// Record that positions `0..len` are now stored (after every layer wrote them).
    fn set_len(&mut self, len: usize);

    /// Attention of the query heads of `queries` consecutive positions, all sharing `kv_head`,
    /// against the stored `positions` of `layer`: `q` and `out` hold `queries × heads ×
    /// head_dim` values (query after query, each its heads one after another); the last query
    /// attends all of `positions`, query `i` the first `positions.len() − (queries − 1 − i)` of
    /// them, and for each head `out = softmax(scale · K q) · V`. `scores` is scratch space of
    /// at least `queries × heads × positions.len()` floats. Each head's result is independent
    /// of how many heads and queries are passed; every stored row is read once for all of them.
    #[allow(clippy::too_many_arguments)]
    fn attend_queries(
        &self,
        layer: usize,
        kv_head: usize,
        q: &[f32],
        queries: usize,
        positions: std::ops::Range<usize>,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    );

    /// [`KvCache::attend_queries`] for one query: its heads against `positions` (`0..n` for
    /// full attention, the window's last positions for a sliding-window layer).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        layer: usize,
        kv_head: usize,
        q: &[f32],
        positions: std::ops::Range<usize>,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        self.attend_queries(layer, kv_head, q, 1, positions, scale, out, scores);
    }

    /// Bytes of memory the cache holds.
    fn allocated_bytes(&self) -> usize;
}

// ---------------------------------------------------------------------------------------------
// Row encodings.

/// IEEE half bits → f32, exactly (branch-free, so loops over rows vectorize; the FP16
/// library's formula, as ggml's scalar fallback).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let w = u32::from(h) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let normalized = f32::from_bits((two_w >> 4) + (0xE0 << 23)) * f32::from_bits(0x0780_0000);
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let magnitude = if two_w < (1 << 27) {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | magnitude)
}

/// f32 → IEEE half bits, rounding to nearest even (branch-free; the FP16 library's formula).
#[inline(always)]
pub(crate) fn f32_to_f16(f: f32) -> u16 {
    let mut base = (f.abs() * f32::from_bits(0x7780_0000)) * f32::from_bits(0x0880_0000);
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// `x[i] = round_f16(x[i] · scale)`; with `X86_SIMD` 8 at a time by `vcvtps2ph`/`vcvtph2ps`,
/// which round to nearest even exactly as [`f32_to_f16`] does for finite values (the same
/// bits). `X86_SIMD` may only be true inside [`attend_runs_avx2`].
#[inline(always)]
fn round_f16_scaled<const X86_SIMD: bool>(x: &mut [f32], scale: f32) {
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if X86_SIMD {
        use std::arch::x86_64::{
            _MM_FROUND_TO_NEAREST_INT, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps,
            _mm256_mul_ps, _mm256_set1_ps, _mm256_storeu_ps,
        };
        for c in x.chunks_exact_mut(8) {
            // SAFETY: `X86_SIMD` is true only inside `attend_runs_avx2`, which runs after runtime
            // detection of AVX2 and F16C and is compiled with both; the load and store touch the
            // 8 floats of `c`, with unaligned-safe intrinsics.
            unsafe {
                let v = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), _mm256_set1_ps(scale));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
            done += 8;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        done += neon_f16::round_scaled(x, scale);
    }
    for v in &mut x[done..] {
        *v = round_f16(*v * scale);
    }
}

/// f16 conversions by NEON's `fcvtl` and `fcvtn`, 8 values at a time (base ARMv8 Advanced
/// SIMD, so every aarch64 CPU; stable Rust has no intrinsic for them yet, hence the assembly):
/// the same bits as [`f16_to_f32`] (exact) and, for finite values, [`f32_to_f16`] (round to
/// nearest even; Linux starts processes with FPCR's flush-to-zero off). The portable
/// formulas are about ten integer and float operations per value, counted in their source
/// (unmeasured on a Pi: no aarch64 hardware here).
#[cfg(target_arch = "aarch64")]
mod neon_f16 {
    use std::arch::aarch64::vst1q_f32;
    use std::arch::aarch64::{float32x4_t, uint16x8_t, vld1q_f32, vld1q_u16, vmulq_n_f32};
    use std::arch::asm;

    /// 8 halves → 8 floats.
    #[inline(always)]
    fn widen8(h: uint16x8_t) -> [float32x4_t; 2] {
        let (lo, hi): (float32x4_t, float32x4_t);
        // SAFETY: `fcvtl`/`fcvtl2` read and write vector registers only (NEON is part of the
        // aarch64 baseline); `out` operands never share the input's register.
        unsafe {
            asm!(
                "fcvtl {lo:v}.4s, {h:v}.4h",
                "fcvtl2 {hi:v}.4s, {h:v}.8h",
                h = in(vreg) h,
                lo = out(vreg) lo,
                hi = out(vreg) hi,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        [lo, hi]
    }

    /// `out[i] = f16_to_f32(src[2i], src[2i + 1])` for the first `8 · ⌊out.len() / 8⌋` values
    /// (`src` holds at least as many halves); returns how many.
    #[inline(always)]
    pub(super) fn widen(src: &[u8], out: &mut [f32]) -> usize {
        let mut done = 0;
        for (o, b) in out.chunks_exact_mut(8).zip(src.chunks_exact(16)) {
            // SAFETY: the load reads the 16 bytes of `b`, the stores write the 8 floats of `o`.
            unsafe {
                let [lo, hi] = widen8(vld1q_u16(b.as_ptr().cast()));
                vst1q_f32(o.as_mut_ptr(), lo);
                vst1q_f32(o[4..].as_mut_ptr(), hi);
            }
            done += 8;
        }
        done
    }

    /// `x[i] = round_f16(x[i] · scale)` for the first `8 · ⌊x.len() / 8⌋` values; returns how
    /// many.
    #[inline(always)]
    pub(super) fn round_scaled(x: &mut [f32], scale: f32) -> usize {
        let mut done = 0;
        for c in x.chunks_exact_mut(8) {
            // SAFETY: the loads read the 8 floats of `c`, the stores write them; `fcvtn` and
            // `fcvtn2` touch registers only (see `widen8`).
            unsafe {
                let lo = vmulq_n_f32(vld1q_f32(c.as_ptr()), scale);
                let hi = vmulq_n_f32(vld1q_f32(c[4..].as_ptr()), scale);
                let halves: uint16x8_t;
                asm!(
                    "fcvtn {h:v}.4h, {lo:v}.4s",
                    "fcvtn2 {h:v}.8h, {hi:v}.4s",
                    lo = in(vreg) lo,
                    hi = in(vreg) hi,
                    h = out(vreg) halves,
                    options(pure, nomem, nostack, preserves_flags),
                );
                let [lo, hi] = widen8(halves);
                vst1q_f32(c.as_mut_ptr(), lo);
                vst1q_f32(c[4..].as_mut_ptr(), hi);
            }
            done += 8;
        }
        done
    }
}

/// Σ x as f64, in four interleaved partial sums (independent dependency chains), combined
/// pairwise: one fixed order in every build.
#[inline(always)]
fn sum_f64(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut chunks = x.chunks_exact(4);
    for c in &mut chunks {
        for k in 0..4 {
            acc[k] += f64::from(c[k]);
        }
    }
    let mut sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for &v in chunks.remainder() {
        sum += f64::from(v);
    }
    sum
}

/// Encode one head's K row of `src.len()` values as position `col` of a K tile `width`
/// positions wide. K is cached in columns: an f32 or f16 tile holds value `d` of its position
/// `j` at element `d × width + j`, so one load reads one value of 16 consecutive positions, and
/// 16 scores accumulate in the lanes of a register with no transposition; a q8_0 tile holds
/// each 32-value block of every position together, the positions' scales and then their codes
/// four values at a time, the operand of one integer dot instruction over 16 positions
/// ([`crate::kv_q8`]). A tile's bytes are `width × row_bytes`.
pub(crate) fn encode_k(ty: KvType, src: &[f32], tile: &mut [u8], width: usize, col: usize) {
    debug_assert!(col < width);
    match ty {
        KvType::F32 => {
            for (d, &x) in src.iter().enumerate() {
                let at = (d * width + col) * 4;
                tile[at..at + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
        KvType::F16 => {
            for (d, &x) in src.iter().enumerate() {
                let at = (d * width + col) * 2;
                tile[at..at + 2].copy_from_slice(&f32_to_f16(x).to_le_bytes());
            }
        }
        KvType::Q8_0 => {
            let mut row = [0u8; MAX_HEAD_DIM / 32 * kv_q8::BLOCK_BYTES];
            let row = &mut row[..src.len() / 32 * kv_q8::BLOCK_BYTES];
            encode_row(ty, src, row);
            kv_q8::store_column(row, tile, width, col);
        }
    }
}

/// Encode one head's row of `src.len()` values as `ty` into `dst` (`ty.row_bytes` bytes).
pub(crate) fn encode_row(ty: KvType, src: &[f32], dst: &mut [u8]) {
    match ty {
        KvType::F32 => {
            for (d, &x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        KvType::F16 => {
            for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_f16(x).to_le_bytes());
            }
        }
        KvType::Q8_0 => airs_kernels::quantize_row(GgmlType::Q8_0, src, dst)
            .expect("q8_0 row geometry checked at cache creation"),
    }
}

/// Decode one head's row of `out.len()` values of type `ty`. With `X86_SIMD`, f16 values are
/// converted 8 at a time by the CPU's `vcvtph2ps` (exact, like the portable conversion: the
/// same bits). `X86_SIMD` may only be true inside [`attend_runs_avx2`] (AVX2 and F16C detected
/// at run time and enabled for the function).
#[inline(always)]
fn decode_row_with<const X86_SIMD: bool>(ty: KvType, src: &[u8], out: &mut [f32]) {
    match ty {
        KvType::F32 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        KvType::F16 => {
            #[cfg_attr(
                not(any(target_arch = "x86_64", target_arch = "aarch64")),
                allow(unused_mut)
            )]
            let mut done = 0;
            #[cfg(target_arch = "x86_64")]
            if X86_SIMD {
                use std::arch::x86_64::{
                    __m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps,
                };
                for (o, b) in out.chunks_exact_mut(8).zip(src.chunks_exact(16)) {
                    // SAFETY: `X86_SIMD` is true only inside `attend_runs_avx2`, which runs after
                    // runtime detection of AVX2 and F16C and is compiled with both; the load
                    // reads the 16 bytes of `b` and the store writes the 8 floats of `o`, both
                    // unaligned-safe intrinsics on in-bounds slices.
                    unsafe {
                        let h = _mm_loadu_si128(b.as_ptr().cast::<__m128i>());
                        _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(h));
                    }
                    done += 8;
                }
            }
            #[cfg(target_arch = "aarch64")]
            {
                done += neon_f16::widen(src, out);
            }
            for (o, b) in out[done..].iter_mut().zip(src[2 * done..].chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        KvType::Q8_0 => {
            // The codes converted into an array first: written as one loop over the codes
            // and the output, it compiled to a scalar conversion, multiply and store per value
            // (q8_0 attention calls now take 26-41 % less time; the same operations per value).
            for (o, b) in out
                .as_chunks_mut::<32>()
                .0
                .iter_mut()
                .zip(src.as_chunks::<34>().0)
            {
                let d = kv_q8::block_scale(b);
                let codes: [f32; 32] = std::array::from_fn(|k| f32::from(b[2 + k] as i8));
                for (o, c) in o.iter_mut().zip(codes) {
                    *o = c * d;
                }
            }
        }
    }
}

/// Query heads per pass of the portable [`score_pass`]: each head's 16 scores are two
/// accumulator arrays, which take several registers each outside AVX-512.
const PORTABLE_HEADS_PER_PASS: usize = 2;

/// Query heads per pass of [`score_pass_avx512`]: eight accumulator registers in flight.
const AVX512_HEADS_PER_PASS: usize = 4;

/// Where the K values of a chunk of up to 16 positions come from.
#[derive(Clone, Copy)]
enum KChunk<'a> {
    /// Decoded: value `d` of the chunk's positions at `[16·d ..]` (positions past the chunk's
    /// end zero).
    Decoded(&'a [f32]),
    /// In place, in an f16 or f32 tile `width` positions wide, from column `col0`, with 16
    /// columns from there inside the tile (AVX-512 only; positions past the chunk's end are
    /// read and ignored).
    #[cfg(target_arch = "x86_64")]
    Tile {
        ty: KvType,
        tile: &'a [u8],
        width: usize,
        col0: usize,
    },
}

/// `scores[h · n_ctx + j0 + j] = (q_h · k_j) · scale` for the `n ≤ 16` positions of a chunk
/// and every query head `h` of `q`, a pass of heads at a time. Each position's dot product is
/// two fused multiply-add chains in value order, one over the even values and one over the odd
/// ones, added at the end; that is every build's order (the 16 positions ride in the lanes, so
/// the portable loops vectorize as they are, and [`score_pass_avx512`] computes the same bits).
///
/// # Safety
/// A [`KChunk::Tile`] only with AVX-512 F and F16C (inside [`attend_runs_avx512`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_chunk(
    k: KChunk<'_>,
    q: &[f32],
    head_dim: usize,
    n: usize,
    scale: f32,
    scores: &mut [f32],
    n_ctx: usize,
    j0: usize,
) {
    let heads = q.len() / head_dim;
    assert!(n <= CHUNK_ROWS && j0 + n <= n_ctx && scores.len() >= heads * n_ctx);
    let per_pass = match k {
        KChunk::Decoded(cols) => {
            assert!(cols.len() >= CHUNK_ROWS * head_dim);
            PORTABLE_HEADS_PER_PASS
        }
        #[cfg(target_arch = "x86_64")]
        KChunk::Tile {
            ty,
            tile,
            width,
            col0,
        } => {
            let elem = ty.row_bytes(1).expect("f32 and f16 have a size");
            assert!(
                matches!(ty, KvType::F32 | KvType::F16) && tile.len() >= head_dim * width * elem
            );
            assert!(col0 + CHUNK_ROWS <= width);
            AVX512_HEADS_PER_PASS
        }
    };
    let mut h = 0;
    while h < heads {
        let pass = (heads - h).min(per_pass);
        let qs = &q[h * head_dim..(h + pass) * head_dim];
        let mut out = [[0.0f32; CHUNK_ROWS]; AVX512_HEADS_PER_PASS];
        match k {
            KChunk::Decoded(cols) => match pass {
                1 => score_pass::<1>(qs, head_dim, cols, scale, &mut out),
                _ => score_pass::<2>(qs, head_dim, cols, scale, &mut out),
            },
            #[cfg(target_arch = "x86_64")]
            KChunk::Tile {
                ty,
                tile,
                width,
                col0,
            } => {
                macro_rules! pass {
                    ($h:literal) => {
                        // SAFETY: AVX-512 F and F16C (contract); `qs` holds `$h` heads and
                        // every column read lies inside `tile` (asserted above).
                        unsafe {
                            if ty == KvType::F16 {
                                score_pass_avx512::<$h, true>(
                                    qs, head_dim, tile, width, col0, scale, &mut out,
                                )
                            } else {
                                score_pass_avx512::<$h, false>(
                                    qs, head_dim, tile, width, col0, scale, &mut out,
                                )
                            }
                        }
                    };
                }
                match pass {
                    1 => pass!(1),
                    2 => pass!(2),
                    3 => pass!(3),
                    _ => pass!(4),
                }
            }
        }
        for (i, o) in out[..pass].iter().enumerate() {
            let at = (h + i) * n_ctx + j0;
            scores[at..at + n].copy_from_slice(&o[..n]);
        }
        h += pass;
    }
}

/// [`scores_chunk`] for `H` heads from decoded columns.
#[inline(always)]
fn score_pass<const H: usize>(
    q: &[f32],
    head_dim: usize,
    cols: &[f32],
    scale: f32,
    out: &mut [[f32; CHUNK_ROWS]],
) {
    let mut even = [[0.0f32; CHUNK_ROWS]; H];
    let mut odd = [[0.0f32; CHUNK_ROWS]; H];
    let col = |d: usize| -> &[f32; CHUNK_ROWS] {
        cols[d * CHUNK_ROWS..(d + 1) * CHUNK_ROWS]
            .try_into()
            .expect("16 lanes")
    };
    // Value pairs as slices of one length, so that the loop indexes them without bounds checks
    // (two compare-and-branch pairs a step before): each head's (q_2p, q_2p+1) and the
    // columns 2p and 2p + 1 (32 values). With 64-column sums (`accumulate_rows`), 16-row
    // prefill blocks of Qwen2.5's attention went from 1,531 to 1,449 µs (medians of five).
    let pairs = head_dim / 2;
    let col_pairs = &cols.as_chunks::<{ 2 * CHUNK_ROWS }>().0[..pairs];
    let q_pairs: [&[[f32; 2]]; H] =
        std::array::from_fn(|h| &q[h * head_dim..][..2 * pairs].as_chunks::<2>().0[..pairs]);
    for (p, c) in col_pairs.iter().enumerate() {
        let (c0, c1) = c.split_at(CHUNK_ROWS);
        for h in 0..H {
            let [a, b] = q_pairs[h][p];
            for j in 0..CHUNK_ROWS {
                even[h][j] = a.mul_add(c0[j], even[h][j]);
                odd[h][j] = b.mul_add(c1[j], odd[h][j]);
            }
        }
    }
    if head_dim % 2 == 1 {
        let c = col(head_dim - 1);
        for h in 0..H {
            let a = q[h * head_dim + head_dim - 1];
            for j in 0..CHUNK_ROWS {
                even[h][j] = a.mul_add(c[j], even[h][j]);
            }
        }
    }
    for h in 0..H {
        for j in 0..CHUNK_ROWS {
            out[h][j] = (even[h][j] + odd[h][j]) * scale;
        }
    }
}

/// [`score_pass`] with 512-bit registers on `H` heads, columns read from the tile (f16 when
/// `F16`, else f32): the same chains, the same bits.
///
/// # Safety
/// AVX-512 F and F16C; `tile` holds `head_dim × width` values, `col0 + 16 ≤ width`, `q` holds
/// `H` heads of `head_dim` values and `out` at least `H` rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn score_pass_avx512<const H: usize, const F16: bool>(
    q: &[f32],
    head_dim: usize,
    tile: &[u8],
    width: usize,
    col0: usize,
    scale: f32,
    out: &mut [[f32; CHUNK_ROWS]],
) {
    use std::arch::x86_64::*;
    let elem = if F16 { 2 } else { 4 };
    assert!(tile.len() >= head_dim * width * elem && col0 + CHUNK_ROWS <= width);
    assert!(q.len() >= H * head_dim && out.len() >= H);
    // SAFETY: AVX-512 F and F16C are available (contract); column `d < head_dim` reads the
    // 16 values at element `d · width + col0`, inside `tile`; `q` reads stay below `H ·
    // head_dim` and every store writes the 16 values of `out[h]`, `h < H` (asserted above).
    unsafe {
        let (t, qp) = (tile.as_ptr(), q.as_ptr());
        // (A macro, not a closure: closures do not inherit the caller's target features, and
        // the intrinsics would become calls.)
        macro_rules! col {
            ($d:expr) => {{
                let at = t.add(($d * width + col0) * elem);
                if F16 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(at.cast()))
                } else {
                    _mm512_loadu_ps(at.cast())
                }
            }};
        }
        let mut even = [_mm512_setzero_ps(); H];
        let mut odd = [_mm512_setzero_ps(); H];
        for p in 0..head_dim / 2 {
            let (c0, c1) = (col!(2 * p), col!(2 * p + 1));
            for h in 0..H {
                let a = _mm512_set1_ps(*qp.add(h * head_dim + 2 * p));
                let b = _mm512_set1_ps(*qp.add(h * head_dim + 2 * p + 1));
                even[h] = _mm512_fmadd_ps(a, c0, even[h]);
                odd[h] = _mm512_fmadd_ps(b, c1, odd[h]);
            }
        }
        if head_dim % 2 == 1 {
            let c = col!(head_dim - 1);
            for (h, e) in even.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*qp.add(h * head_dim + head_dim - 1));
                *e = _mm512_fmadd_ps(a, c, *e);
            }
        }
        let scale = _mm512_set1_ps(scale);
        for h in 0..H {
            let s = _mm512_mul_ps(_mm512_add_ps(even[h], odd[h]), scale);
            _mm512_storeu_ps(out[h].as_mut_ptr(), s);
        }
    }
}

/// Columns `col0..col0 + n` of an f16 or f32 K tile `width` positions wide, decoded into
/// `cols` (value `d` of the chunk's positions at `cols[16·d ..]`, positions past `n` zero).
#[inline(always)]
fn decode_columns<const X86_SIMD: bool>(
    ty: KvType,
    tile: &[u8],
    width: usize,
    col0: usize,
    n: usize,
    cols: &mut [f32],
) {
    // A whole chunk's columns are rows of 16 halves `2 · width` bytes apart: one tight loop.
    // Through `decode_row_with`, each value's 16 positions were a call's worth of slicing,
    // matching and zipping: a fifth of the samples of one query's attention (Qwen2.5, 2,048
    // positions) sat in that loop, against 16 conversions of real work.
    #[cfg(target_arch = "x86_64")]
    if X86_SIMD && ty == KvType::F16 && n == CHUNK_ROWS {
        let values = cols.len() / CHUNK_ROWS;
        // SAFETY: `X86_SIMD` is true only inside `attend_runs_avx2`/`attend_runs_avx512`,
        // which run after runtime detection of AVX2 and F16C and are compiled with both.
        unsafe { f16_rows_avx2(&tile[2 * col0..], 2 * width, values, CHUNK_ROWS, cols) };
        return;
    }
    // The same shortcut for NEON: whole columns straight to its 8-lane conversion (unmeasured
    // on a Pi; the per-value overhead it skips is the one measured on x86-64).
    #[cfg(target_arch = "aarch64")]
    if ty == KvType::F16 && n == CHUNK_ROWS {
        for (d, o) in cols.chunks_exact_mut(CHUNK_ROWS).enumerate() {
            let at = (d * width + col0) * 2;
            let done = neon_f16::widen(&tile[at..at + 2 * CHUNK_ROWS], o);
            debug_assert_eq!(done, CHUNK_ROWS);
        }
        return;
    }
    let elem = ty.row_bytes(1).expect("f32 and f16 have a size");
    for (d, o) in cols.chunks_exact_mut(CHUNK_ROWS).enumerate() {
        let at = (d * width + col0) * elem;
        decode_row_with::<X86_SIMD>(ty, &tile[at..at + n * elem], &mut o[..n]);
        o[n..].fill(0.0);
    }
}

/// `out.len() / head_dim` V rows of `head_dim` values, row `i` at byte `i · stride` of `v`,
/// decoded into `out`: f16 rows by [`f16_rows_avx2`] when `X86_SIMD` and `head_dim` is a
/// multiple of 8, the rest a [`decode_row_with`] call a row.
#[inline(always)]
fn decode_rows<const X86_SIMD: bool>(
    ty: KvType,
    v: &[u8],
    stride: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if X86_SIMD && ty == KvType::F16 && head_dim.is_multiple_of(8) {
        let rows = out.len() / head_dim;
        // SAFETY: `X86_SIMD` is true only inside `attend_runs_avx2`/`attend_runs_avx512`,
        // which run after runtime detection of AVX2 and F16C and are compiled with both.
        unsafe { f16_rows_avx2(v, stride, rows, head_dim, out) };
        return;
    }
    let row_bytes = ty.row_bytes(head_dim).expect("row geometry checked");
    for (i, o) in out.chunks_exact_mut(head_dim).enumerate() {
        decode_row_with::<X86_SIMD>(ty, &v[i * stride..i * stride + row_bytes], o);
    }
}

/// `rows` f16 rows of `head_dim` values (a multiple of 8), row `i` at byte `i · stride` of
/// `v`, decoded into `out` (`rows · head_dim` floats) by one tight loop of `vcvtph2ps` and
/// stores: V rows ([`decode_rows`]) and a chunk's K columns ([`decode_columns`]).
///
/// # Safety
/// AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn f16_rows_avx2(v: &[u8], stride: usize, rows: usize, head_dim: usize, out: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    assert!(head_dim.is_multiple_of(8) && out.len() >= rows * head_dim);
    assert!(rows == 0 || (rows - 1) * stride + 2 * head_dim <= v.len());
    let (src, dst) = (v.as_ptr(), out.as_mut_ptr());
    for i in 0..rows {
        for c in (0..head_dim).step_by(8) {
            // SAFETY: AVX2 and F16C (contract); row `i`'s halves `c..c + 8` lie inside `v` and
            // its floats inside `out` (asserted above); unaligned-safe loads and stores.
            unsafe {
                let h = _mm_loadu_si128(src.add(i * stride + 2 * c).cast::<__m128i>());
                _mm256_storeu_ps(dst.add(i * head_dim + c), _mm256_cvtph_ps(h));
            }
        }
    }
}

/// `out += Σ_i w[i] · row i` over the rows of `rows` (each `out.len()` values), every element
/// summed in row order by fused multiply-adds; columns go 64, 32, 16 or 8 at a time through
/// registers when the width allows (a sum kept in memory instead waits on its own store at
/// every row: stories260K's 8-value heads spent 40 % of their attention there). 64 columns
/// are eight independent chains of 256-bit fused multiply-adds, enough to cover their latency;
/// 32 were four, and a 64-value head (TinyLlama, Qwen2.5) waited on them. One thread's
/// attention over 2,048 positions (`cargo bench -p airs-engine --bench attention`, f16, Zen
/// 3, medians of five alternated runs): 64 columns alone took a 16-row prefill block of
/// Qwen2.5 from 1,637 to 1,531 µs; with [`score_pass`]'s unchecked loop besides, to 1,449,
/// and one query of TinyLlama from 145.5 to 129.8 µs.
#[inline(always)]
fn accumulate_rows(out: &mut [f32], w: &[f32], rows: &[f32]) {
    let n = out.len();
    if n.is_multiple_of(64) {
        accumulate_columns::<64>(out, w, rows);
    } else if n.is_multiple_of(32) {
        accumulate_columns::<32>(out, w, rows);
    } else if n.is_multiple_of(16) {
        accumulate_columns::<16>(out, w, rows);
    } else if n.is_multiple_of(8) {
        accumulate_columns::<8>(out, w, rows);
    } else {
        for (&wi, row) in w.iter().zip(rows.chunks_exact(n)) {
            for (o, &x) in out.iter_mut().zip(row) {
                *o = wi.mul_add(x, *o);
            }
        }
    }
}

/// [`accumulate_rows`] for a width that is a multiple of `C`: `C` columns at a time, their sums
/// in registers across the rows.
#[inline(always)]
fn accumulate_columns<const C: usize>(out: &mut [f32], w: &[f32], rows: &[f32]) {
    let n = out.len();
    for c in (0..n).step_by(C) {
        let o: &mut [f32; C] = (&mut out[c..c + C]).try_into().expect("C columns");
        let mut acc = *o;
        for (&wi, row) in w.iter().zip(rows.chunks_exact(n)) {
            let r: &[f32; C] = row[c..c + C].try_into().expect("C columns");
            for k in 0..C {
                acc[k] = wi.mul_add(r[k], acc[k]);
            }
        }
        *o = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// The attention kernel.

/// Where a software prefetch brings its lines.
#[derive(Copy, Clone)]
enum Near {
    /// Into L1 (`prefetcht0`): the run computed next.
    L1,
    /// Into L2 (`prefetcht1`): a run further ahead.
    L2,
}

/// Runs ahead of the one being computed that the attention kernel asks for into L2 (the next
/// one besides goes into L1; a pass's first runs are asked for before it starts, V's during
/// the softmax). A paged cache's runs lie in separate blocks, where the hardware prefetchers
/// lose the stream; a run of one KV head is 16 positions (2 KiB of f16 K for a 64-value head,
/// as much of V), which its heads compute in less time than DRAM takes to answer. With one run
/// ahead into L1 only, half of the kernel's profile in a Qwen2.5 decode at 2048 positions was
/// waiting on memory. Measured (BENCHMARKS.md, `cargo bench -p airs-engine --bench attention`,
/// one thread): f16 from DRAM (8192 positions) 18-29 % less time a call, from L3 (Qwen2.5
/// and TinyLlama at 2048) the same, f32 less still, q8_0 within 2 % (its dots are the bound);
/// Gemma 3's f32 at 2048 12 % more (asking for its 16 KiB runs two ahead did not help). Only
/// into L1, 2 or 4 runs ahead, was faster from L3 and slower from DRAM; only into L2, faster
/// for 2 KiB runs and slower for larger ones; every run at once, into L2, cost more than it
/// saved.
const PREFETCH_RUNS: usize = 4;

/// Ask the CPU to start loading `bytes` into `near`.
#[inline(always)]
fn prefetch(bytes: &[u8], near: Near) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..bytes.len()).step_by(64) {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        let line = bytes[at..].as_ptr().cast();
        // SAFETY: a prefetch is only a hint: it never faults, has no architectural effect,
        // and the address lies inside a live slice anyway.
        unsafe {
            match near {
                Near::L1 => _mm_prefetch::<_MM_HINT_T0>(line),
                Near::L2 => _mm_prefetch::<_MM_HINT_T1>(line),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, near);
}

/// The prefetches that start a pass over `runs` runs, `bytes(i)` giving run `i`'s bytes: the
/// first into L1, the next [`PREFETCH_RUNS`] − 1 into L2.
#[inline(always)]
fn prefetch_first_runs<'a>(runs: usize, bytes: impl Fn(usize) -> &'a [u8]) {
    if runs > 0 {
        prefetch(bytes(0), Near::L1);
    }
    for i in 1..PREFETCH_RUNS.min(runs) {
        prefetch(bytes(i), Near::L2);
    }
}

/// The prefetches due while run `r` is computed (after [`prefetch_first_runs`]): the next run
/// into L1, the one [`PREFETCH_RUNS`] ahead into L2.
#[inline(always)]
fn prefetch_next_runs<'a>(r: usize, runs: usize, bytes: impl Fn(usize) -> &'a [u8]) {
    if r + 1 < runs {
        prefetch(bytes(r + 1), Near::L1);
    }
    if r + PREFETCH_RUNS < runs {
        prefetch(bytes(r + PREFETCH_RUNS), Near::L2);
    }
}

/// `rows` consecutive cached positions of one KV head. K lies in a tile of `width` positions
/// (see [`encode_k`]), the run's positions from `first` on; row `i` of V starts at
/// byte `i × stride` of `v` and holds one head's row.
pub(crate) struct RowRun<'a> {
    pub k: &'a [u8],
    pub width: usize,
    pub first: usize,
    pub v: &'a [u8],
    pub rows: usize,
    pub stride: usize,
}

/// Rows decoded at a time (the paged cache's default block size).
pub(crate) const CHUNK_ROWS: usize = 16;

/// Grouped-query attention over cached rows of type `ty` supplied as `runs` runs by `run`,
/// covering positions `0..n_ctx` in order: for each of the `q.len() / head_dim` query heads,
/// `out_h = softmax(scale · K q_h) · V`. `scores` needs `heads × n_ctx` floats.
///
/// The heads may belong to `queries` consecutive positions of one sequence (causal prefill:
/// `q` holds query 0's heads, then query 1's, …): query `i` of `queries` attends positions
/// `0..n_ctx − (queries − 1 − i)`, so the last attends all `n_ctx`. Every head's result is the
/// one it gets alone (the same dot products, its own softmax over its own positions, its own
/// rows accumulated in order), while the rows are read and decoded once for all the queries.
///
/// On x86-64 CPUs with AVX2 the same code is compiled for 256-bit vectors, and with AVX-512 F
/// with two 512-bit kernels besides (these builds require FMA). Every multiply-add is fused
/// (`mul_add`, one rounding, as ggml's vector dots and `vec_mad` use FMA), Rust never
/// reorders float operations and the kernels keep the portable order, so every build computes
/// bit-identical results; only the speed differs (aarch64's baseline NEON, which has FMA, needs
/// no second build).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_runs<'a, F: Fn(usize) -> RowRun<'a>>(
    ty: KvType,
    head_dim: usize,
    runs: usize,
    run: F,
    q: &[f32],
    queries: usize,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if x86_attention_builds() && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512 F, AVX2, F16C and FMA (checked just above), the
        // only requirement of a `target_feature(enable = "avx512f,avx2,f16c,fma")` function.
        unsafe {
            attend_runs_avx512(
                ty, head_dim, runs, run, q, queries, n_ctx, scale, out, scores,
            )
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if x86_attention_builds() {
        // SAFETY: the CPU supports AVX2, F16C and FMA (checked just above), the only
        // requirement of a `target_feature(enable = "avx2,f16c,fma")` function.
        unsafe {
            attend_runs_avx2(
                ty, head_dim, runs, run, q, queries, n_ctx, scale, out, scores,
            )
        };
        return;
    }
    attend_runs_any::<false, false, _>(
        ty, head_dim, runs, run, q, queries, n_ctx, scale, out, scores,
    );
}

/// Whether this CPU has what both x86-64 attention builds need (AVX2, F16C, FMA); the
/// AVX-512 build needs AVX-512 F besides.
#[cfg(target_arch = "x86_64")]
fn x86_attention_builds() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("f16c")
        && std::arch::is_x86_feature_detected!("fma")
}

/// An x86-64 build of [`attend_runs_any`] for the CPU features `$features`.
macro_rules! attend_build {
    ($(#[$doc:meta])* $name:ident, $features:literal, $x86:literal, $avx512:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        fn $name<'a, F: Fn(usize) -> RowRun<'a>>(
            ty: KvType,
            head_dim: usize,
            runs: usize,
            run: F,
            q: &[f32],
            queries: usize,
            n_ctx: usize,
            scale: f32,
            out: &mut [f32],
            scores: &mut [f32],
        ) {
            attend_runs_any::<$x86, $avx512, _>(
                ty, head_dim, runs, run, q, queries, n_ctx, scale, out, scores,
            );
        }
    };
}

attend_build!(
    /// [`attend_runs`] compiled for AVX2, converting f16 rows with F16C.
    attend_runs_avx2, "avx2,f16c,fma", true, false
);
attend_build!(
    /// [`attend_runs`] compiled for AVX-512: as the AVX2 build, with f16 and f32 K columns and
    /// V rows read straight from the cache into 512-bit registers, several query heads at a
    /// time ([`scores_chunk`], [`accumulate_runs_avx512`]) — the same bits.
    attend_runs_avx512, "avx512f,avx2,f16c,fma", true, true
);

/// Query heads per pass of [`accumulate_runs_avx512`]: a query's heads up to eight (a group
/// of TinyLlama's and Qwen2.5's), so that every V row is read once per column block.
#[cfg(target_arch = "x86_64")]
const AVX512_V_HEADS_PER_PASS: usize = 8;

/// A run of V rows for [`accumulate_runs_avx512`]: `rows` rows, row `i` at byte `i × stride`
/// of `v`.
#[cfg(target_arch = "x86_64")]
struct VRun<'a> {
    v: &'a [u8],
    rows: usize,
    stride: usize,
}

/// [`accumulate_rows`] for the `heads = out.len() / head_dim ≤ 8` heads of `out` at once, over
/// the first `len` rows of `runs` (f32, f16 or q8_0 values) read straight from the cache:
/// `out_h += Σ_i w[h · w_stride + i] · row i`, every element summed in row order by fused
/// multiply-adds (the same bits; a q8_0 value is decoded as its code times its block's scale,
/// as [`decode_row_with`] does). The runs go in windows of [`V_WINDOW_BYTES`] of rows (at least
/// a run), each swept once per block of columns (64 for up to four heads, 32 for more) with the
/// heads' sums for the block in registers from the window's first row to its last. The first
/// sweep of a window prefetches the next run's rows whole into L1 and the run
/// [`PREFETCH_RUNS`] ahead into L2, and the later sweeps read the window from cache. (Summed
/// one run of 16 rows at a time, each sum loaded and stored per run and pass, TinyLlama's
/// weighted sum over 2,048 positions took 27 µs of the call's 70, against 18 for its
/// multiply-adds at one a cycle; this way every call is 8-15 % shorter: BENCHMARKS.md.)
///
/// # Safety
/// AVX-512 F and F16C (the caller is [`attend_runs_avx512`]); `head_dim` a multiple of 16
/// (of 32 for q8_0); every run's `v` holds its `rows` rows of `stride` bytes (the last one at
/// least a row), the runs at least `len` rows together; `w` holds `(heads − 1) · w_stride +
/// len` weights.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_runs_avx512(
    ty: KvType,
    out: &mut [f32],
    head_dim: usize,
    w: &[f32],
    w_stride: usize,
    runs: &[VRun<'_>],
    len: usize,
) {
    let heads = out.len() / head_dim;
    let row_bytes = ty.row_bytes(head_dim).expect("the cache's row geometry");
    assert!(head_dim.is_multiple_of(16) && len > 0);
    assert!((1..=AVX512_V_HEADS_PER_PASS).contains(&heads) && out.len() == heads * head_dim);
    assert!(w.len() >= (heads - 1) * w_stride + len);
    assert!(runs.iter().map(|r| r.rows).sum::<usize>() >= len);
    assert!(
        runs.iter()
            .all(|r| r.rows == 0 || r.v.len() >= (r.rows - 1) * r.stride + row_bytes)
    );
    let widest = if heads > 4 { 2 } else { 4 };
    // Windows of runs of at most `V_WINDOW_BYTES` of rows (at least a run each).
    let mut first = 0;
    let mut done = 0;
    while first < runs.len() && done < len {
        let mut end = first + 1;
        let mut bytes = runs[first].rows * runs[first].stride;
        while end < runs.len() && bytes + runs[end].rows * runs[end].stride <= V_WINDOW_BYTES {
            bytes += runs[end].rows * runs[end].stride;
            end += 1;
        }
        let rows = runs[first..end]
            .iter()
            .map(|r| r.rows)
            .sum::<usize>()
            .min(len - done);
        // SAFETY: as this function's, for the window's rows `done..done + rows` of the
        // `len` (the weights from `done` on).
        unsafe {
            accumulate_window(
                ty,
                out,
                head_dim,
                &w[done..],
                w_stride,
                (runs, first..end),
                rows,
                widest,
            )
        };
        done += rows;
        first = end;
    }
}

/// All the runs, and the range of them a window holds.
#[cfg(target_arch = "x86_64")]
type Window<'r, 'a> = (&'r [VRun<'a>], std::ops::Range<usize>);

/// Bytes of V rows [`accumulate_runs_avx512`] sweeps once per block of columns: half of L1, so
/// that the window stays there beside the scores (16, 32 and 128 KiB measured within 3 %).
#[cfg(target_arch = "x86_64")]
const V_WINDOW_BYTES: usize = 16 << 10;

/// [`accumulate_runs_avx512`] over the first `len` rows of the window `runs.0[runs.1]`,
/// `widest` registers of columns a sweep.
///
/// # Safety
/// As [`accumulate_runs_avx512`], for the window's runs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_window(
    ty: KvType,
    out: &mut [f32],
    head_dim: usize,
    w: &[f32],
    w_stride: usize,
    runs: Window<'_, '_>,
    len: usize,
    widest: usize,
) {
    let heads = out.len() / head_dim;
    let mut c = 0;
    while c < head_dim {
        let regs = ((head_dim - c) / 16).min(widest);
        macro_rules! go {
            ($h:literal, $c:literal) => {
                // SAFETY: AVX-512 F and F16C (contract); columns `c..c + 16·regs ≤ head_dim`
                // of each head's output and of the runs' first `len` rows lie inside `out`
                // and the runs, and the weights inside `w` (asserted above).
                unsafe {
                    match ty {
                        KvType::F32 => accumulate_block::<$h, $c, V_F32>(
                            out,
                            head_dim,
                            c,
                            w,
                            w_stride,
                            (runs.0, runs.1.clone()),
                            len,
                        ),
                        KvType::F16 => accumulate_block::<$h, $c, V_F16>(
                            out,
                            head_dim,
                            c,
                            w,
                            w_stride,
                            (runs.0, runs.1.clone()),
                            len,
                        ),
                        KvType::Q8_0 => accumulate_block::<$h, $c, V_Q8_0>(
                            out,
                            head_dim,
                            c,
                            w,
                            w_stride,
                            (runs.0, runs.1.clone()),
                            len,
                        ),
                    }
                }
            };
        }
        macro_rules! by_regs {
            ($h:literal) => {
                match regs {
                    1 => go!($h, 1),
                    2 => go!($h, 2),
                    3 => go!($h, 3),
                    _ => go!($h, 4),
                }
            };
        }
        macro_rules! by_regs_narrow {
            ($h:literal) => {
                match regs {
                    1 => go!($h, 1),
                    _ => go!($h, 2),
                }
            };
        }
        match heads {
            1 => by_regs!(1),
            2 => by_regs!(2),
            3 => by_regs!(3),
            4 => by_regs!(4),
            5 => by_regs_narrow!(5),
            6 => by_regs_narrow!(6),
            7 => by_regs_narrow!(7),
            _ => by_regs_narrow!(8),
        }
        c += 16 * regs;
    }
}

/// [`accumulate_block`]'s V element types.
#[cfg(target_arch = "x86_64")]
const V_F32: u8 = 0;
#[cfg(target_arch = "x86_64")]
const V_F16: u8 = 1;
#[cfg(target_arch = "x86_64")]
const V_Q8_0: u8 = 2;

/// Columns `c..c + 16·C` of [`accumulate_runs_avx512`] for `H` heads, V of element type `V`
/// ([`V_F32`], [`V_F16`], [`V_Q8_0`]).
///
/// # Safety
/// As [`accumulate_runs_avx512`], with `c + 16·C ≤ head_dim` and `H` heads in `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_block<const H: usize, const C: usize, const V: u8>(
    out: &mut [f32],
    head_dim: usize,
    c: usize,
    w: &[f32],
    w_stride: usize,
    (runs, window): Window<'_, '_>,
    len: usize,
) {
    use std::arch::x86_64::*;
    let ty = match V {
        V_F32 => KvType::F32,
        V_F16 => KvType::F16,
        _ => KvType::Q8_0,
    };
    let row_bytes = ty.row_bytes(head_dim).expect("the cache's row geometry");
    assert!(c + 16 * C <= head_dim && out.len() >= H * head_dim);
    assert!(V != V_Q8_0 || (head_dim.is_multiple_of(32) && c.is_multiple_of(16)));
    assert!(w.len() >= (H - 1) * w_stride + len);
    // The first sweep over a window prefetches run `r`'s rows into `near` (the window's next
    // runs, and the next window's first ones): this head's rows only, not the run's whole
    // slice as `prefetch_next_runs` would, which in a paged block spans every KV head's rows
    // (with it, TinyLlama's f32 calls over 8,192 positions took 12 % longer).
    let prefetch_run = |r: usize, near: Near| {
        if let Some(run) = runs.get(r).filter(|_| c == 0) {
            for i in 0..run.rows {
                let at = i * run.stride;
                prefetch(&run.v[at..at + row_bytes], near);
            }
        }
    };
    // SAFETY: AVX-512 F and F16C (contract); loads and stores touch columns `c..c + 16·C` of
    // the `H` heads' outputs and of each run's rows `i < rows` (inside its `v`: the caller),
    // and weights `h · w_stride + j` for `j < len`, all inside the slices (asserted above).
    unsafe {
        // (Loops, not `array::from_fn`: a closure does not inherit the target features, and
        // its intrinsics would become calls.)
        let mut acc = [[_mm512_setzero_ps(); C]; H];
        for (h, a) in acc.iter_mut().enumerate() {
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(out.as_ptr().add(h * head_dim + c + 16 * j));
            }
        }
        if window.start == 0 {
            prefetch_run(0, Near::L1);
            for r in 1..PREFETCH_RUNS {
                prefetch_run(r, Near::L2);
            }
        }
        let mut j0 = 0;
        for (r, run) in runs[window.clone()].iter().enumerate() {
            let r = window.start + r;
            if j0 >= len {
                break;
            }
            prefetch_run(r + 1, Near::L1);
            prefetch_run(r + PREFETCH_RUNS, Near::L2);
            let n = run.rows.min(len - j0);
            let wp = w.as_ptr().add(j0);
            for i in 0..n {
                let row = run.v.as_ptr().add(i * run.stride);
                let mut x = [_mm512_setzero_ps(); C];
                for (j, x) in x.iter_mut().enumerate() {
                    let col = c + 16 * j;
                    *x = match V {
                        V_F32 => _mm512_loadu_ps(row.add(4 * col).cast()),
                        V_F16 => _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * col).cast())),
                        _ => {
                            // Code times its block's scale: the value `decode_row_with` gives.
                            let block = row.add(col / 32 * kv_q8::BLOCK_BYTES);
                            let d = f16_to_f32(u16::from_le_bytes([*block, *block.add(1)]));
                            let codes = _mm_loadu_si128(block.add(2 + col % 32).cast());
                            let codes = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
                            _mm512_mul_ps(codes, _mm512_set1_ps(d))
                        }
                    };
                }
                for (h, a) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wp.add(h * w_stride + i));
                    for (a, &x) in a.iter_mut().zip(&x) {
                        *a = _mm512_fmadd_ps(wv, x, *a);
                    }
                }
            }
            j0 += n;
        }
        for (h, a) in acc.iter().enumerate() {
            for (j, &a) in a.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(h * head_dim + c + 16 * j), a);
            }
        }
    }
}

/// The body of [`attend_runs`], inlined into each instruction-set build. `AVX512` may only be
/// true inside [`attend_runs_avx512`], `X86_SIMD` inside it or [`attend_runs_avx2`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_runs_any<'a, const X86_SIMD: bool, const AVX512: bool, F: Fn(usize) -> RowRun<'a>>(
    ty: KvType,
    head_dim: usize,
    runs: usize,
    run: F,
    q: &[f32],
    queries: usize,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut [f32],
) {
    assert!(head_dim <= MAX_HEAD_DIM && head_dim > 0);
    let heads = q.len() / head_dim;
    assert!(
        queries >= 1 && heads.is_multiple_of(queries) && queries <= n_ctx,
        "every query has its heads and at least one position"
    );
    // Positions head `h` attends: its query's causal prefix.
    let per_query = heads / queries;
    let row_len = |h: usize| n_ctx + 1 + h / per_query - queries;
    let row_bytes = ty.row_bytes(head_dim).expect("row geometry checked");
    let scores = &mut scores[..heads * n_ctx];
    // The query in the encoding the K rows are multiplied in.
    let mut q_f32 = Vec::new();
    let mut q_q8 = None;
    match ty {
        KvType::F32 => q_f32.extend_from_slice(q),
        KvType::F16 => q_f32.extend(q.iter().map(|&x| round_f16(x))),
        KvType::Q8_0 => {
            let quantize = |src: &[f32], dst: &mut [u8]| encode_row(KvType::Q8_0, src, dst);
            let query = kv_q8::Query::new(q, head_dim, row_bytes, quantize);
            q_q8 = Some((query, kv_q8::Kernel::detect()));
        }
    }
    let mut rows_buf = vec![0.0f32; CHUNK_ROWS * head_dim];

    // Scores, up to 16 positions at a time for every head: K read in place (AVX-512, whole
    // 16-column chunks) or decoded once per chunk.
    let mut j0 = 0;
    // K is in columns: a run's bytes are its whole tile.
    prefetch_first_runs(runs, |i| run(i).k);
    for r in 0..runs {
        let this = run(r);
        prefetch_next_runs(r, runs, |i| run(i).k);
        let mut i0 = 0;
        while i0 < this.rows {
            let n = (this.rows - i0).min(CHUNK_ROWS);
            let col0 = this.first + i0;
            if let Some((q8, q8_kernel)) = &q_q8 {
                let (tile, width) = (this.k, this.width);
                kv_q8::scores(
                    *q8_kernel, tile, width, col0, n, q8, scale, scores, n_ctx, j0,
                );
            } else {
                #[cfg(target_arch = "x86_64")]
                let chunk = if AVX512 && col0 + CHUNK_ROWS <= this.width {
                    KChunk::Tile {
                        ty,
                        tile: this.k,
                        width: this.width,
                        col0,
                    }
                } else {
                    decode_columns::<X86_SIMD>(ty, this.k, this.width, col0, n, &mut rows_buf);
                    KChunk::Decoded(&rows_buf)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let chunk = {
                    decode_columns::<X86_SIMD>(ty, this.k, this.width, col0, n, &mut rows_buf);
                    KChunk::Decoded(&rows_buf)
                };
                // SAFETY: a tile chunk only when `AVX512`, true only inside
                // `attend_runs_avx512` after runtime detection of AVX-512 F and F16C.
                unsafe { scores_chunk(chunk, &q_f32, head_dim, n, scale, scores, n_ctx, j0) };
            }
            i0 += n;
            j0 += n;
        }
    }
    assert_eq!(j0, n_ctx, "runs must cover n_ctx positions");

    // Softmax per head (f64 sum, as ggml), leaving the weights in `scores`, while the first V
    // runs load.
    prefetch_first_runs(runs, |i| run(i).v);
    for (h, s) in scores.chunks_exact_mut(n_ctx).enumerate() {
        let s = &mut s[..row_len(h)];
        let (max, _) = crate::math::largest(s);
        for x in s.iter_mut() {
            *x = crate::math::exp(*x - max);
        }
        let sum = sum_f64(s);
        let inv = (1.0 / sum) as f32;
        if ty == KvType::F16 {
            round_f16_scaled::<X86_SIMD>(s, inv);
        } else {
            for x in s.iter_mut() {
                *x *= inv;
            }
        }
    }

    // Weighted sum of V rows, in position order for every head.
    out[..heads * head_dim].fill(0.0);
    #[cfg(target_arch = "x86_64")]
    if AVX512 && head_dim.is_multiple_of(16) {
        // Straight from the cache, a query's heads up to eight at a time (they share their
        // positions), their sums in registers over all the runs.
        let v_runs: Vec<VRun<'_>> = (0..runs)
            .map(|r| {
                let RowRun {
                    v, rows, stride, ..
                } = run(r);
                VRun { v, rows, stride }
            })
            .collect();
        let mut h = 0;
        while h < heads {
            let query_end = (h / per_query + 1) * per_query;
            let pass = (query_end - h).min(AVX512_V_HEADS_PER_PASS);
            let oh = &mut out[h * head_dim..(h + pass) * head_dim];
            let w = &scores[h * n_ctx..];
            // SAFETY: `AVX512` is true only inside `attend_runs_avx512`, after runtime
            // detection of AVX-512 F and F16C; `head_dim` is a multiple of 16 (of 32 for
            // q8_0); the runs cover `n_ctx ≥ row_len(h)` rows, and `scores` holds each head's
            // `n_ctx` weights.
            unsafe { accumulate_runs_avx512(ty, oh, head_dim, w, n_ctx, &v_runs, row_len(h)) };
            h += pass;
        }
        return;
    }
    let mut j0 = 0;
    for r in 0..runs {
        let RowRun {
            v, rows, stride, ..
        } = run(r);
        prefetch_next_runs(r, runs, |i| run(i).v);
        let mut i0 = 0;
        while i0 < rows {
            let n = (rows - i0).min(CHUNK_ROWS);
            let buf = &mut rows_buf[..n * head_dim];
            decode_rows::<X86_SIMD>(ty, &v[i0 * stride..], stride, head_dim, buf);
            for h in 0..heads {
                // Rows past the head's own positions are not its to accumulate.
                let n = n.min(row_len(h).saturating_sub(j0));
                if n > 0 {
                    let w = &scores[h * n_ctx + j0..h * n_ctx + j0 + n];
                    accumulate_rows(&mut out[h * head_dim..(h + 1) * head_dim], w, buf);
                }
            }
            i0 += n;
            j0 += n;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The contiguous cache.

/// A contiguous cache holding `capacity` positions for every layer.
pub struct ContiguousKv {
    shape: KvShape,
    ty: KvType,
    /// Bytes of one head's row.
    row_bytes: usize,
    capacity: usize,
    len: usize,
    /// Per layer: K, tiles of [`CHUNK_ROWS`] positions, each one tile per KV head (see
    /// [`encode_k`]); then V, `capacity × kv_heads` rows, position-major.
    layers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl ContiguousKv {
    /// A cache of `capacity` positions. Panics if `ty` cannot hold `shape`'s heads (q8_0 needs
    /// `head_dim` to be a multiple of 32); see [`ContiguousKv::try_new`].
    pub fn new(shape: KvShape, capacity: usize, ty: KvType) -> ContiguousKv {
        ContiguousKv::try_new(shape, capacity, ty).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_new(
        shape: KvShape,
        capacity: usize,
        ty: KvType,
    ) -> Result<ContiguousKv, EngineError> {
        let row_bytes = shape.checked_row_bytes(ty)?;
        let v_bytes = capacity * shape.kv_heads * row_bytes;
        let k_bytes = capacity.next_multiple_of(CHUNK_ROWS) * shape.kv_heads * row_bytes;
        Ok(ContiguousKv {
            shape,
            ty,
            row_bytes,
            capacity,
            len: 0,
            layers: (0..shape.layers)
                .map(|_| (vec![0; k_bytes], vec![0; v_bytes]))
                .collect(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }
}

impl KvCache for ContiguousKv {
    fn len(&self) -> usize {
        self.len
    }

    fn reserve(&mut self, new_len: usize) -> Result<(), EngineError> {
        if new_len > self.capacity {
            return Err(EngineError::new(EngineErrorKind::ContextFull {
                needed: new_len,
                capacity: self.capacity,
            }));
        }
        Ok(())
    }

    fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let (hd, rb, heads) = (self.shape.head_dim, self.row_bytes, self.shape.kv_heads);
        let tile_bytes = CHUNK_ROWS * rb;
        let (ks, vs) = &mut self.layers[layer];
        let at = start * heads * rb;
        for (i, (ksrc, vsrc)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let (pos, head) = (start + i / heads, i % heads);
            let tile = (pos / CHUNK_ROWS * heads + head) * tile_bytes;
            encode_k(
                self.ty,
                ksrc,
                &mut ks[tile..tile + tile_bytes],
                CHUNK_ROWS,
                pos % CHUNK_ROWS,
            );
            let d = at + i * rb;
            encode_row(self.ty, vsrc, &mut vs[d..d + rb]);
        }
    }

    fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// The shared attention kernel over `positions`, one run per K tile.
    fn attend_queries(
        &self,
        layer: usize,
        kv_head: usize,
        q: &[f32],
        queries: usize,
        positions: std::ops::Range<usize>,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let (ks, vs) = &self.layers[layer];
        let (rb, heads) = (self.row_bytes, self.shape.kv_heads);
        let (stride, tile_bytes) = (heads * rb, CHUNK_ROWS * rb);
        assert!(!positions.is_empty(), "attention over no positions");
        let first_tile = positions.start / CHUNK_ROWS;
        let last_tile = (positions.end - 1) / CHUNK_ROWS;
        let run = |r: usize| {
            let t = first_tile + r;
            let lo = positions.start.saturating_sub(t * CHUNK_ROWS);
            let hi = (positions.end - t * CHUNK_ROWS).min(CHUNK_ROWS);
            let k = (t * heads + kv_head) * tile_bytes;
            // V's bytes end with the run's last row (the prefetch covers exactly them).
            let v = (t * CHUNK_ROWS + lo) * stride + kv_head * rb;
            RowRun {
                k: &ks[k..k + tile_bytes],
                width: CHUNK_ROWS,
                first: lo,
                v: &vs[v..v + (hi - lo - 1) * stride + rb],
                rows: hi - lo,
                stride,
            }
        };
        attend_runs(
            self.ty,
            self.shape.head_dim,
            last_tile - first_tile + 1,
            run,
            q,
            queries,
            positions.len(),
            scale,
            out,
            scores,
        );
    }

    fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn bytes_per_token_follow_the_element_encodings() {
        // Qwen2.5 0.5B: 24 layers, 2 KV heads of 64.
        let qwen = KvShape {
            layers: 24,
            kv_heads: 2,
            head_dim: 64,
        };
        assert_eq!(qwen.bytes_per_token(KvType::F16), Some(2 * 24 * 2 * 64 * 2));
        assert_eq!(qwen.bytes_per_token(KvType::F32), Some(2 * 24 * 2 * 64 * 4));
        assert_eq!(qwen.bytes_per_token(KvType::Q8_0), Some(2 * 24 * 2 * 68));
        // §6.3: Llama 3 8B, 32 layers × 8 KV heads × 128, q8_0 → 68 KiB per token.
        let llama8b = KvShape {
            layers: 32,
            kv_heads: 8,
            head_dim: 128,
        };
        assert_eq!(llama8b.bytes_per_token(KvType::Q8_0), Some(68 * 1024));
        let odd = KvShape {
            layers: 5,
            kv_heads: 4,
            head_dim: 8,
        };
        assert_eq!(odd.bytes_per_token(KvType::Q8_0), None);
        assert_eq!("q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert!("q4_0".parse::<KvType>().is_err());
    }

    #[test]
    fn f16_conversions_match_the_half_crate() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}"
            );
        }
        let mut x = 0x1234_5678u32;
        let check = |f: f32| {
            let want = f16::from_f32(f);
            let got = f32_to_f16(f);
            assert!(
                got == want.to_bits() || (f.is_nan() && f16::from_bits(got).is_nan()),
                "{f:e}: {got:#06x} vs {:#06x}",
                want.to_bits()
            );
        };
        for _ in 0..2_000_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            check(f32::from_bits(x));
        }
        for h in 0..=u16::MAX {
            // Every half value and the midpoints around it (ties round to even).
            let f = f16::from_bits(h).to_f32();
            if f.is_finite() {
                for d in [-1i32, 0, 1] {
                    check(f32::from_bits(f.to_bits().wrapping_add_signed(d)));
                }
                let next = f16::from_bits(h.wrapping_add(1)).to_f32();
                if next.is_finite() {
                    check((f + next) / 2.0);
                }
            }
        }
    }

    /// NEON's conversions give the portable ones' bits: every half widened, and floats (every
    /// half's neighbours and midpoints, scaled, and random ones) rounded to half and back.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_f16_conversions_equal_the_portable_ones() {
        let halves: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut wide = vec![0.0f32; 1 << 16];
        assert_eq!(neon_f16::widen(&halves, &mut wide), 1 << 16);
        for (h, w) in (0..=u16::MAX).zip(&wide) {
            let want = f16_to_f32(h);
            assert!(
                w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()),
                "{h:#06x}"
            );
        }
        let mut floats: Vec<f32> = Vec::new();
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            let next = f16_to_f32(h.wrapping_add(1));
            if f.is_finite() && next.is_finite() {
                floats.extend(
                    [-1i32, 0, 1].map(|d| f32::from_bits(f.to_bits().wrapping_add_signed(d))),
                );
                floats.push((f + next) / 2.0);
            }
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if f.is_finite() {
                floats.push(f);
            }
        }
        floats.retain(|f| f.is_finite());
        floats.truncate(floats.len() / 8 * 8);
        for scale in [1.0f32, 0.125, 3.0] {
            let mut got = floats.clone();
            assert_eq!(neon_f16::round_scaled(&mut got, scale), floats.len());
            for (f, g) in floats.iter().zip(&got) {
                let want = round_f16(f * scale);
                assert_eq!(g.to_bits(), want.to_bits(), "{f:e} · {scale}");
            }
        }
    }

    #[test]
    fn q8_0_rows_round_trip() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) * 0.3)
            .collect();
        let mut a = vec![0u8; 68];
        encode_row(KvType::Q8_0, &x, &mut a);
        let mut back = vec![0.0; 64];
        decode_row_with::<false>(KvType::Q8_0, &a, &mut back);
        for (u, v) in x.iter().zip(&back) {
            assert!((u - v).abs() <= 2.7 / 127.0 + 1e-6);
        }
    }

    #[test]
    fn every_instruction_set_build_computes_the_same_bits() {
        // More rows than one window of the AVX-512 weighted sum holds at every width.
        let n: usize = 301;
        // 20: rows that are not a multiple of the 8 values F16C converts at once; 40: scores
        // 16 positions at a time (AVX-512) but V rows not a multiple of 16 values; 256: the
        // widest heads.
        let cases = [
            (64, KvType::F32),
            (64, KvType::F16),
            (64, KvType::Q8_0),
            (20, KvType::F32),
            (20, KvType::F16),
            (40, KvType::F16),
            (256, KvType::F16),
            (256, KvType::F32),
        ];
        // K tiles as wide as the caches' (16 positions) or narrower (8: a paged cache's
        // smaller blocks), attended from the first position or from inside a tile (a sliding
        // window): K columns read in place or decoded first, through every build.
        let layouts = [(16, 0), (16, 5), (8, 3)];
        for ((head_dim, ty), (width, start)) in cases
            .into_iter()
            .flat_map(|c| layouts.into_iter().map(move |l| (c, l)))
        {
            let rb = ty.row_bytes(head_dim).unwrap();
            // K in tiles of `width` positions, V in rows.
            let tile_bytes = width * rb;
            let mut k = vec![0u8; n.next_multiple_of(width) * rb];
            let mut v = vec![0u8; n * rb];
            for (i, vr) in v.chunks_exact_mut(rb).enumerate() {
                let row: Vec<f32> = (0..head_dim)
                    .map(|j| (((i * 31 + j * 7) % 41) as f32 - 20.0) * 0.09)
                    .collect();
                let tile = &mut k[i / width * tile_bytes..(i / width + 1) * tile_bytes];
                encode_k(ty, &row, tile, width, i % width);
                let row: Vec<f32> = row.iter().map(|x| x * -0.7 + 0.1).collect();
                encode_row(ty, &row, vr);
            }
            // Positions `start..n`, one run per tile.
            let run = |r: usize| {
                let t = start / width + r;
                let lo = if r == 0 { start % width } else { 0 };
                let hi = (n - t * width).min(width);
                RowRun {
                    k: &k[t * tile_bytes..(t + 1) * tile_bytes],
                    width,
                    first: lo,
                    v: &v[(t * width + lo) * rb..(t * width + hi) * rb],
                    rows: hi - lo,
                    stride: rb,
                }
            };
            let n_ctx = n - start;
            let runs = (n - 1) / width - start / width + 1;
            let q: Vec<f32> = (0..8 * head_dim)
                .map(|i| ((i % 13) as f32 - 6.0) * 0.3)
                .collect();
            let mut scores = vec![0.0; 8 * n_ctx];
            let (mut a, mut b) = (vec![0.0; 8 * head_dim], vec![0.0; 8 * head_dim]);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            // One query of four (Gemma 3's group), five, seven (Qwen2.5-0.5B's) or eight
            // (TinyLlama's) heads, then two causal queries of three heads and five of one.
            for (heads, queries) in [(4, 1), (5, 1), (7, 1), (8, 1), (6, 2), (5, 5)] {
                let q = &q[..heads * head_dim];
                let (a, b) = (&mut a[..heads * head_dim], &mut b[..heads * head_dim]);
                // The same arguments for every build.
                macro_rules! attend_with {
                    ($build:expr, $out:expr) => {
                        $build(
                            ty,
                            head_dim,
                            runs,
                            run,
                            q,
                            queries,
                            n_ctx,
                            0.125,
                            $out,
                            &mut scores,
                        )
                    };
                }
                attend_with!(attend_runs, &mut *a);
                attend_with!(attend_runs_any::<false, false, _>, &mut *b);
                let what = format!(
                    "{ty:?} {head_dim}, {heads} heads ×{queries}, tiles of {width} from {start}"
                );
                assert_eq!(bits(a), bits(b), "{what}: the detected build");
                #[cfg(target_arch = "x86_64")]
                if x86_attention_builds() {
                    // SAFETY: AVX2, F16C and FMA were detected just above.
                    unsafe { attend_with!(attend_runs_avx2, &mut *a) };
                    assert_eq!(bits(a), bits(b), "{what}: the AVX2 build");
                }
            }
        }
    }

    /// A contiguous cache of `ty` holding `n` positions of patterned keys and values in
    /// `layer`.
    fn filled_cache(shape: KvShape, layer: usize, n: usize, ty: KvType) -> ContiguousKv {
        let mut kv = ContiguousKv::new(shape, n, ty);
        let kv_len = shape.kv_len();
        let k: Vec<f32> = (0..n * kv_len)
            .map(|i| ((i * 7 % 29) as f32 - 14.0) * 0.05)
            .collect();
        let v: Vec<f32> = (0..n * kv_len)
            .map(|i| ((i * 5 % 31) as f32 - 15.0) * 0.07)
            .collect();
        kv.store(layer, 0, &k, &v);
        kv.set_len(n);
        kv
    }

    #[test]
    fn a_block_of_causal_queries_equals_each_query_alone() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 2,
            head_dim: 64,
        };
        let heads = 3;
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let kv = filled_cache(shape, 1, 53, ty);
            for (queries, n_ctx) in [(1, 1), (2, 2), (16, 16), (16, 53), (5, 37), (7, 20)] {
                let q: Vec<f32> = (0..queries * heads * 64)
                    .map(|i| ((i * 3 % 17) as f32 - 8.0) * 0.2)
                    .collect();
                let mut scores = vec![0.0; queries * heads * n_ctx];
                let mut block = vec![0.0; q.len()];
                kv.attend_queries(1, 1, &q, queries, 0..n_ctx, 0.17, &mut block, &mut scores);
                for (i, (qi, bi)) in q
                    .chunks_exact(heads * 64)
                    .zip(block.chunks(heads * 64))
                    .enumerate()
                {
                    let mut alone = vec![0.0; heads * 64];
                    let end = n_ctx + 1 + i - queries;
                    kv.attend(1, 1, qi, 0..end, 0.17, &mut alone, &mut scores);
                    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(bi),
                        bits(&alone),
                        "{ty:?}: query {i} of {queries}, n_ctx {n_ctx}"
                    );
                }
            }
        }
    }

    /// Attention through the caches (K in columns) against a plain f64 computation from the
    /// values the caches hold, over a range starting inside a tile (a sliding window): a wrong
    /// column, position or weight shows far above the f32 rounding allowed here.
    #[test]
    fn attention_equals_a_plain_softmax_over_the_cached_values() {
        let shape = KvShape {
            layers: 1,
            kv_heads: 2,
            head_dim: 64,
        };
        let (n, heads) = (70, 3);
        let k: Vec<f32> = (0..n * shape.kv_len())
            .map(|i| ((i * 7 % 29) as f32 - 14.0) * 0.05)
            .collect();
        let v: Vec<f32> = (0..n * shape.kv_len())
            .map(|i| ((i * 5 % 31) as f32 - 15.0) * 0.07)
            .collect();
        let q: Vec<f32> = (0..heads * 64)
            .map(|i| ((i * 3 % 17) as f32 - 8.0) * 0.2)
            .collect();
        for ty in [KvType::F32, KvType::F16] {
            // What the cache holds (f16 rounds K, V and, for the products, the query).
            let held = |x: f32| if ty == KvType::F16 { round_f16(x) } else { x };
            let mut contiguous = ContiguousKv::new(shape, n, ty);
            let config = crate::PagedKvConfig::new(1 << 20);
            let pool = crate::PagedKvPool::new(shape, ty, &config).unwrap();
            let mut paged = crate::PagedKv::new_sequence(&pool, None);
            for cache in [&mut contiguous as &mut dyn KvCache, &mut paged] {
                cache.reserve(n).unwrap();
                cache.store(0, 0, &k, &v);
                cache.set_len(n);
                for positions in [0..n, 21..n, 5..38] {
                    let mut out = vec![0.0; heads * 64];
                    let mut scores = vec![0.0; heads * n];
                    cache.attend(0, 1, &q, positions.clone(), 0.125, &mut out, &mut scores);
                    for h in 0..heads {
                        let value =
                            |x: &[f32], p: usize, d: usize| f64::from(held(x[p * 128 + 64 + d]));
                        let logits: Vec<f64> = positions
                            .clone()
                            .map(|p| {
                                (0..64)
                                    .map(|d| f64::from(held(q[h * 64 + d])) * value(&k, p, d))
                                    .sum::<f64>()
                                    * 0.125
                            })
                            .collect();
                        let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                        let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                        let total: f64 = e.iter().sum();
                        for d in 0..64 {
                            let want: f64 = positions
                                .clone()
                                .zip(&e)
                                .map(|(p, w)| w / total * value(&v, p, d))
                                .sum();
                            let got = f64::from(out[h * 64 + d]);
                            assert!(
                                (got - want).abs() < 2e-3,
                                "{ty:?} {positions:?} head {h} value {d}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn weighted_rows_sum_in_row_order_at_every_width() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for width in [1, 5, 8, 16, 24, 32, 40, 64, 72, 256] {
            let rows = 37;
            let w: Vec<f32> = (0..rows).map(|_| next()).collect();
            let values: Vec<f32> = (0..rows * width).map(|_| next() * 8.0).collect();
            let start: Vec<f32> = (0..width).map(|_| next()).collect();
            let mut want = start.clone();
            for (&wi, row) in w.iter().zip(values.chunks_exact(width)) {
                for (o, &x) in want.iter_mut().zip(row) {
                    *o = wi.mul_add(x, *o);
                }
            }
            let mut got = start;
            accumulate_rows(&mut got, &w, &values);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "width {width}");
        }
    }

    #[test]
    fn grouped_attention_equals_one_head_at_a_time() {
        let shape = KvShape {
            layers: 1,
            kv_heads: 2,
            head_dim: 32,
        };
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let n = 37;
            let kv = filled_cache(shape, 0, n, ty);
            let q: Vec<f32> = (0..3 * 32)
                .map(|i| ((i * 3 % 17) as f32 - 8.0) * 0.2)
                .collect();
            let mut scores = vec![0.0; 3 * n];
            let mut all = vec![0.0; 3 * 32];
            kv.attend(0, 1, &q, 0..n, 0.17, &mut all, &mut scores);
            for h in 0..3 {
                let mut one = vec![0.0; 32];
                let qh = &q[h * 32..(h + 1) * 32];
                kv.attend(0, 1, qh, 0..n, 0.17, &mut one, &mut scores);
                assert_eq!(one, all[h * 32..(h + 1) * 32], "{ty:?} head {h}");
            }
        }
    }
}
