//! Unit tests of k-quant internals. The public behaviour (dispatch, quantizers, errors) is tested
//! in `tests/kquants_kernels.rs`; here every kernel variant is called directly, including those
//! the dispatcher would not pick on this CPU (AVX-512 without VNNI, NEON without `sdot`).

use super::*;

fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// `nb` random blocks of `B` bytes whose f16 factors at `f16_offs` are small positive values.
fn random_blocks<const B: usize>(seed: &mut u64, nb: usize, f16_offs: &[usize]) -> Vec<[u8; B]> {
    (0..nb)
        .map(|_| {
            let mut b = [0u8; B];
            b.iter_mut().for_each(|v| *v = rng(seed) as u8);
            for &o in f16_offs {
                put_f16(&mut b, o, 0.001 + (rng(seed) % 1000) as f32 * 1e-5);
            }
            b
        })
        .collect()
}

fn random_act(seed: &mut u64, nb: usize) -> Vec<[u8; Q8K_BYTES]> {
    let x: Vec<f32> = (0..nb * QK_K)
        .map(|_| (rng(seed) % 20001) as f32 / 1000.0 - 10.0)
        .collect();
    let mut a = vec![0u8; nb * Q8K_BYTES];
    reference::quantize_q8k(&x, &mut a);
    a.as_chunks::<Q8K_BYTES>().0.to_vec()
}

/// Σ |w_i · a_i| over the dequantized rows: the scale of the f32 rounding error.
fn magnitude<const B: usize>(
    dequant: fn(&[u8], &mut [f32]),
    w: &[[u8; B]],
    a: &[[u8; Q8K_BYTES]],
) -> f32 {
    let n = w.len() * QK_K;
    let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
    dequant(w.as_flattened(), &mut wf);
    reference::dequant_q8k(a.as_flattened(), &mut af);
    wf.iter().zip(&af).map(|(x, y)| (x * y).abs()).sum()
}

fn close(got: f32, want: f32, mag: f32, what: &str) {
    assert!(
        (got - want).abs() <= 1e-5 * mag + 1e-6,
        "{what}: {got} vs reference {want} (Σ|w·a| = {mag})"
    );
}

/// Run `check(nb, seed)` for a few block counts (1, 8, 19, 22 super-blocks).
fn for_sizes(mut check: impl FnMut(usize, &mut u64)) {
    let mut seed = 0xabcdef;
    for nb in [1, 8, 19, 22] {
        for _ in 0..4 {
            check(nb, &mut seed);
        }
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    use reference::nearest_int;
    assert_eq!(nearest_int(0.5), 0);
    assert_eq!(nearest_int(1.5), 2);
    assert_eq!(nearest_int(2.5), 2);
    assert_eq!(nearest_int(-0.5), 0);
    assert_eq!(nearest_int(-1.5), -2);
    assert_eq!(nearest_int(-2.4999), -2);
    assert_eq!(nearest_int(126.6), 127);
    assert_eq!(nearest_int(-127.2), -127);
    assert_eq!(nearest_int(4194303.0), 4194303);
}

#[test]
fn k4_scale_unpacking_matches_get_scale_min_k4() {
    let mut seed = 7;
    for _ in 0..1000 {
        let s: Vec<u8> = (0..12).map(|_| rng(&mut seed) as u8).collect();
        let want: Vec<(u8, u8)> = (0..8).map(|j| reference::scale_min_k4(j, &s)).collect();
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.is_available() {
            let mut buf = [0u8; 16];
            buf[..12].copy_from_slice(&s);
            let mut out = [0u8; 16];
            // SAFETY: AVX2 was detected just above.
            let v = unsafe { avx2::unpack_k4_scales(avx2::load16(&buf)) };
            // SAFETY: `out` is 16 writable bytes; storeu has no alignment requirement.
            unsafe { std::arch::x86_64::_mm_storeu_si128(out.as_mut_ptr().cast(), v) };
            for j in 0..8 {
                assert_eq!((out[j], out[8 + j]), want[j], "sub-block {j}");
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let (sc, m) = neon::k4_scales(&s);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), want[j], "sub-block {j}");
            }
        }
    }
}

