//! airs-kernels: dot products and matrix products on weights in their GGUF encoding.
//!
//! Weights are never copied or dequantized into owned buffers: every kernel reads a weight row
//! as the raw bytes of its ggml blocks, in place (from the mapped file or the model region) —
//! either in the file's layout or, for matrices the loader repacked, in the 16-row interleaved
//! layout of [`rows16`] (the same bytes permuted, the same results).
//! Activations are quantized once per matmul into the encoding ggml pairs with each weight
//! type (`ActType`: Q8_0 for the legacy quants, Q8_K for the k-quants, F16/BF16/F32 for float
//! weights), exactly as llama.cpp does, so results match it closely.
//!
//! Every kernel has a scalar reference; SIMD variants (AVX2 / AVX-512 on x86-64, NEON on
//! aarch64) are selected by an explicit [`Isa`] argument, detected once by the caller with
//! [`Isa::detect`], so tests can run the scalar and SIMD paths side by side.
//!
//! [`matmul`] runs multi-row kernels where it can (`tiled`): on AVX-512 VNNI and NEON with
//! `sdot`, every quant type goes through tiled prefill kernels (several activation rows) or
//! multi-row decode kernels (one row) that are bit-identical to the scalar reference `dot`;
//! on AVX2 the hot legacy types take 4 rows per call, bit-identical to the per-row AVX2 dot.
//! [`prepare_acts`] / [`matmul_prepared`] let a caller that splits rows across threads
//! rearrange the activations once per matrix instead of once per call.
//!
//! Cost: a dot product over `n` weights is O(n) and reads `n * bits_per_weight / 8` weight bytes;
//! [`matmul`] is single-threaded: callers split weight rows across threads.

mod act;
mod act_simd;
mod gated;
mod isa;
mod kquants;
mod legacy;
pub mod peak;
pub mod prefetch;
pub mod rows16;
mod stream;
mod tiled;

