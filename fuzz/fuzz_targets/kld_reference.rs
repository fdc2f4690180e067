//! KL-divergence reference files (`airs perplexity --kld-ref`): any bytes parse into a
//! reference whose every checked index holds (chunks inside the text, scored `next` ids equal
//! to the text's, `top_k` vocabulary ids per position) or into a typed error — never a panic.
#![no_main]

use airs_runtime::perplexity::KldReference;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = KldReference::parse(data) {
        for (c, chunk) in r.chunks.iter().enumerate() {
            assert_eq!(chunk.start, c * r.n_ctx);
            assert!(chunk.start + r.n_ctx <= r.text_token_ids.len());
            for (i, p) in chunk.positions.iter().enumerate() {
                assert_eq!(p.next, r.text_token_ids[chunk.start + chunk.first_scored + i + 1]);
                assert!(p.top.len() == r.top_k && p.top.iter().all(|t| (t.0 as usize) < r.n_vocab));
            }
        }
        // Log-probabilities are finite and at most 0, so the perplexity is at least 1 (or
        // infinite when their sum overflows).
        assert!(r.perplexity(r.chunks.len()) >= 1.0 - 1e-6);
    }
});
