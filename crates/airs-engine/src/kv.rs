//! The KV cache interface the forward pass writes keys/values into and attends through, the
//! attention kernel every cache shares, and the contiguous cache (one `[capacity × kv_len]`
//! array per layer for K and for V).
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
//! at its own position, with the results of attending one by one. Cached rows are read as
//! *runs* of consecutive positions lying `stride` bytes apart: one run for the contiguous
//! cache, one per block for the paged cache.
//!
//! Element types, chosen to match llama.cpp's CPU kernels:
//! - `f32`: everything in f32.
//! - `f16`: ggml multiplies f16 K and V by converting the f32 operand to f16 (its
//!   `vec_dot_type`), so the query and the softmax weights are rounded to f16 before their dot
//!   products; K and V rows convert exactly.
//! - `q8_0`: ggml `block_q8_0` rows (f16 scale + 32 × i8 per 32 values). llama.cpp needs flash
//!   attention for a quantized V cache; its CPU kernel quantizes the query to q8_0, takes
//!   integer q8_0·q8_0 dot products with the K rows (block sums scaled by `d_k·d_q`), and
//!   accumulates dequantized f32 V rows with f32 weights. We do the same, with the two-pass
//!   softmax (f64 sum) of the other types instead of its online f32 softmax — a difference of
//!   about one ulp in the weights. q8_0 needs `head_dim` to be a multiple of 32.
//!
//! Cost: `store` is O(kv_len) per position; `attend` reads each of the `n_ctx` K and V rows of
//! its KV head once and does O(n_ctx × head_dim) work per query head. On x86-64 with AVX2 the
//! kernel runs as a 256-bit build of the same code, and with AVX-512 F as a build that also
//! scores 16 positions per register (the positions in the lanes, so `dot`'s eight partial sums
//! stay eight registers) and accumulates V rows 64 values at a time — bit-identical results in
//! every build (tested). Before the first row is read, every run's rows are requested into L2:
//! a paged cache's runs each start a new page, beyond the hardware prefetcher's reach. Measured
//! on one core (Zen 4, 2048 positions, Qwen2.5-0.5B's 24 layers × 14 query / 2 KV heads of
//! 64), before the AVX-512 build: one decode step's attention took about 8 ms for f16 and q8_0
//! and 6.5-9 ms for f32; the AVX-512 build's gain is in BENCHMARKS.md (batched decode).

use airs_gguf::GgmlType;

use crate::error::{EngineError, EngineErrorKind};

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
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
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
    for v in &mut x[done..] {
        *v = round_f16(*v * scale);
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
            #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
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
            for (o, b) in out[done..].iter_mut().zip(src[2 * done..].chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        KvType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                for (o, &q) in o.iter_mut().zip(&b[2..34]) {
                    *o = f32::from(q as i8) * d;
                }
            }
        }
    }
}

/// ggml's `vec_dot_q8_0_q8_0`: per 32-value block an exact integer dot scaled by `d_a · d_b`.
#[inline(always)]
fn dot_q8_0(a: &[u8], b: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in a.chunks_exact(34).zip(b.chunks_exact(34)) {
        let dx = f16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let dy = f16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        let mut isum = 0i32;
        for (&p, &q) in x[2..34].iter().zip(&y[2..34]) {
            isum += i32::from(p as i8) * i32::from(q as i8);
        }
        sum += isum as f32 * (dx * dy);
    }
    sum
}

#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorize without reassociation; each
    // step a fused multiply-add.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] = ca[i].mul_add(cb[i], acc[i]);
        }
    }
    // Lane 0, then each next lane in turn: the order the AVX2 build reproduces eight rows at a
    // time ([`dot_rows_avx2`]).
    let mut sum = acc[0];
    for &x in &acc[1..] {
        sum += x;
    }
    for i in chunks..a.len() {
        sum = a[i].mul_add(b[i], sum);
    }
    sum
}

/// `out[i] = dot(q, row i) · scale` for the rows of `rows` (each `q.len()` values).
#[inline(always)]
fn dot_rows(q: &[f32], rows: &[f32], scale: f32, out: &mut [f32]) {
    for (o, r) in out.iter_mut().zip(rows.chunks_exact(q.len())) {
        *o = dot(q, r) * scale;
    }
}