#[test]
fn all_q4k_variants_agree() {
    for_sizes(|nb, seed| {
        let w = random_blocks::<Q4K_BYTES>(seed, nb, &[0, 2]);
        let a = random_act(seed, nb);
        let want = reference::dot_q4k(&w, &a);
        let mag = magnitude(reference::dequant_q4k, &w, &a);
        #[cfg(target_arch = "x86_64")]
        {
            let f = features::get();
            if f & features::AVX2 != 0 {
                // SAFETY: AVX2+FMA+F16C detected.
                close(unsafe { avx2::dot_q4k(&w, &a) }, want, mag, "avx2 q4k");
            }
            if f & features::AVX_VNNI != 0 {
                // SAFETY: AVX2+FMA+F16C and AVX-VNNI detected.
                close(
                    unsafe { avx2::dot_q4k_vnni(&w, &a) },
                    want,
                    mag,
                    "avx-vnni q4k",
                );
            }
            if f & features::AVX512 != 0 {
                // SAFETY: AVX-512 F/BW/VL + AVX2 detected.
                close(unsafe { avx512::dot_q4k(&w, &a) }, want, mag, "avx512 q4k");
            }
            if f & features::AVX512_VNNI != 0 {
                // SAFETY: AVX-512 F/BW/VL/VNNI + AVX2 detected.
                close(
                    unsafe { avx512::dot_q4k_vnni(&w, &a) },
                    want,
                    mag,
                    "avx512 vnni q4k",
                );
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let f = features::get();
            if f & features::NEON != 0 {
                // SAFETY: NEON detected.
                close(unsafe { neon::dot_q4k(&w, &a) }, want, mag, "neon q4k");
            }
            if f & features::DOTPROD != 0 {
                // SAFETY: NEON + dotprod detected.
                close(unsafe { neon::dot_q4k_sdot(&w, &a) }, want, mag, "sdot q4k");
            }
        }
    });
}

#[test]
fn all_q5k_variants_agree() {
    for_sizes(|nb, seed| {
        let w = random_blocks::<Q5K_BYTES>(seed, nb, &[0, 2]);
        let a = random_act(seed, nb);
        let want = reference::dot_q5k(&w, &a);
        let mag = magnitude(reference::dequant_q5k, &w, &a);
        #[cfg(target_arch = "x86_64")]
        {
            let f = features::get();
            if f & features::AVX2 != 0 {
                // SAFETY: AVX2+FMA+F16C detected.
                close(unsafe { avx2::dot_q5k(&w, &a) }, want, mag, "avx2 q5k");
            }
            if f & features::AVX_VNNI != 0 {
                // SAFETY: AVX2+FMA+F16C and AVX-VNNI detected.
                close(
                    unsafe { avx2::dot_q5k_vnni(&w, &a) },
                    want,
                    mag,
                    "avx-vnni q5k",
                );
            }
            if f & features::AVX512 != 0 {
                // SAFETY: AVX-512 F/BW/VL + AVX2 detected.
                close(unsafe { avx512::dot_q5k(&w, &a) }, want, mag, "avx512 q5k");
            }
            if f & features::AVX512_VNNI != 0 {
                // SAFETY: AVX-512 F/BW/VL/VNNI + AVX2 detected.
                close(
                    unsafe { avx512::dot_q5k_vnni(&w, &a) },
                    want,
                    mag,
                    "avx512 vnni q5k",
                );
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let f = features::get();
            if f & features::NEON != 0 {
                // SAFETY: NEON detected.
                close(unsafe { neon::dot_q5k(&w, &a) }, want, mag, "neon q5k");
            }
            if f & features::DOTPROD != 0 {
                // SAFETY: NEON + dotprod detected.
                close(unsafe { neon::dot_q5k_sdot(&w, &a) }, want, mag, "sdot q5k");
            }
        }
    });
}

#[test]
fn all_q6k_variants_agree() {
    for_sizes(|nb, seed| {
        let w = random_blocks::<Q6K_BYTES>(seed, nb, &[208]);
        let a = random_act(seed, nb);
        let want = reference::dot_q6k(&w, &a);
        let mag = magnitude(reference::dequant_q6k, &w, &a);
        #[cfg(target_arch = "x86_64")]
        {
            let f = features::get();
            if f & features::AVX2 != 0 {
                // SAFETY: AVX2+FMA+F16C detected.
                close(unsafe { avx2::dot_q6k(&w, &a) }, want, mag, "avx2 q6k");
            }
            if f & features::AVX_VNNI != 0 {
                // SAFETY: AVX2+FMA+F16C and AVX-VNNI detected.
                close(
                    unsafe { avx2::dot_q6k_vnni(&w, &a) },
                    want,
                    mag,
                    "avx-vnni q6k",
                );
            }
            if f & features::AVX512 != 0 {
                // SAFETY: AVX-512 F/BW/VL + AVX2 detected.
                close(unsafe { avx512::dot_q6k(&w, &a) }, want, mag, "avx512 q6k");
            }
            if f & features::AVX512_VNNI != 0 {
                // SAFETY: AVX-512 F/BW/VL/VNNI + AVX2 detected.
                close(
                    unsafe { avx512::dot_q6k_vnni(&w, &a) },
                    want,
                    mag,
                    "avx512 vnni q6k",
                );
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let f = features::get();
            if f & features::NEON != 0 {
                // SAFETY: NEON detected.
                close(unsafe { neon::dot_q6k(&w, &a) }, want, mag, "neon q6k");
            }
            if f & features::DOTPROD != 0 {
                // SAFETY: NEON + dotprod detected.
                close(unsafe { neon::dot_q6k_sdot(&w, &a) }, want, mag, "sdot q6k");
            }
        }
    });
}

#[test]
fn q2k_q3k_variants_agree() {
    for_sizes(|nb, seed| {
        let w2 = random_blocks::<Q2K_BYTES>(seed, nb, &[80, 82]);
        let w3 = random_blocks::<Q3K_BYTES>(seed, nb, &[108]);
        let a = random_act(seed, nb);
        let want2 = reference::dot_q2k(&w2, &a);
        let want3 = reference::dot_q3k(&w3, &a);
        let mag2 = magnitude(reference::dequant_q2k, &w2, &a);
        let mag3 = magnitude(reference::dequant_q3k, &w3, &a);
        #[cfg(target_arch = "x86_64")]
        if features::get() & features::AVX2 != 0 {
            // SAFETY: AVX2+FMA+F16C detected.
            close(unsafe { avx2::dot_q2k(&w2, &a) }, want2, mag2, "avx2 q2k");
            // SAFETY: AVX2+FMA+F16C detected.
            close(unsafe { avx2::dot_q3k(&w3, &a) }, want3, mag3, "avx2 q3k");
        }
        let _ = (want2, want3, mag2, mag3);
    });
}

#[test]
fn unavailable_isa_falls_back_to_scalar() {
    eprintln!(
        "k-quant path for {:?}: {:?}",
        Isa::detect(),
        path(Isa::detect())
    );
    // `path` only trusts what it detected itself.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(path(Isa::Neon), Path::Scalar);
    #[cfg(target_arch = "aarch64")]
    {
        assert_eq!(path(Isa::Avx2), Path::Scalar);
        assert_eq!(path(Isa::Avx512), Path::Scalar);
    }
    assert_eq!(path(Isa::Scalar), Path::Scalar);
}
