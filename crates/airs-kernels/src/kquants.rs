//! k-quant kernels: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K weights and the Q8_K activation type.
//!
//! What: for each k-quant type, the exact ggml dequantizer, ggml's reference quantizer (used to
//! write synthetic model files) and the dot product of one weight row with one activation row
//! quantized as Q8_K (f32 scale, 256 × i8, 16 × i16 sums of 16 values).
//!
//! Where the design comes from: ggml's k-quants (`ggml-quants.c`, `ggml-cpu/quants.c` and
//! `ggml-cpu/arch/{x86,arm}/quants.c`). A k-quant super-block holds 256 weights split into
//! sub-blocks of 16 or 32 that carry small integer scales (and, for Q2_K/Q4_K/Q5_K, mins) which
//! are themselves scaled by one or two f16 super-block factors. The dot products follow ggml's
//! accumulation structure: the integer products `q_w · q_a` of a super-block are summed exactly
//! in i32 (unsigned weight quants × signed activation quants, `vpmaddubsw`/`sdot`), weighted by
//! the sub-block scales in integer arithmetic, and only then multiplied by the f32 super-block
//! factors; the min (or, for Q6_K, the −32 offset) terms use the activation block sums
//! (`bsums`), so they cost 16 multiply-adds per super-block instead of one per weight. Results
//! therefore agree with llama.cpp to f32 rounding.
//!
//! Layout: blocks are read in place from the raw row bytes at fixed byte offsets (see the
//! `*_BYTES` constants and the `#[repr(C)]` layout structs below, which are only used to check
//! those offsets at compile time); SIMD code uses unaligned loads, so rows need no alignment and
//! nothing is ever copied.
//!
//! Cost: a dot product over `n` weights reads `n/256` super-blocks of weights (84 / 110 / 144 /
//! 176 / 210 bytes for Q2_K…Q6_K) and `n/256 × 292` activation bytes once, and does O(n) integer
//! work plus O(n/256) float work. The scalar paths are references (≈ 1–2 GB/s of weights); the
//! AVX2 paths (ggml's structure, plus an AVX-VNNI flavour picked at run time) reach ≈ 30–40 GB/s
//! single-threaded on a Zen 5 core when the weights are in cache, the AVX-512 paths (VNNI when
//! the CPU has it) ≈ 42–65 GB/s, i.e. decode is bound by memory bandwidth, not by these kernels.
//! NEON uses `sdot` when the CPU reports the dot-product extension. Which path runs is decided
//! per call from the requested [`Isa`] and CPU features detected once (an [`Isa`] the CPU lacks
//! falls back to scalar instead of faulting).
//!
//! Tests: every SIMD variant is checked against the scalar reference and the scalar reference
//! against the dequantized rows; the quantizers, dequantizers and Q8_K quantizer were also checked
//! byte for byte against ggml's C code (and the dot products to f32 rounding).

use crate::{ActType, GgmlType, Isa, QK_K, TypeKernels};

pub(crate) mod reference;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
mod tests;

/// Bytes of one Q2_K super-block: scales[16] (4-bit scale | 4-bit min), qs[64], d f16, dmin f16.
pub(crate) const Q2K_BYTES: usize = 84;
/// Bytes of one Q3_K super-block: hmask[32], qs[64], scales[12] (6-bit), d f16.
pub(crate) const Q3K_BYTES: usize = 110;
/// Bytes of one Q4_K super-block: d f16, dmin f16, scales[12] (6-bit scales/mins), qs[128].
pub(crate) const Q4K_BYTES: usize = 144;
/// Bytes of one Q5_K super-block: d f16, dmin f16, scales[12], qh[32], qs[128].
pub(crate) const Q5K_BYTES: usize = 176;
/// Bytes of one Q6_K super-block: ql[128], qh[64], scales[16] i8, d f16.
pub(crate) const Q6K_BYTES: usize = 210;
/// Bytes of one Q8_K super-block: d f32, qs[256] i8, bsums[16] i16.
pub(crate) const Q8K_BYTES: usize = 292;