pub use airs_gguf::{GgmlType, QK_K};
pub use gated::gated;
pub use isa::Isa;
pub use stream::xor_fold;
pub use tiled::PreparedActs;
#[cfg(target_arch = "aarch64")]
pub use tiled::neon::sdot;

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
    #[error("activations were not prepared for a {0} matmul on this instruction set")]
    Unprepared(GgmlType),
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
/// reference quantizer [`quantize_row`] does; Q8_K as ggml's reference. Both run as SIMD
/// where the CPU has it (`act_simd`), bit-identical to the portable code for finite inputs.
pub fn quantize_act(act: ActType, x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    if act == ActType::Q8_0 {
        check_len(
            "quantize_act dst",
            check_row(GgmlType::Q8_0, x.len())?,
            out.len(),
        )?;
        if !act_simd::quantize_q8_0(x, out) {
            act::quantize_q8_0_like_ggml_simd(x, out);
        }
        return Ok(());
    }
    if act == ActType::Q8K {
        check_len(
            "quantize_act dst",
            check_row(GgmlType::Q8K, x.len())?,
            out.len(),
        )?;
        if act_simd::quantize_q8k(x, out) {
            return Ok(());
        }
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

/// Checked geometry of a matmul with `tokens` activation rows: (weight row bytes, rows), or
/// `None` if rows are empty (`n` = 0).
fn matmul_geometry(
    ty: GgmlType,
    n: usize,
    w_rows: &[u8],
    tokens: usize,
    out_len: usize,
    out_stride: usize,
) -> Result<Option<(usize, usize)>, KernelError> {
    let w_row_bytes = check_row(ty, n)?;
    if w_row_bytes == 0 {
        return Ok(None);
    }
    check_len(
        "matmul weight rows",
        w_rows.len() / w_row_bytes * w_row_bytes,
        w_rows.len(),
    )?;
    let rows = w_rows.len() / w_row_bytes;
    if tokens > 0 {
        let needed = (tokens - 1) * out_stride + rows;
        if out_len < needed || (tokens > 1 && out_stride < rows) {
            return Err(KernelError::LengthMismatch {
                what: "matmul output",
                expected: needed,
                got: out_len,
            });
        }
    }
    Ok(Some((w_row_bytes, rows)))
}

/// `out[t * out_stride + r] = dot(weight row r, activation row t)` for every weight row `r` in
/// `w_rows` (consecutive rows of `n` values each) and every activation row `t` in `acts`
/// (consecutive rows in `act_type(ty)` encoding).
///
/// Single-threaded. With several activation rows and a SIMD `isa`, weight rows are repacked a
/// tile at a time and multiplied with all activation rows at once (see [`prepare_acts`]; this
/// function prepares them itself, per call); with one activation row, each weight byte is
/// streamed once.
///
/// Batch invariance: every output is bit-identical to one per-row [`dot`] — the scalar
/// reference where [`matmul_matches_scalar`] says so, else `dot` with the same `isa` (float
/// weights always take their per-row dot) — so a token's results never depend on how many
/// rows it is computed with, nor on how the caller splits weight rows across threads.
/// Continuous batching (several sequences' rows in one call) relies on this; the tests check
/// it for every type and instruction set.
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
    let act_row_bytes = k.act.row_bytes(n);
    let tokens = act_rows(ty, n, acts)?;
    let Some((w_row_bytes, rows)) = matmul_geometry(ty, n, w_rows, tokens, out.len(), out_stride)?
    else {
        return Ok(());
    };
    if rows > 0 && tokens > 0 && tiled::available(isa) {
        match tiled::kind(ty) {
            Some((kind, act)) if tiled::worth_tiling(kind, tokens) => {
                tiled::with_prep_buffer(|prep| {
                    tiled::prepare(kind, act, n, acts, tokens, prep);
                    tiled::run(isa, ty, kind, n, w_rows, w_row_bytes, prep, out, out_stride);
                });
                return Ok(());
            }
            Some((kind, act)) => {
                // Too few tokens to pay for the repack: the decode kernels, which read the
                // weights in place (bit-identical to the tiled kernel, so results never
                // depend on batching).
                let acts = &acts[..tokens * act_row_bytes];
                tiled::decode(
                    isa,
                    ty,
                    kind,
                    act,
                    n,
                    w_rows,
                    w_row_bytes,
                    acts,
                    out,
                    out_stride,
                );
                return Ok(());
            }
            _ => {}
        }
    }
    if tokens == 1 && legacy::matvec(isa, ty, n, w_rows, w_row_bytes, acts, out) {
        return Ok(());
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

/// Whether [`matmul`] with `isa` on weights of type `ty` is bit-identical to
/// `dot(Isa::Scalar, ..)` for every number of activation rows: always for the scalar path, and
/// for quant types where `isa` has the multi-row kernels on this CPU (AVX-512 VNNI, NEON with
/// `sdot`). Otherwise [`matmul`] equals the per-row [`dot`] of `isa` for one activation row and
/// agrees with it to f32 rounding for several.
pub fn matmul_matches_scalar(isa: Isa, ty: GgmlType) -> bool {
    isa == Isa::Scalar || (tiled::available(isa) && tiled::kind(ty).is_some())
}

/// Rearrange `acts` (activation rows of `n` values in `act_type(ty)` encoding) into `prep` for
/// [`matmul_prepared`], if `isa` has tiled kernels for `ty` on this CPU and there are enough
/// rows to pay for them (see [`layout_prepared_acts`]); returns whether it did (otherwise use
/// [`matmul`]).
///
/// Preparing once per weight matrix and splitting its rows across threads with
/// [`matmul_prepared`] saves every thread the O(tokens · n) preparation that [`matmul`] does.
/// To prepare in parallel, use [`layout_prepared_acts`] and [`prepare_act_groups`] instead.
pub fn prepare_acts(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    acts: &[u8],
    prep: &mut PreparedActs,
) -> Result<bool, KernelError> {
    let tokens = act_rows(ty, n, acts)?;
    if !layout_prepared_acts(isa, ty, n, tokens, prep)? {
        return Ok(false);
    }
    prepare_act_groups(ty, n, acts, 0, &mut prep.bytes)?;
    Ok(true)
}

/// Number of whole activation rows in `acts` for weights `ty` with rows of `n` values.
fn act_rows(ty: GgmlType, n: usize, acts: &[u8]) -> Result<usize, KernelError> {
    let k = kernels(ty)?;
    check_row(ty, n)?;
    let act_row_bytes = k.act.row_bytes(n);
    if act_row_bytes == 0 {
        return Ok(0);
    }
    check_len(
        "activation rows",
        acts.len() / act_row_bytes * act_row_bytes,
        acts.len(),
    )?;
    Ok(acts.len() / act_row_bytes)
}

/// Size `prep` for `tokens` activation rows of `n` values for weights of type `ty`, if `isa`
/// has tiled kernels for `ty` on this CPU and `tokens` is enough to pay for repacking the
/// weights (2 or more for legacy quants, 3 for k-quants, 32 for floats; below that [`matmul`]
/// runs its one-row kernels per token); returns whether it did. The
/// contents are then written group by group ([`PreparedActs::group_bytes`] each, groups of
/// [`PreparedActs::GROUP`] tokens) with [`prepare_act_groups`] into
/// [`PreparedActs::bytes_mut`], possibly by several threads on disjoint groups.
pub fn layout_prepared_acts(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    tokens: usize,
    prep: &mut PreparedActs,
) -> Result<bool, KernelError> {
    kernels(ty)?;
    check_row(ty, n)?;
    match tiled::kind(ty) {
        Some((kind, act))
            if tiled::worth_tiling(kind, tokens) && n > 0 && tiled::available(isa) =>
        {
            tiled::layout(kind, act, n, tokens, prep);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Write prepared groups `first_group..` (as many as `dst` holds) of the activation rows `acts`
/// (all of them, as passed to [`layout_prepared_acts`]) for weights of type `ty`.
pub fn prepare_act_groups(
    ty: GgmlType,
    n: usize,
    acts: &[u8],
    first_group: usize,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let tokens = act_rows(ty, n, acts)?;
    let Some((kind, act)) = tiled::kind(ty) else {
        return Err(KernelError::Unprepared(ty));
    };
    let group_bytes = tiled::records(kind, n) * tiled::act_record_bytes(kind);
    let groups = tokens.div_ceil(tiled::GROUP);
    if group_bytes == 0 {
        return Ok(());
    }
    let count = dst.len() / group_bytes;
    if dst.len() != count * group_bytes || first_group + count > groups {
        return Err(KernelError::LengthMismatch {
            what: "prepared activation groups",
            expected: (groups.saturating_sub(first_group)) * group_bytes,
            got: dst.len(),
        });
    }
    tiled::prepare_groups(kind, act, n, acts, first_group, dst);
    Ok(())
}

/// [`matmul`] with activations prepared by [`prepare_acts`] (which returned `true` for the
/// same `isa`, `ty` and `n`); the tokens are those of `prep`.
pub fn matmul_prepared(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w_rows: &[u8],
    prep: &PreparedActs,
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    let kind = prepared_kind(isa, ty, n, prep)?;
    let tokens = prep.tokens();
    let Some((w_row_bytes, rows)) = matmul_geometry(ty, n, w_rows, tokens, out.len(), out_stride)?
    else {
        return Ok(());
    };
    if rows > 0 {
        tiled::run(isa, ty, kind, n, w_rows, w_row_bytes, prep, out, out_stride);
    }
    Ok(())
}

/// [`matmul_prepared`] on whole 16-row groups in the rows16 layout (`groups`, as
/// [`rows16::repack_group`] writes them): bit-identical to [`matmul_prepared`] on the same
/// rows in the file's layout, without unpacking them first where the kernels convert a group
/// straight into their tile (x86: every rows16 type).
pub fn matmul_prepared_rows16(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    groups: &[u8],
    prep: &PreparedActs,
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), KernelError> {
    let kind = prepared_kind(isa, ty, n, prep)?;
    if !rows16::has_layout(ty) {
        return Err(KernelError::UnsupportedType(ty));
    }
    let tokens = prep.tokens();
    let Some((w_row_bytes, rows)) = matmul_geometry(ty, n, groups, tokens, out.len(), out_stride)?
    else {
        return Ok(());
    };
    check_len(
        "rows16 groups",
        rows.next_multiple_of(rows16::GROUP_ROWS),
        rows,
    )?;
    if rows > 0 {
        tiled::run_rows16(isa, ty, kind, n, groups, w_row_bytes, prep, out, out_stride);
    }
    Ok(())
}

/// The tiled kind of `ty` if `prep` was prepared for it, `n` values a row, and `isa` has the
/// tiled kernels.
fn prepared_kind(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    prep: &PreparedActs,
) -> Result<tiled::Kind, KernelError> {
    kernels(ty)?;
    match (tiled::kind(ty), prep.key) {
        (Some((kind, act)), Some(key))
            if key == (kind, act, n, prep.tokens()) && tiled::available(isa) =>
        {
            Ok(kind)
        }
        _ => Err(KernelError::Unprepared(ty)),
    }
}
