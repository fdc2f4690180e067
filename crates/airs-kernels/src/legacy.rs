//! Float and legacy block-quant kernels: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! What: for each type, the activation encoding its dot product consumes, ggml's exact
//! dequantizer, ggml's reference quantizer, and a dot product with a scalar reference plus
//! SIMD paths (AVX2 and AVX-512/VNNI on x86-64, NEON with optional `sdot` on aarch64).
//!
//! Design (from ggml: ggml-quants.c, ggml-cpu/quants.c, ggml-cpu/arch/{x86,arm}/quants.c):
//! weights stay in their 32-value blocks and are read in place; activations are quantized once
//! to Q8_0 (the legacy quants), F16, BF16 or F32, as ggml's `vec_dot_type`. A quant dot takes an
//! exact integer dot per block, multiplies it by the block's scale product `dx·dy` and sums
//! those in f32, so results track llama.cpp's closely. Q4_1/Q5_1 pair with Q8_1 in ggml; here
//! they take Q8_0 activations and compute Q8_1's block sum `dy·Σqy` on the fly.
//!
//! `matvec` runs the AVX2 path 4 rows at a time (shared activation loads, the same per-row
//! operations, so bit-identical to the per-row dot); on AVX-512 VNNI and NEON with `sdot`,
//! `crate::tiled` has the multi-row kernels instead.
//!
//! Cost: a dot over `n` values is O(n), reading each weight byte once (Q8_0 8.5, Q5_0 5.5,
//! Q4_0 4.5 bits per weight) and the activation row (8.5 bits per value, L1-resident in
//! decode). Dequantization and quantization are O(n) scalar code. Dispatch costs one relaxed
//! atomic load per call (cached CPU feature bits), so a safe caller can never run an
//! instruction set the CPU lacks: an unavailable `Isa` runs the scalar reference instead.

mod blocks;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::atomic::{AtomicU8, Ordering};

use crate::{ActType, GgmlType, Isa, TypeKernels};
use blocks::{BLOCK_LEN, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, blocks};

#[allow(unused_imports)] // for kquants and tests; not every one is used on every target
pub(crate) use scalar::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// The code path a dot product takes: the requested `Isa` narrowed to what this CPU has.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Path {
    Scalar,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 F/BW/VL without VNNI: 512-bit float kernels, AVX2 quant kernels.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512 F/BW/VL + VNNI: also 512-bit `vpdpbusd` kernels for Q8_0, Q4_0, Q5_0.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// Baseline NEON (widening multiplies).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// NEON with the dot-product extension (`sdot`).
    #[cfg(target_arch = "aarch64")]
    NeonDotprod,
}

const FEATURES_KNOWN: u8 = 1 << 0;
const HAS_AVX2: u8 = 1 << 1;
const HAS_AVX512: u8 = 1 << 2;
#[cfg(target_arch = "x86_64")]
const HAS_AVX512_VNNI: u8 = 1 << 3;
const HAS_NEON: u8 = 1 << 4;
#[cfg(target_arch = "aarch64")]
const HAS_DOTPROD: u8 = 1 << 5;

/// This CPU's relevant features as `HAS_*` bits, detected once.
#[inline]
fn cpu_features() -> u8 {
    static CACHE: AtomicU8 = AtomicU8::new(0);
    let cached = CACHE.load(Ordering::Relaxed);
    if cached & FEATURES_KNOWN != 0 {
        return cached;
    }
    let mut bits = FEATURES_KNOWN;
    if Isa::Avx2.is_available() {
        bits |= HAS_AVX2;
    }
    if Isa::Avx512.is_available() {
        bits |= HAS_AVX512;
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512vnni") {
            bits |= HAS_AVX512_VNNI;
        }
    }
    if Isa::Neon.is_available() {
        bits |= HAS_NEON;
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            bits |= HAS_DOTPROD;
        }
    }
    CACHE.store(bits, Ordering::Relaxed);
    bits
}

/// The path for `isa`; `Path::Scalar` if this CPU cannot run it.
#[inline]
fn path(isa: Isa) -> Path {
    let has = cpu_features();
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if has & HAS_AVX512_VNNI != 0 => Path::Avx512Vnni,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if has & HAS_AVX512 != 0 => Path::Avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if has & HAS_AVX2 != 0 => Path::Avx2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon if has & HAS_DOTPROD != 0 => Path::NeonDotprod,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon if has & HAS_NEON != 0 => Path::Neon,
        _ => Path::Scalar,
    }
}

/// Whether `isa` runs NEON code with the dot-product extension on this CPU.
#[cfg(target_arch = "aarch64")]
#[inline]
pub(crate) fn has_neon_dotprod(isa: Isa) -> bool {
    path(isa) == Path::NeonDotprod
}

/// Whether `isa` runs AVX2, FMA and F16C code (and not AVX-512 VNNI's) on this CPU.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2(isa: Isa) -> bool {
    matches!(path(isa), Path::Avx2 | Path::Avx512)
}