/// [`dot_rows`] with AVX2 intrinsics, eight rows at a time: each row accumulates in its own
/// 8-lane register exactly as [`dot`] does (`q·r + acc`, fused), then an 8×8 transpose
/// lines up lane `i` of the eight rows, and adding the transposed registers in lane order sums
/// every row exactly as `dot` does — the same bits, one vector add per lane instead of seven
/// scalar adds per row.
///
/// # Safety
/// The CPU must support AVX2 (the caller is [`attend_runs_avx2`], compiled with it, after
/// runtime detection); `rows` holds `out.len()` rows of `q.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot_rows_avx2(q: &[f32], rows: &[f32], scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_permute2f128_ps,
        _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps,
        _mm256_unpacklo_ps,
    };
    let hd = q.len();
    let vec_end = hd / 8 * 8;
    assert!(rows.len() >= out.len() * hd);
    let mut r = 0;
    while r + 8 <= out.len() {
        // SAFETY: AVX2 is available (function contract); every load reads 8 floats at
        // `c < vec_end ≤ hd - 8 + 8` within row `r + k < out.len()`, inside `q` and `rows`
        // (asserted above); the store writes the 8 floats of `sums`.
        let sums = unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < vec_end {
                let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                for (k, a) in acc.iter_mut().enumerate() {
                    let rv = _mm256_loadu_ps(rows.as_ptr().add((r + k) * hd + c));
                    *a = _mm256_fmadd_ps(qv, rv, *a);
                }
                c += 8;
            }
            // Transpose: t[i] holds lane i of acc[0..8].
            let lo01 = _mm256_unpacklo_ps(acc[0], acc[1]);
            let hi01 = _mm256_unpackhi_ps(acc[0], acc[1]);
            let lo23 = _mm256_unpacklo_ps(acc[2], acc[3]);
            let hi23 = _mm256_unpackhi_ps(acc[2], acc[3]);
            let lo45 = _mm256_unpacklo_ps(acc[4], acc[5]);
            let hi45 = _mm256_unpackhi_ps(acc[4], acc[5]);
            let lo67 = _mm256_unpacklo_ps(acc[6], acc[7]);
            let hi67 = _mm256_unpackhi_ps(acc[6], acc[7]);
            let a0 = _mm256_shuffle_ps::<0x44>(lo01, lo23);
            let a1 = _mm256_shuffle_ps::<0xEE>(lo01, lo23);
            let a2 = _mm256_shuffle_ps::<0x44>(hi01, hi23);
            let a3 = _mm256_shuffle_ps::<0xEE>(hi01, hi23);
            let b0 = _mm256_shuffle_ps::<0x44>(lo45, lo67);
            let b1 = _mm256_shuffle_ps::<0xEE>(lo45, lo67);
            let b2 = _mm256_shuffle_ps::<0x44>(hi45, hi67);
            let b3 = _mm256_shuffle_ps::<0xEE>(hi45, hi67);
            let t: [__m256; 8] = [
                _mm256_permute2f128_ps::<0x20>(a0, b0),
                _mm256_permute2f128_ps::<0x20>(a1, b1),
                _mm256_permute2f128_ps::<0x20>(a2, b2),
                _mm256_permute2f128_ps::<0x20>(a3, b3),
                _mm256_permute2f128_ps::<0x31>(a0, b0),
                _mm256_permute2f128_ps::<0x31>(a1, b1),
                _mm256_permute2f128_ps::<0x31>(a2, b2),
                _mm256_permute2f128_ps::<0x31>(a3, b3),
            ];
            let mut sum = t[0];
            for &x in &t[1..] {
                sum = _mm256_add_ps(sum, x);
            }
            let mut sums = [0.0f32; 8];
            _mm256_storeu_ps(sums.as_mut_ptr(), sum);
            sums
        };
        for (k, &s0) in sums.iter().enumerate() {
            let row = &rows[(r + k) * hd..(r + k + 1) * hd];
            let mut s = s0;
            for j in vec_end..hd {
                s = q[j].mul_add(row[j], s);
            }
            out[r + k] = s * scale;
        }
        r += 8;
    }
    let rest = &rows[r * hd..];
    dot_rows(q, rest, scale, &mut out[r..]);
}

