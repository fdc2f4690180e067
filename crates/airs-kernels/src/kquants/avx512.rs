//! AVX-512 (F/BW/VL, optionally VNNI) k-quant × Q8_K dot products for Q4_K, Q5_K and Q6_K.
//!
//! Same arithmetic as the AVX2 kernels, on 64 weights per instruction: a Q4_K/Q5_K step packs
//! the low and high nibbles of 32 quant bytes into one 512-bit register so that it lines up with
//! 64 consecutive activation bytes; a Q6_K step builds 64 six-bit weights from 64 `ql` bytes and
//! the 32 `qh` bytes broadcast to both halves (per-half variable shifts + `vpternlogd` select).
//! With VNNI, `vpdpwssd` fuses the scale multiply with the i32 accumulation.
//! Each kernel is instantiated twice by a macro: with `vpdpwssd` (VNNI) and with
//! `vpmaddwd` + `vpaddd`.

use std::arch::x86_64::*;

use super::avx2::{at, f16x1, f16x2, f32_of, hsum_ps128, load16, load32, unpack_k4_scales};
use super::{Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8K_BYTES};

#[inline]
#[target_feature(enable = "avx512f")]
fn load64(b: &[u8; 64]) -> __m512i {
    // SAFETY: `b` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// `vpshufb` control: in 128-bit lane `i`, every i16 is byte `idx[i]` of that lane zero-extended.
#[inline]
#[target_feature(enable = "avx512f")]
fn bcast_u8_as_i16(idx: [i16; 4]) -> __m512i {
    let f = |k: i16| (k | (0x80u16 << 8) as i16) as i64 & 0xffff;
    let q = |k: i16| {
        let v = f(k);
        v | (v << 16) | (v << 32) | (v << 48)
    };
    _mm512_set_epi64(
        q(idx[3]),
        q(idx[3]),
        q(idx[2]),
        q(idx[2]),
        q(idx[1]),
        q(idx[1]),
        q(idx[0]),
        q(idx[0]),
    )
}

/// `vpshufb` control: in 128-bit lane `i`, every i16 is i16 element `idx[i]` of that lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn bcast_i16(idx: [i16; 4]) -> __m512i {
    let q = |k: i16| {
        let v = ((2 * k) | ((2 * k + 1) << 8)) as i64 & 0xffff;
        v | (v << 16) | (v << 32) | (v << 48)
    };
    _mm512_set_epi64(
        q(idx[3]),
        q(idx[3]),
        q(idx[2]),
        q(idx[2]),
        q(idx[1]),
        q(idx[1]),
        q(idx[0]),
        q(idx[0]),
    )
}

/// `acc + madd(a, b)`: one `vpdpwssd` with VNNI, `vpmaddwd` + `vpaddd` without.
macro_rules! madd_acc {
    (vnni, $acc:expr, $a:expr, $b:expr) => {
        _mm512_dpwssd_epi32($acc, $a, $b)
    };
    (plain, $acc:expr, $a:expr, $b:expr) => {
        _mm512_add_epi32($acc, _mm512_madd_epi16($a, $b))
    };
}

/// Σ_j m_j · (bsum_{2j} + bsum_{2j+1}) for the unpacked `[sc0..7, m0..7]` bytes `s`, as 4 i32.
#[inline]
#[target_feature(enable = "avx2")]
fn k4_mins_prod(s: __m128i, y: &[u8; Q8K_BYTES]) -> __m128i {
    let mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(s, s));
    let bs = load32(at(y, 260));
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    _mm_madd_epi16(mins, q8s)
}