/// ggml's on-disk layouts, spelled out to check the byte offsets used by the kernels.
#[allow(dead_code)]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[repr(C)]
    pub struct BlockQ2K {
        pub scales: [u8; QK_K / 16],
        pub qs: [u8; QK_K / 4],
        pub d: [u8; 2],
        pub dmin: [u8; 2],
    }
    #[repr(C)]
    pub struct BlockQ3K {
        pub hmask: [u8; QK_K / 8],
        pub qs: [u8; QK_K / 4],
        pub scales: [u8; 12],
        pub d: [u8; 2],
    }
    #[repr(C)]
    pub struct BlockQ4K {
        pub d: [u8; 2],
        pub dmin: [u8; 2],
        pub scales: [u8; 12],
        pub qs: [u8; QK_K / 2],
    }
    #[repr(C)]
    pub struct BlockQ5K {
        pub d: [u8; 2],
        pub dmin: [u8; 2],
        pub scales: [u8; 12],
        pub qh: [u8; QK_K / 8],
        pub qs: [u8; QK_K / 2],
    }
    #[repr(C)]
    pub struct BlockQ6K {
        pub ql: [u8; QK_K / 2],
        pub qh: [u8; QK_K / 4],
        pub scales: [i8; QK_K / 16],
        pub d: [u8; 2],
    }
    #[repr(C)]
    pub struct BlockQ8K {
        pub d: [u8; 4],
        pub qs: [i8; QK_K],
        pub bsums: [[u8; 2]; QK_K / 16],
    }

    const _: () = assert!(size_of::<BlockQ2K>() == Q2K_BYTES);
    const _: () = assert!(offset_of!(BlockQ2K, qs) == 16 && offset_of!(BlockQ2K, d) == 80);
    const _: () = assert!(offset_of!(BlockQ2K, dmin) == 82);
    const _: () = assert!(size_of::<BlockQ3K>() == Q3K_BYTES);
    const _: () = assert!(offset_of!(BlockQ3K, qs) == 32 && offset_of!(BlockQ3K, scales) == 96);
    const _: () = assert!(offset_of!(BlockQ3K, d) == 108);
    const _: () = assert!(size_of::<BlockQ4K>() == Q4K_BYTES);
    const _: () = assert!(offset_of!(BlockQ4K, scales) == 4 && offset_of!(BlockQ4K, qs) == 16);
    const _: () = assert!(size_of::<BlockQ5K>() == Q5K_BYTES);
    const _: () = assert!(offset_of!(BlockQ5K, qh) == 16 && offset_of!(BlockQ5K, qs) == 48);
    const _: () = assert!(size_of::<BlockQ6K>() == Q6K_BYTES);
    const _: () = assert!(offset_of!(BlockQ6K, qh) == 128 && offset_of!(BlockQ6K, scales) == 192);
    const _: () = assert!(offset_of!(BlockQ6K, d) == 208);
    const _: () = assert!(size_of::<BlockQ8K>() == Q8K_BYTES);
    const _: () = assert!(offset_of!(BlockQ8K, qs) == 4 && offset_of!(BlockQ8K, bsums) == 260);
}

static Q2K: TypeKernels = TypeKernels {
    act: ActType::Q8K,
    dot: dot_q2k,
    dequant: reference::dequant_q2k,
    quantize: Some(reference::quantize_q2k),
};
static Q3K: TypeKernels = TypeKernels {
    act: ActType::Q8K,
    dot: dot_q3k,
    dequant: reference::dequant_q3k,
    quantize: Some(reference::quantize_q3k),
};
static Q4K: TypeKernels = TypeKernels {
    act: ActType::Q8K,
    dot: dot_q4k,
    dequant: reference::dequant_q4k,
    quantize: Some(reference::quantize_q4k),
};
static Q5K: TypeKernels = TypeKernels {
    act: ActType::Q8K,
    dot: dot_q5k,
    dequant: reference::dequant_q5k,
    quantize: Some(reference::quantize_q5k),
};
static Q6K: TypeKernels = TypeKernels {
    act: ActType::Q8K,
    dot: dot_q6k,
    dequant: reference::dequant_q6k,
    quantize: Some(reference::quantize_q6k),
};
static Q8K: TypeKernels = TypeKernels {
    act: ActType::Q8K,
    dot: dot_q8k,
    dequant: reference::dequant_q8k,
    quantize: Some(reference::quantize_q8k),
};

/// The k-quant kernels for `ty`, or `None` if `ty` is not a k-quant type handled here.
pub(crate) fn kernels(ty: GgmlType) -> Option<&'static TypeKernels> {
    match ty {
        GgmlType::Q2K => Some(&Q2K),
        GgmlType::Q3K => Some(&Q3K),
        GgmlType::Q4K => Some(&Q4K),
        GgmlType::Q5K => Some(&Q5K),
        GgmlType::Q6K => Some(&Q6K),
        GgmlType::Q8K => Some(&Q8K),
        _ => None,
    }
}