/// `out += Σ_i w[i] · row i` over the rows of `rows` (each `out.len()` values), every element
/// summed in row order by fused multiply-adds; columns go 32 at a time through registers when
/// the width allows.
#[inline(always)]
fn accumulate_rows(out: &mut [f32], w: &[f32], rows: &[f32]) {
    let n = out.len();
    if n.is_multiple_of(32) {
        for c in (0..n).step_by(32) {
            let o: &mut [f32; 32] = (&mut out[c..c + 32]).try_into().expect("32 columns");
            let mut acc = *o;
            for (&wi, row) in w.iter().zip(rows.chunks_exact(n)) {
                let r: &[f32; 32] = row[c..c + 32].try_into().expect("32 columns");
                for k in 0..32 {
                    acc[k] = wi.mul_add(r[k], acc[k]);
                }
            }
            *o = acc;
        }
    } else {
        for (&wi, row) in w.iter().zip(rows.chunks_exact(n)) {
            for (o, &x) in out.iter_mut().zip(row) {
                *o = wi.mul_add(x, *o);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The attention kernel.

/// Ask the CPU to start loading `bytes` (the next run, while this one is computed): a paged
/// cache's runs lie in separate blocks, where the hardware prefetcher loses the stream.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    prefetch_into::<false>(bytes);
}

/// [`prefetch`] into L2 only (`prefetcht1`), for rows read a little later: one hint per 128
/// bytes, as the L2's adjacent-line prefetcher completes each pair of lines.
#[inline(always)]
fn prefetch_l2(bytes: &[u8]) {
    prefetch_into::<true>(bytes);
}

/// Prefetch hints over `bytes`: every line into L1, or (`L2`) every other line into L2.
#[inline(always)]
fn prefetch_into<const L2: bool>(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(if L2 { 128 } else { 64 }) {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        // SAFETY: a prefetch is only a hint: it never faults, has no architectural effect,
        // and the address lies inside a live slice anyway.
        unsafe {
            if L2 {
                _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast())
            } else {
                _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast())
            }
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// `rows` consecutive cached positions of one KV head: row `i` of K starts at byte
/// `i × stride` of `k` (likewise for V) and holds one head's row.
pub(crate) struct RowRun<'a> {
    pub k: &'a [u8],
    pub v: &'a [u8],
    pub rows: usize,
    pub stride: usize,
}

/// Rows decoded at a time (the paged cache's default block size).
const CHUNK_ROWS: usize = 16;

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
    /// [`attend_runs`] compiled for AVX-512: as the AVX2 build, plus 16 positions' scores per
    /// head at once ([`scores_avx512`]) and 64 output values per V row ([`accumulate_avx512`])
    /// for f16 and f32 rows whose width is a multiple of 16 — the same bits.
    attend_runs_avx512, "avx512f,avx2,f16c,fma", true, true
);

/// `scores[h · n_ctx + i] = dot(q_h, row i) · scale` for the `n ≤ 16` rows of `rows` and every
/// query head `h` of `q`: the 16 rows sit in the 16 lanes of a register (gathered, one register
/// per column), so the 8 partial sums [`dot`] keeps per row are 8 registers, added in `dot`'s
/// lane order at the end — the same bits as [`dot_rows`]. Counted from the code for 64-value
/// heads: 12 vector instructions per score plus the gathers shared by the group's heads,
/// against ~29 for the 8-row AVX2 kernel.
///
/// # Safety
/// AVX-512 F (the caller is [`attend_runs_avx512`]); `rows` holds 16 rows of `head_dim`
/// values (rows `n..16` are read and ignored), `head_dim` a multiple of 8 and ≤
/// [`MAX_HEAD_DIM`]; `scores` holds `heads × n_ctx` values and `j0 + n ≤ n_ctx`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_avx512(
    q: &[f32],
    head_dim: usize,
    rows: &[f32],
    n: usize,
    scale: f32,
    scores: &mut [f32],
    n_ctx: usize,
    j0: usize,
) {
    use std::arch::x86_64::*;
    assert!(
        head_dim.is_multiple_of(8)
            && head_dim <= MAX_HEAD_DIM
            && rows.len() >= CHUNK_ROWS * head_dim
            && n <= CHUNK_ROWS
    );
    let heads = q.len() / head_dim;
    assert!(scores.len() >= heads * n_ctx && j0 + n <= n_ctx);
    // SAFETY: AVX-512 F is available (contract); the gather reads element `d` of rows 0..16,
    // all inside `rows` (asserted); the masked store writes scores `j0..j0 + n` of head `h`,
    // inside `scores` (asserted).
    unsafe {
        // Only the first `head_dim` columns are written and read.
        let mut columns = [std::mem::MaybeUninit::<__m512>::uninit(); MAX_HEAD_DIM];
        let stride = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(head_dim as i32),
        );
        for (d, c) in columns[..head_dim].iter_mut().enumerate() {
            c.write(_mm512_i32gather_ps::<4>(stride, rows.as_ptr().add(d)));
        }
        let mask: __mmask16 = ((1u32 << n) - 1) as u16;
        for h in 0..heads {
            let qh = &q[h * head_dim..(h + 1) * head_dim];
            let mut acc = [_mm512_setzero_ps(); 8];
            for c in 0..head_dim / 8 {
                for (i, a) in acc.iter_mut().enumerate() {
                    let qv = _mm512_set1_ps(*qh.get_unchecked(8 * c + i));
                    *a = _mm512_fmadd_ps(qv, columns[8 * c + i].assume_init(), *a);
                }
            }
            let mut sum = acc[0];
            for &a in &acc[1..] {
                sum = _mm512_add_ps(sum, a);
            }
            let s = _mm512_mul_ps(sum, _mm512_set1_ps(scale));
            _mm512_mask_storeu_ps(scores.as_mut_ptr().add(h * n_ctx + j0), mask, s);
        }
    }
}

