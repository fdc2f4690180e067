//! airs-kernels: dot products and matrix products on weights in their GGUF encoding.
//!
//! Weights are never copied or dequantized into owned buffers: every kernel reads a weight row
//! as the raw bytes of its ggml blocks, in place (from the mapped file or the model region).
//! Activations are quantized once per matmul into the encoding ggml pairs with each weight
//! type (`ActType`: Q8_0 for the legacy quants, Q8_K for the k-quants, F16/BF16/F32 for float
//! weights), exactly as llama.cpp does, so results match it closely.
//!
//! Every kernel has a scalar reference; SIMD variants (AVX2 / AVX-512 on x86-64, NEON on
//! aarch64) are selected by an explicit [`Isa`] argument, detected once by the caller with
//! [`Isa::detect`], so tests can run the scalar and SIMD paths side by side.
//!
//! Cost: a dot product over `n` weights is O(n) and reads `n * bits_per_weight / 8` weight bytes;
//! [`matmul`] is single-threaded: callers split weight rows across threads.

mod act;
mod isa;
mod kquants;
mod legacy;

pub use airs_gguf::{GgmlType, QK_K};
pub use isa::Isa;

/// The encoding of activations that a weight type's dot product consumes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ActType {
    F32,
    F16,
    BF16,
    /// ggml block_q8_0: f16 scale + 32 × i8 (34 bytes per 32 values).
    Q8_0,
    /// ggml block_q8_K: f32 scale + 256 × i8 + 16 × i16 block sums (292 bytes per 256 values).
    Q8K,
}

impl ActType {
    /// The ggml type with the same encoding.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            ActType::F32 => GgmlType::F32,
            ActType::F16 => GgmlType::F16,
            ActType::BF16 => GgmlType::BF16,
            ActType::Q8_0 => GgmlType::Q8_0,
            ActType::Q8K => GgmlType::Q8K,
        }
    }

    /// Bytes of one activation row of `n` values (`n` must be a multiple of the block length).
    pub fn row_bytes(self, n: usize) -> usize {
        let t = self.ggml_type();
        n / t.block_len() * t.block_bytes()
    }
}

/// Why a kernel refused its arguments.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("ggml type {0} has no kernel in airs")]
    UnsupportedType(GgmlType),
    #[error("{what}: expected {expected} bytes or elements, got {got}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("row length {n} is not a multiple of the {ty} block length {block_len}")]
    RaggedRow {
        ty: GgmlType,
        n: usize,
        block_len: usize,
    },
}

/// Dot product of one weight row (`n` values, raw ggml blocks) with one activation row
/// (`n` values in the weight type's `ActType` encoding).
pub(crate) type DotFn = fn(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32;
/// Decode one row of raw ggml blocks into f32.
pub(crate) type DequantFn = fn(src: &[u8], dst: &mut [f32]);
/// Encode one row of f32 into raw ggml blocks (ggml's reference quantizer).
pub(crate) type QuantFn = fn(src: &[f32], dst: &mut [u8]);

/// What airs can do with one ggml type.
pub(crate) struct TypeKernels {
    pub act: ActType,
    pub dot: DotFn,
    pub dequant: DequantFn,
    pub quantize: Option<QuantFn>,
}

fn kernels(ty: GgmlType) -> Result<&'static TypeKernels, KernelError> {
    legacy::kernels(ty)
        .or_else(|| kquants::kernels(ty))
        .ok_or(KernelError::UnsupportedType(ty))
}