/// The code path a dot product takes, resolved from the requested [`Isa`] and what this CPU
/// verifiably has (so a mistaken `Isa` degrades to scalar instead of faulting).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Path {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx2Vnni,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    #[cfg(target_arch = "aarch64")]
    Neon,
    #[cfg(target_arch = "aarch64")]
    NeonDot,
}

mod features {
    use std::sync::atomic::{AtomicU32, Ordering};

    pub const INIT: u32 = 1;
    #[cfg(target_arch = "x86_64")]
    pub const AVX2: u32 = 2;
    #[cfg(target_arch = "x86_64")]
    pub const AVX512: u32 = 4;
    #[cfg(target_arch = "x86_64")]
    pub const AVX512_VNNI: u32 = 8;
    #[cfg(target_arch = "x86_64")]
    pub const AVX_VNNI: u32 = 64;
    #[cfg(target_arch = "aarch64")]
    pub const NEON: u32 = 16;
    #[cfg(target_arch = "aarch64")]
    pub const DOTPROD: u32 = 32;

    static FEATURES: AtomicU32 = AtomicU32::new(0);

    /// CPU features relevant to the k-quant kernels, detected once (a relaxed load afterwards).
    #[inline]
    pub fn get() -> u32 {
        let f = FEATURES.load(Ordering::Relaxed);
        if f != 0 { f } else { detect() }
    }

    #[cold]
    fn detect() -> u32 {
        #[allow(unused_mut)]
        let mut f = INIT;
        #[cfg(target_arch = "x86_64")]
        {
            if crate::Isa::Avx2.is_available() {
                f |= AVX2;
                if std::arch::is_x86_feature_detected!("avxvnni") {
                    f |= AVX_VNNI;
                }
            }
            if crate::Isa::Avx512.is_available() {
                f |= AVX512;
                if std::arch::is_x86_feature_detected!("avx512vnni") {
                    f |= AVX512_VNNI;
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if crate::Isa::Neon.is_available() {
                f |= NEON;
                if std::arch::is_aarch64_feature_detected!("dotprod") {
                    f |= DOTPROD;
                }
            }
        }
        FEATURES.store(f, Ordering::Relaxed);
        f
    }
}

#[inline]
fn path(isa: Isa) -> Path {
    #[allow(unused_variables)]
    let f = features::get();
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if f & features::AVX512_VNNI != 0 => Path::Avx512Vnni,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if f & features::AVX512 != 0 => Path::Avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if f & features::AVX_VNNI != 0 => Path::Avx2Vnni,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if f & features::AVX2 != 0 => Path::Avx2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon if f & features::DOTPROD != 0 => Path::NeonDot,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon if f & features::NEON != 0 => Path::Neon,
        _ => Path::Scalar,
    }
}

/// Split a weight row and a Q8_K activation row of `n` values into their super-blocks.
///
/// Panics if the byte lengths do not match `n` (the public API checks them first).
#[inline]
fn split<'a, const B: usize>(
    n: usize,
    w: &'a [u8],
    act: &'a [u8],
) -> (&'a [[u8; B]], &'a [[u8; Q8K_BYTES]]) {
    let nb = n / QK_K;
    let (wb, wrest) = w.as_chunks::<B>();
    let (ab, arest) = act.as_chunks::<Q8K_BYTES>();
    assert!(
        n.is_multiple_of(QK_K)
            && wb.len() == nb
            && ab.len() == nb
            && wrest.is_empty()
            && arest.is_empty(),
        "k-quant dot: row lengths do not match n = {n}"
    );
    (wb, ab)
}

fn dot_q2k(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = split::<Q2K_BYTES>(n, w, act);
    match path(isa) {
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx2Vnni | Path::Avx512 | Path::Avx512Vnni => {
            // SAFETY: `path` returns an x86 SIMD path only after detecting AVX2+FMA+F16C.
            unsafe { avx2::dot_q2k(w, a) }
        }
        _ => reference::dot_q2k(w, a),
    }
}

fn dot_q3k(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = split::<Q3K_BYTES>(n, w, act);
    match path(isa) {
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx2Vnni | Path::Avx512 | Path::Avx512Vnni => {
            // SAFETY: `path` returns an x86 SIMD path only after detecting AVX2+FMA+F16C.
            unsafe { avx2::dot_q3k(w, a) }
        }
        _ => reference::dot_q3k(w, a),
    }
}