/// Whether `isa` runs AVX-512 F/BW/VL/VNNI (+ AVX2/FMA/F16C) code on this CPU.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512_vnni(isa: Isa) -> bool {
    path(isa) == Path::Avx512Vnni
}

// ---------------------------------------------------------------------------------------------
// Dot dispatch. Each `dot_*` is a `DotFn`: it views the rows as blocks (panicking, never
// reading out of bounds, if a row is short) and runs the kernel for `path(isa)`.

fn dot_f32(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = (&w[..n * 4], &act[..n * 4]);
    match path(isa) {
        // SAFETY: `path` returns Avx2 only if AVX2, FMA and F16C were detected.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::dot_f32_avx2(w, a) },
        // SAFETY: `path` returns Avx512* only if AVX-512 F/BW/VL and AVX2/FMA/F16C were detected.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 | Path::Avx512Vnni => unsafe { x86::dot_f32_avx512(w, a) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `path` returns Neon* only if NEON was detected (it is aarch64 baseline).
        Path::Neon | Path::NeonDotprod => unsafe { neon::dot_f32(w, a) },
        Path::Scalar => scalar::dot_f32(n, w, a),
    }
}

fn dot_f16(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = (&w[..n * 2], &act[..n * 2]);
    match path(isa) {
        // SAFETY: `path` returns Avx2 only if AVX2, FMA and F16C were detected.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::dot_f16_avx2(w, a) },
        // SAFETY: `path` returns Avx512* only if AVX-512 F/BW/VL and AVX2/FMA/F16C were detected.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 | Path::Avx512Vnni => unsafe { x86::dot_f16_avx512(w, a) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `path` returns Neon* only if NEON was detected (it is aarch64 baseline).
        Path::Neon | Path::NeonDotprod => unsafe { neon::dot_f16(w, a) },
        Path::Scalar => scalar::dot_f16(n, w, a),
    }
}

fn dot_bf16(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = (&w[..n * 2], &act[..n * 2]);
    match path(isa) {
        // SAFETY: `path` returns Avx2 only if AVX2, FMA and F16C were detected.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::dot_bf16_avx2(w, a) },
        // SAFETY: `path` returns Avx512* only if AVX-512 F/BW/VL and AVX2/FMA/F16C were detected.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 | Path::Avx512Vnni => unsafe { x86::dot_bf16_avx512(w, a) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `path` returns Neon* only if NEON was detected (it is aarch64 baseline).
        Path::Neon | Path::NeonDotprod => unsafe { neon::dot_bf16(w, a) },
        Path::Scalar => scalar::dot_bf16(n, w, a),
    }
}