/// [`accumulate_rows`] with 512-bit registers: `out += Σ_i w[i] · row i`, every element summed
/// in row order (the same bits), 64 columns of `out` per pass in four registers.
///
/// # Safety
/// AVX-512 F (the caller is [`attend_runs_avx512`]); `out.len()` a multiple of 16 and `rows`
/// holds `w.len()` rows of `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate_avx512(out: &mut [f32], w: &[f32], rows: &[f32]) {
    let n = out.len();
    assert!(n.is_multiple_of(16) && rows.len() >= w.len() * n);
    let mut c = 0;
    while c < n {
        // SAFETY: AVX-512 F is available (contract); columns `c..c + 16·REGS ≤ n`.
        unsafe {
            c += match (n - c) / 16 {
                1 => accumulate_columns::<1>(out, w, rows, c),
                2 => accumulate_columns::<2>(out, w, rows, c),
                3 => accumulate_columns::<3>(out, w, rows, c),
                _ => accumulate_columns::<4>(out, w, rows, c),
            };
        }
    }
}

/// Columns `c..c + 16·REGS` of [`accumulate_avx512`], in `REGS` registers; returns their
/// count.
///
/// # Safety
/// AVX-512 F; `c + 16·REGS ≤ out.len()` and `rows` holds `w.len()` rows of `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate_columns<const REGS: usize>(
    out: &mut [f32],
    w: &[f32],
    rows: &[f32],
    c: usize,
) -> usize {
    use std::arch::x86_64::*;
    let n = out.len();
    assert!(c + 16 * REGS <= n && rows.len() >= w.len() * n);
    // SAFETY: AVX-512 F is available (contract); loads and stores touch columns
    // `c..c + 16·REGS ≤ n` of `out` and of rows `i < w.len()` of `rows` (asserted).
    unsafe {
        let mut acc: [__m512; REGS] =
            std::array::from_fn(|j| _mm512_loadu_ps(out.as_ptr().add(c + 16 * j)));
        for (i, &wi) in w.iter().enumerate() {
            let wv = _mm512_set1_ps(wi);
            let row = rows.as_ptr().add(i * n + c);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(row.add(16 * j)), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(c + 16 * j), *a);
        }
    }
    16 * REGS
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
    let mut q_q8 = Vec::new();
    match ty {
        KvType::F32 => q_f32.extend_from_slice(q),
        KvType::F16 => q_f32.extend(q.iter().map(|&x| round_f16(x))),
        KvType::Q8_0 => {
            q_q8.resize(heads * row_bytes, 0);
            for (src, dst) in q
                .chunks_exact(head_dim)
                .zip(q_q8.chunks_exact_mut(row_bytes))
            {
                encode_row(KvType::Q8_0, src, dst);
            }
        }
    }
    let mut rows_buf = vec![0.0f32; CHUNK_ROWS * head_dim];

    // Every run's K and V rows requested into L2 before any is read: the runs lie in separate
    // blocks (a new page each), so neither the hardware prefetcher nor one run of lookahead
    // hides their latency.
    for r in 0..runs {
        let RowRun { k, v, .. } = run(r);
        prefetch_l2(k);
        prefetch_l2(v);
    }
    // Scores, a chunk of rows at a time: decode the rows once, then every head.
    let mut j0 = 0;
    for r in 0..runs {
        let RowRun {
            k, rows, stride, ..
        } = run(r);
        if r + 1 < runs {
            prefetch(run(r + 1).k);
        }
        let mut i0 = 0;
        while i0 < rows {
            let n = (rows - i0).min(CHUNK_ROWS);
            let row = |i: usize| &k[(i0 + i) * stride..(i0 + i) * stride + row_bytes];
            if ty == KvType::Q8_0 {
                for h in 0..heads {
                    let qh = &q_q8[h * row_bytes..(h + 1) * row_bytes];
                    let s = &mut scores[h * n_ctx + j0..h * n_ctx + j0 + n];
                    for (i, s) in s.iter_mut().enumerate() {
                        *s = dot_q8_0(row(i), qh) * scale;
                    }
                }
            } else {
                let buf = &mut rows_buf[..n * head_dim];
                for (i, o) in buf.chunks_exact_mut(head_dim).enumerate() {
                    decode_row_with::<X86_SIMD>(ty, row(i), o);
                }
                // (Fewer than 8 rows: the gathers cost more than the 8-row AVX2 kernel.)
                #[cfg(target_arch = "x86_64")]
                if AVX512 && head_dim.is_multiple_of(8) && n >= 8 {
                    // SAFETY: `AVX512` is true only inside `attend_runs_avx512`, which runs
                    // after runtime detection of AVX-512 F; `rows_buf` holds CHUNK_ROWS rows
                    // of `head_dim ≤ MAX_HEAD_DIM` values, `n ≤ CHUNK_ROWS`, and positions
                    // `j0..j0 + n` lie inside `n_ctx`.
                    unsafe {
                        scores_avx512(&q_f32, head_dim, &rows_buf, n, scale, scores, n_ctx, j0)
                    };
                    i0 += n;
                    j0 += n;
                    continue;
                }
                for h in 0..heads {
                    let qh = &q_f32[h * head_dim..(h + 1) * head_dim];
                    let s = &mut scores[h * n_ctx + j0..h * n_ctx + j0 + n];
                    #[cfg(target_arch = "x86_64")]
                    if X86_SIMD {
                        // SAFETY: `X86_SIMD` is true only inside `attend_runs_avx2`, which runs after
                        // runtime detection of AVX2 (and F16C); `buf` holds `n` rows of
                        // `head_dim` values and `s` has `n` scores.
                        unsafe { dot_rows_avx2(qh, buf, scale, s) };
                        continue;
                    }
                    dot_rows(qh, buf, scale, s);
                }
            }
            i0 += n;
            j0 += n;
        }
    }
    assert_eq!(j0, n_ctx, "runs must cover n_ctx positions");

    // Softmax per head (f64 sum, as ggml), leaving the weights in `scores`.
    for (h, s) in scores.chunks_exact_mut(n_ctx).enumerate() {
        let s = &mut s[..row_len(h)];
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
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
    let mut j0 = 0;
    for r in 0..runs {
        let RowRun {
            v, rows, stride, ..
        } = run(r);
        if r + 1 < runs {
            prefetch(run(r + 1).v);
        }
        let mut i0 = 0;
        while i0 < rows {
            let n = (rows - i0).min(CHUNK_ROWS);
            let buf = &mut rows_buf[..n * head_dim];
            for (i, o) in buf.chunks_exact_mut(head_dim).enumerate() {
                let at = (i0 + i) * stride;
                decode_row_with::<X86_SIMD>(ty, &v[at..at + row_bytes], o);
            }
            for h in 0..heads {
                // Rows past the head's own positions are not its to accumulate.
                let n = n.min(row_len(h).saturating_sub(j0));
                if n == 0 {
                    continue;
                }
                let oh = &mut out[h * head_dim..(h + 1) * head_dim];
                let w = &scores[h * n_ctx + j0..h * n_ctx + j0 + n];
                #[cfg(target_arch = "x86_64")]
                if AVX512 && head_dim.is_multiple_of(16) {
                    // SAFETY: `AVX512` is true only inside `attend_runs_avx512` (AVX-512 F
                    // detected); `buf` holds `n = w.len()` rows of `head_dim` values.
                    unsafe { accumulate_avx512(oh, w, buf) };
                    continue;
                }
                accumulate_rows(oh, w, buf);
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
    /// Per layer: K then V, each `capacity × kv_heads` rows, position-major.
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
        let n = capacity * shape.kv_heads * row_bytes;
        Ok(ContiguousKv {
            shape,
            ty,
            row_bytes,
            capacity,
            len: 0,
            layers: (0..shape.layers)
                .map(|_| (vec![0; n], vec![0; n]))
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
        let (hd, rb) = (self.shape.head_dim, self.row_bytes);
        let (ks, vs) = &mut self.layers[layer];
        let at = start * self.shape.kv_heads * rb;
        for (i, (ksrc, vsrc)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let d = at + i * rb;
            encode_row(self.ty, ksrc, &mut ks[d..d + rb]);
            encode_row(self.ty, vsrc, &mut vs[d..d + rb]);
        }
    }

    fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// [`attend_runs`] over `positions`, one run.
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
        let stride = self.shape.kv_heads * self.row_bytes;
        let at = positions.start * stride + kv_head * self.row_bytes;
        assert!(!positions.is_empty(), "attention over no positions");
        // The run's bytes end with its last row (the prefetch covers exactly them).
        let end = at + (positions.len() - 1) * stride + self.row_bytes;
        let run = |_| RowRun {
            k: &ks[at..end],
            v: &vs[at..end],
            rows: positions.len(),
            stride,
        };
        attend_runs(
            self.ty,
            self.shape.head_dim,
            1,
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
        2 * self.shape.layers * self.capacity * self.shape.kv_heads * self.row_bytes
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

    #[test]
    fn q8_0_rows_round_trip_and_dot_like_ggml() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) * 0.3)
            .collect();
        let y: Vec<f32> = (0..64)
            .map(|i| ((i * 11 % 23) as f32 - 11.0) * 0.1)
            .collect();
        let (mut a, mut b) = (vec![0u8; 68], vec![0u8; 68]);
        encode_row(KvType::Q8_0, &x, &mut a);
        encode_row(KvType::Q8_0, &y, &mut b);
        let mut back = vec![0.0; 64];
        decode_row_with::<false>(KvType::Q8_0, &a, &mut back);
        for (u, v) in x.iter().zip(&back) {
            assert!((u - v).abs() <= 2.7 / 127.0 + 1e-6);
        }
        let want =
            airs_kernels::dot(airs_kernels::Isa::Scalar, GgmlType::Q8_0, 64, &a, &b).unwrap();
        assert!((dot_q8_0(&a, &b) - want).abs() <= want.abs() * 1e-6);
    }

    #[test]
    fn every_instruction_set_build_computes_the_same_bits() {
        let n = 77;
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
        for (head_dim, ty) in cases {
            let rb = ty.row_bytes(head_dim).unwrap();
            let mut k = vec![0u8; n * rb];
            let mut v = vec![0u8; n * rb];
            for (i, (kr, vr)) in k
                .chunks_exact_mut(rb)
                .zip(v.chunks_exact_mut(rb))
                .enumerate()
            {
                let row: Vec<f32> = (0..head_dim)
                    .map(|j| (((i * 31 + j * 7) % 41) as f32 - 20.0) * 0.09)
                    .collect();
                encode_row(ty, &row, kr);
                let row: Vec<f32> = row.iter().map(|x| x * -0.7 + 0.1).collect();
                encode_row(ty, &row, vr);
            }
            let run = |r: usize| {
                let rows = (n - r * 16).min(16);
                let at = r * 16 * rb;
                RowRun {
                    k: &k[at..at + rows * rb],
                    v: &v[at..at + rows * rb],
                    rows,
                    stride: rb,
                }
            };
            let q: Vec<f32> = (0..5 * head_dim)
                .map(|i| ((i % 13) as f32 - 6.0) * 0.3)
                .collect();
            let mut scores = vec![0.0; 5 * n];
            let (mut a, mut b) = (vec![0.0; 5 * head_dim], vec![0.0; 5 * head_dim]);
            let runs = n.div_ceil(16);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            // One query of five heads, then five causal queries of one head each.
            for queries in [1, 5] {
                // The same arguments for every build.
                macro_rules! attend_with {
                    ($build:expr, $out:expr) => {
                        $build(
                            ty,
                            head_dim,
                            runs,
                            run,
                            &q,
                            queries,
                            n,
                            0.125,
                            $out,
                            &mut scores,
                        )
                    };
                }
                attend_with!(attend_runs, &mut a);
                attend_with!(attend_runs_any::<false, false, _>, &mut b);
                let what = format!("{ty:?} {head_dim} ×{queries}");
                assert_eq!(bits(&a), bits(&b), "{what}: the detected build");
                #[cfg(target_arch = "x86_64")]
                if x86_attention_builds() {
                    // SAFETY: AVX2, F16C and FMA were detected just above.
                    unsafe { attend_with!(attend_runs_avx2, &mut a) };
                    assert_eq!(bits(&a), bits(&b), "{what}: the AVX2 build");
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