fn dot_q4k(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = split::<Q4K_BYTES>(n, w, act);
    match path(isa) {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => {
            // SAFETY: `path` returned Avx512Vnni after detecting AVX-512 F/BW/VL/VNNI and AVX2.
            unsafe { avx512::dot_q4k_vnni(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => {
            // SAFETY: `path` returned Avx512 after detecting AVX-512 F/BW/VL and AVX2.
            unsafe { avx512::dot_q4k(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2Vnni => {
            // SAFETY: `path` returned Avx2Vnni after detecting AVX2+FMA+F16C and AVX-VNNI.
            unsafe { avx2::dot_q4k_vnni(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            // SAFETY: `path` returned Avx2 after detecting AVX2+FMA+F16C.
            unsafe { avx2::dot_q4k(w, a) }
        }
        #[cfg(target_arch = "aarch64")]
        Path::NeonDot => {
            // SAFETY: `path` returned NeonDot after detecting NEON and the dotprod extension.
            unsafe { neon::dot_q4k_sdot(w, a) }
        }
        #[cfg(target_arch = "aarch64")]
        Path::Neon => {
            // SAFETY: `path` returned Neon after detecting NEON.
            unsafe { neon::dot_q4k(w, a) }
        }
        Path::Scalar => reference::dot_q4k(w, a),
    }
}

fn dot_q5k(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = split::<Q5K_BYTES>(n, w, act);
    match path(isa) {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => {
            // SAFETY: `path` returned Avx512Vnni after detecting AVX-512 F/BW/VL/VNNI and AVX2.
            unsafe { avx512::dot_q5k_vnni(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => {
            // SAFETY: `path` returned Avx512 after detecting AVX-512 F/BW/VL and AVX2.
            unsafe { avx512::dot_q5k(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2Vnni => {
            // SAFETY: `path` returned Avx2Vnni after detecting AVX2+FMA+F16C and AVX-VNNI.
            unsafe { avx2::dot_q5k_vnni(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            // SAFETY: `path` returned Avx2 after detecting AVX2+FMA+F16C.
            unsafe { avx2::dot_q5k(w, a) }
        }
        #[cfg(target_arch = "aarch64")]
        Path::NeonDot => {
            // SAFETY: `path` returned NeonDot after detecting NEON and the dotprod extension.
            unsafe { neon::dot_q5k_sdot(w, a) }
        }
        #[cfg(target_arch = "aarch64")]
        Path::Neon => {
            // SAFETY: `path` returned Neon after detecting NEON.
            unsafe { neon::dot_q5k(w, a) }
        }
        Path::Scalar => reference::dot_q5k(w, a),
    }
}

fn dot_q6k(isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = split::<Q6K_BYTES>(n, w, act);
    match path(isa) {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => {
            // SAFETY: `path` returned Avx512Vnni after detecting AVX-512 F/BW/VL/VNNI and AVX2.
            unsafe { avx512::dot_q6k_vnni(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => {
            // SAFETY: `path` returned Avx512 after detecting AVX-512 F/BW/VL and AVX2.
            unsafe { avx512::dot_q6k(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2Vnni => {
            // SAFETY: `path` returned Avx2Vnni after detecting AVX2+FMA+F16C and AVX-VNNI.
            unsafe { avx2::dot_q6k_vnni(w, a) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            // SAFETY: `path` returned Avx2 after detecting AVX2+FMA+F16C.
            unsafe { avx2::dot_q6k(w, a) }
        }
        #[cfg(target_arch = "aarch64")]
        Path::NeonDot => {
            // SAFETY: `path` returned NeonDot after detecting NEON and the dotprod extension.
            unsafe { neon::dot_q6k_sdot(w, a) }
        }
        #[cfg(target_arch = "aarch64")]
        Path::Neon => {
            // SAFETY: `path` returned Neon after detecting NEON.
            unsafe { neon::dot_q6k(w, a) }
        }
        Path::Scalar => reference::dot_q6k(w, a),
    }
}

/// Q8_K × Q8_K: only used by tests and tools (no model stores Q8_K weights); scalar everywhere.
fn dot_q8k(_isa: Isa, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = split::<Q8K_BYTES>(n, w, act);
    reference::dot_q8k(w, a)
}