/// Dispatch for a quant type with weight block `$block`: `$avx2`/`$vnni` name x86 kernels
/// (`$vnni` may repeat `$avx2`), `$neon` the kernel name in `neon::{widening, dotprod}`.
macro_rules! quant_dot {
    ($name:ident, $block:ty, $scalar:path, $avx2:ident, $vnni:ident, $neon:ident) => {
        fn $name(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
            let nb = n / BLOCK_LEN;
            match path(isa) {
                Path::Scalar => $scalar(n, w, act),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `path` returns Avx2/Avx512 only if AVX2, FMA and F16C were detected.
                Path::Avx2 | Path::Avx512 => unsafe {
                    x86::$avx2(blocks::<$block>(w, nb), blocks::<BlockQ8_0>(act, nb))
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `path` returns Avx512Vnni only if AVX-512 F/BW/VL/VNNI and
                // AVX2/FMA/F16C were detected.
                Path::Avx512Vnni => unsafe {
                    x86::$vnni(blocks::<$block>(w, nb), blocks::<BlockQ8_0>(act, nb))
                },
                #[cfg(target_arch = "aarch64")]
                // SAFETY: `path` returns Neon only if NEON was detected (aarch64 baseline).
                Path::Neon => unsafe {
                    neon::widening::$neon(blocks::<$block>(w, nb), blocks::<BlockQ8_0>(act, nb))
                },
                #[cfg(target_arch = "aarch64")]
                // SAFETY: `path` returns NeonDotprod only if NEON and "dotprod" were detected.
                Path::NeonDotprod => unsafe {
                    neon::dotprod::$neon(blocks::<$block>(w, nb), blocks::<BlockQ8_0>(act, nb))
                },
            }
        }
    };
}

quant_dot!(
    dot_q8_0,
    BlockQ8_0,
    scalar::dot_q8_0,
    dot_q8_0_avx2,
    dot_q8_0_avx512vnni,
    dot_q8_0
);
quant_dot!(
    dot_q4_0,
    BlockQ4_0,
    scalar::dot_q4_0,
    dot_q4_0_avx2,
    dot_q4_0_avx512vnni,
    dot_q4_0
);
quant_dot!(
    dot_q5_0,
    BlockQ5_0,
    scalar::dot_q5_0,
    dot_q5_0_avx2,
    dot_q5_0_avx512vnni,
    dot_q5_0
);
quant_dot!(
    dot_q4_1,
    BlockQ4_1,
    scalar::dot_q4_1,
    dot_q4_1_avx2,
    dot_q4_1_avx2,
    dot_q4_1
);
quant_dot!(
    dot_q5_1,
    BlockQ5_1,
    scalar::dot_q5_1,
    dot_q5_1_avx2,
    dot_q5_1_avx2,
    dot_q5_1
);

// ---------------------------------------------------------------------------------------------
// Multi-row decode on the AVX2 path (AVX2, and AVX-512 without VNNI): 4 rows per call sharing
// the activation loads, bit-identical to the per-row dot of the same path.

/// `out[r] = dot(row r of w_rows, act)` for Q8_0 / Q4_0 / Q5_0 on the AVX2 path; `false`
/// (nothing written) for other types or paths. Rows are whole rows of `row_bytes` bytes.
pub(crate) fn matvec(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w_rows: &[u8],
    row_bytes: usize,
    act: &[u8],
    out: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(path(isa), Path::Avx2 | Path::Avx512) {
        let nb = n / BLOCK_LEN;
        let rows = w_rows.len() / row_bytes;
        let a = blocks::<BlockQ8_0>(act, nb);
        macro_rules! by_fours {
            ($block:ty, $dot4:ident, $dot1:ident) => {{
                let row = |r: usize| blocks::<$block>(&w_rows[r * row_bytes..], nb);
                let full = rows / 4 * 4;
                for r0 in (0..full).step_by(4) {
                    let w = [row(r0), row(r0 + 1), row(r0 + 2), row(r0 + 3)];
                    // SAFETY: `path` returns Avx2/Avx512 only if AVX2, FMA and F16C were
                    // detected.
                    let d = unsafe { x86::$dot4(w, a) };
                    out[r0..r0 + 4].copy_from_slice(&d);
                }
                for r in full..rows {
                    // SAFETY: as above.
                    out[r] = unsafe { x86::$dot1(row(r), a) };
                }
                return true;
            }};
        }
        match ty {
            GgmlType::Q8_0 => by_fours!(BlockQ8_0, dot4_q8_0_avx2, dot_q8_0_avx2),
            GgmlType::Q4_0 => by_fours!(BlockQ4_0, dot4_q4_0_avx2, dot_q4_0_avx2),
            GgmlType::Q5_0 => by_fours!(BlockQ5_0, dot4_q5_0_avx2, dot_q5_0_avx2),
            _ => {}
        }
    }
    let _ = (isa, ty, n, w_rows, row_bytes, act, out);
    false
}

// ---------------------------------------------------------------------------------------------
// The kernel table.

static F32: TypeKernels = TypeKernels {
    act: ActType::F32,
    dot: dot_f32,
    dequant: scalar::dequant_f32,
    quantize: Some(scalar::quantize_f32),
};
static F16: TypeKernels = TypeKernels {
    act: ActType::F16,
    dot: dot_f16,
    dequant: scalar::dequant_f16,
    quantize: Some(scalar::quantize_f16),
};
static BF16: TypeKernels = TypeKernels {
    act: ActType::BF16,
    dot: dot_bf16,
    dequant: scalar::dequant_bf16,
    quantize: Some(scalar::quantize_bf16),
};
static Q4_0: TypeKernels = TypeKernels {
    act: ActType::Q8_0,
    dot: dot_q4_0,
    dequant: scalar::dequant_q4_0,
    quantize: Some(scalar::quantize_q4_0),
};
static Q4_1: TypeKernels = TypeKernels {
    act: ActType::Q8_0,
    dot: dot_q4_1,
    dequant: scalar::dequant_q4_1,
    quantize: Some(scalar::quantize_q4_1),
};
static Q5_0: TypeKernels = TypeKernels {
    act: ActType::Q8_0,
    dot: dot_q5_0,
    dequant: scalar::dequant_q5_0,
    quantize: Some(scalar::quantize_q5_0),
};
static Q5_1: TypeKernels = TypeKernels {
    act: ActType::Q8_0,
    dot: dot_q5_1,
    dequant: scalar::dequant_q5_1,
    quantize: Some(scalar::quantize_q5_1),
};
static Q8_0: TypeKernels = TypeKernels {
    act: ActType::Q8_0,
    dot: dot_q8_0,
    dequant: scalar::dequant_q8_0,
    quantize: Some(scalar::quantize_q8_0),
};

/// The kernels for `ty`, or `None` if it is not a float or legacy quant type.
pub(crate) fn kernels(ty: GgmlType) -> Option<&'static TypeKernels> {
    Some(match ty {
        GgmlType::F32 => &F32,
        GgmlType::F16 => &F16,
        GgmlType::BF16 => &BF16,
        GgmlType::Q4_0 => &Q4_0,
        GgmlType::Q4_1 => &Q4_1,
        GgmlType::Q5_0 => &Q5_0,
        GgmlType::Q5_1 => &Q5_1,
        GgmlType::Q8_0 => &Q8_0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_isa_gets_a_simd_path() {
        for isa in Isa::all_available() {
            let p = path(isa);
            assert_eq!(p == Path::Scalar, isa == Isa::Scalar, "{isa:?} → {p:?}");
        }
    }
}