fn check_row(ty: GgmlType, n: usize) -> Result<usize, KernelError> {
    let block_len = ty.block_len();
    if !n.is_multiple_of(block_len) {
        return Err(KernelError::RaggedRow { ty, n, block_len });
    }
    Ok(n / block_len * ty.block_bytes())
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), KernelError> {
    if expected != got {
        return Err(KernelError::LengthMismatch {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// The activation encoding that weights of type `ty` multiply against.
pub fn act_type(ty: GgmlType) -> Result<ActType, KernelError> {
    Ok(kernels(ty)?.act)
}

/// Whether airs has dot/dequantize kernels for `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    kernels(ty).is_ok()
}

/// Bytes of one row of `n` values of type `ty`.
pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, KernelError> {
    check_row(ty, n)
}

/// Encode the activation row `x` as `act` into `out` (`out.len() == act.row_bytes(x.len())`).
///
/// Q8_0 activations are rounded as ggml's SIMD quantizer rounds them (see `act`), not as its
/// reference quantizer [`quantize_row`] does.
pub fn quantize_act(act: ActType, x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    if act == ActType::Q8_0 {
        check_len(
            "quantize_act dst",
            check_row(GgmlType::Q8_0, x.len())?,
            out.len(),
        )?;
        act::quantize_q8_0_like_ggml_simd(x, out);
        return Ok(());
    }
    quantize_row(act.ggml_type(), x, out)
}

/// Encode `src` as ggml blocks of type `ty` with ggml's reference quantizer.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let k = kernels(ty)?;
    let quantize = k.quantize.ok_or(KernelError::UnsupportedType(ty))?;
    check_len("quantize_row dst", check_row(ty, src.len())?, dst.len())?;
    quantize(src, dst);
    Ok(())
}

/// Decode one row of raw ggml blocks of type `ty` into `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let k = kernels(ty)?;
    check_len("dequantize_row src", check_row(ty, dst.len())?, src.len())?;
    (k.dequant)(src, dst);
    Ok(())
}

/// Dot product of a weight row of type `ty` with an activation row already encoded in
/// `act_type(ty)`; both hold `n` values.
pub fn dot(isa: Isa, ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, KernelError> {
    let k = kernels(ty)?;
    check_len("dot weight row", check_row(ty, n)?, w.len())?;
    check_len("dot activation row", k.act.row_bytes(n), act.len())?;
    Ok((k.dot)(isa, n, w, act))
}

/// `out[t * out_stride + r] = dot(weight row r, activation row t)` for every weight row `r` in
/// `w_rows` (consecutive rows of `n` values each) and every activation row `t` in `acts`
/// (consecutive rows in `act_type(ty)` encoding).
///
/// Single-threaded; weight rows are walked in tiles so that a tile stays in cache while every
/// activation row passes over it (the prefill case), and the decode case (one activation row)
/// streams each weight byte once.
pub fn matmul(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w_rows: &[u8],
    acts: &[u8],
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    let k = kernels(ty)?;
    let w_row_bytes = check_row(ty, n)?;
    let act_row_bytes = k.act.row_bytes(n);
    if w_row_bytes == 0 || act_row_bytes == 0 {
        return Ok(());
    }
    check_len(
        "matmul weight rows",
        w_rows.len() / w_row_bytes * w_row_bytes,
        w_rows.len(),
    )?;
    check_len(
        "matmul activation rows",
        acts.len() / act_row_bytes * act_row_bytes,
        acts.len(),
    )?;
    let rows = w_rows.len() / w_row_bytes;
    let tokens = acts.len() / act_row_bytes;
    if tokens > 0 {
        let needed = (tokens - 1) * out_stride + rows;
        if out.len() < needed || (tokens > 1 && out_stride < rows) {
            return Err(KernelError::LengthMismatch {
                what: "matmul output",
                expected: needed,
                got: out.len(),
            });
        }
    }
    // Tile of weight rows that fits comfortably in L2 (≈ 256 KiB) while activations stream.
    let tile_rows = (256 * 1024 / w_row_bytes).clamp(1, 64);
    for r0 in (0..rows).step_by(tile_rows) {
        let r1 = (r0 + tile_rows).min(rows);
        for t in 0..tokens {
            let a = &acts[t * act_row_bytes..(t + 1) * act_row_bytes];
            let o = &mut out[t * out_stride..];
            for r in r0..r1 {
                o[r] = (k.dot)(isa, n, &w_rows[r * w_row_bytes..(r + 1) * w_row_bytes], a);
            }
        }
    }
    Ok(())
}
