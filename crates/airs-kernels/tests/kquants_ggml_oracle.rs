//! TEMPORARY (not for commit): compare against outputs of ggml's C code.
use airs_kernels::*;

#[test]
fn ggml_oracle() {
    let Ok(path) = std::env::var("AIRS_GGML_ORACLE") else { return };
    let data = std::fs::read(path).unwrap();
    let n = 4096usize;
    let mut off = 0;
    let mut take = |k: usize| { let s = &data[off..off + k]; off += k; s };
    let f32s = |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    let mut worst = std::collections::BTreeMap::new();
    let mut count = 0;
    while count < 100 {
        count += 1;
        let id = i32::from_le_bytes(take(4).try_into().unwrap());
        let ty = match id { 10 => GgmlType::Q2K, 11 => GgmlType::Q3K, 12 => GgmlType::Q4K, 13 => GgmlType::Q5K, 14 => GgmlType::Q6K, _ => panic!() };
        let rb = row_bytes(ty, n).unwrap();
        let x = f32s(take(4 * n));
        let qb = take(rb).to_vec();
        let y = f32s(take(4 * n));
        let a = f32s(take(4 * n));
        let ab = take(16 * 292).to_vec();
        let d_avx2 = f32::from_le_bytes(take(4).try_into().unwrap());
        let d_gen = f32::from_le_bytes(take(4).try_into().unwrap());
        let mut q = vec![0u8; rb];
        quantize_row(ty, &x, &mut q).unwrap();
        let nd = q.iter().zip(&qb).filter(|(a, b)| a != b).count();
        assert_eq!(nd, 0, "{ty:?} record {count}: {nd} quantized bytes differ");
        let mut yy = vec![0f32; n];
        dequantize_row(ty, &qb, &mut yy).unwrap();
        assert!(yy.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?} dequant");
        let mut aq = vec![0u8; 16 * 292];
        quantize_act(ActType::Q8K, &a, &mut aq).unwrap();
        // ggml leaves bsums of all-zero blocks unwritten: compare d+qs always, bsums otherwise.
        for (blk, (m, g)) in aq.chunks_exact(292).zip(ab.chunks_exact(292)).enumerate() {
            let zero = g[0..4] == [0, 0, 0, 0];
            let upto = if zero { 260 } else { 292 };
            assert_eq!(&m[..upto], &g[..upto], "{ty:?} q8k block {blk}");
        }
        for isa in Isa::all_available() {
            let got = dot(isa, ty, n, &qb, &aq).unwrap();
            for (name, want) in [("avx2", d_avx2), ("generic", d_gen)] {
                let rel = ((got - want) / want.abs().max(1e-30)).abs();
                let e = worst.entry((format!("{ty:?}"), format!("{isa:?}"), name)).or_insert(0f32);
                *e = e.max(rel);
            }
        }
    }
    for (k, v) in worst { eprintln!("{k:?}: max rel diff {v:e}"); }
}