macro_rules! k4_kernel {
    ($name:ident, $mode:ident, $features:literal, $bytes:expr, $high_bits:expr) => {
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; $bytes]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let m4 = _mm512_set1_epi8(0x0F);
            let shuf = [
                bcast_u8_as_i16([0, 0, 1, 1]),
                bcast_u8_as_i16([2, 2, 3, 3]),
                bcast_u8_as_i16([4, 4, 5, 5]),
                bcast_u8_as_i16([6, 6, 7, 7]),
            ];
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let dd = _mm_mul_ps(f16x2(at(x, 0)), _mm_set1_ps(f32_of(y)));
                let s = unpack_k4_scales(load16(at(x, 4)));
                let prod = k4_mins_prod(s, y);
                acc_m = _mm_fnmadd_ps(_mm_shuffle_ps::<0x55>(dd, dd), _mm_cvtepi32_ps(prod), acc_m);
                let sc = _mm512_broadcast_i32x4(s);
                let qs_off = $bytes - 128;
                let hb = if $high_bits {
                    _mm512_broadcast_i64x4(load32(at(x, 16)))
                } else {
                    _mm512_setzero_si512()
                };
                let mut sumi = _mm512_setzero_si512();
                for j in 0..4 {
                    let q = load32(at(x, qs_off + 32 * j));
                    let q = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(q),
                        _mm256_srli_epi16::<4>(q),
                    );
                    let mut q = _mm512_and_si512(q, m4);
                    if $high_bits {
                        // Bit 2j of qh[l] is bit 4 of weight 64j + l, bit 2j+1 of 64j + 32 + l.
                        let bits = _mm512_inserti64x4::<1>(
                            _mm512_set1_epi8((1u8 << (2 * j)) as i8),
                            _mm256_set1_epi8((2u8 << (2 * j)) as i8),
                        );
                        let k = _mm512_test_epi8_mask(hb, bits);
                        q = _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
                    }
                    let p = _mm512_maddubs_epi16(q, load64(at(y, 4 + 64 * j)));
                    sumi = madd_acc!($mode, sumi, _mm512_shuffle_epi8(sc, shuf[j]), p);
                }
                let d = _mm512_broadcastss_ps(dd);
                acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
            }
            _mm512_reduce_add_ps(acc) + hsum_ps128(acc_m)
        }
    };
}

k4_kernel!(
    dot_q4k,
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    Q4K_BYTES,
    false
);
k4_kernel!(
    dot_q4k_vnni,
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    Q4K_BYTES,
    false
);
k4_kernel!(
    dot_q5k,
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    Q5K_BYTES,
    true
);
k4_kernel!(
    dot_q5k_vnni,
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    Q5K_BYTES,
    true
);

macro_rules! q6k_kernel {
    ($name:ident, $mode:ident, $features:literal) => {
        /// Q6_K × Q8_K: unsigned 6-bit weights, −32 offset removed via the block sums.
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; Q6K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let m0f = _mm512_set1_epi8(0x0F);
            let m30 = _mm512_set1_epi8(0x30);
            // Per 256-bit half: low weights need qh bits 0-1 (half 0) / 2-3 (half 1) at bits 4-5,
            // high weights bits 4-5 / 6-7.
            let sl = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
            let sr = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
            let shuf_lo = bcast_i16([0, 1, 2, 3]);
            let shuf_hi = bcast_i16([4, 5, 6, 7]);
            let mut acc = _mm512_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = f16x1(at(x, 208)) * f32_of(y);
                let sc16 = _mm256_cvtepi8_epi16(load16(at(x, 192)));
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(at(y, 260)), sc16));
                let scs = [
                    _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16)),
                    _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16)),
                ];
                let mut sumi =
                    _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
                for (half, &sc) in scs.iter().enumerate() {
                    let ql = load64(at(x, 64 * half));
                    let qh = _mm512_broadcast_i64x4(load32(at(x, 128 + 32 * half)));
                    // select(mask, a, b) = (a & mask) | (b & !mask)  (vpternlog 0xCA).
                    let lo = _mm512_ternarylogic_epi64::<0xCA>(
                        m0f,
                        ql,
                        _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30),
                    );
                    let hi = _mm512_ternarylogic_epi64::<0xCA>(
                        m0f,
                        _mm512_srli_epi16::<4>(ql),
                        _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30),
                    );
                    let base = 4 + 128 * half;
                    let plo = _mm512_maddubs_epi16(lo, load64(at(y, base)));
                    let phi = _mm512_maddubs_epi16(hi, load64(at(y, base + 64)));
                    sumi = madd_acc!($mode, sumi, _mm512_shuffle_epi8(sc, shuf_lo), plo);
                    sumi = madd_acc!($mode, sumi, _mm512_shuffle_epi8(sc, shuf_hi), phi);
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            _mm512_reduce_add_ps(acc)
        }
    };
}

q6k_kernel!(dot_q6k, plain, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");
q6k_kernel!(
    dot_q6k_vnni,
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
