//! How finely the matrix products are dealt to the threads (`ChunksPerThread`, which
//! `airs bench decode --alternate-chunks` switches between steps) changes only the speed: a
//! prompt's rows-kernel chunks and every decode step give the same bits with one chunk a thread
//! as with two, eight or 32, on a real model whose products are all dealt (none is small enough
//! to run whole on the calling thread).
mod paged_common;

use airs_engine::{KvType, PagedKv, Runtime};
use paged_common::{assert_same_bits, greedy_run, load, pool};

#[test]
fn qwen_logits_do_not_depend_on_how_finely_products_are_dealt() {
    let model = load(&airs_testdata::qwen_path());
    let p = pool(&model, KvType::F16, 16, 8);
    // 12 prompt tokens in chunks of 6 (several tokens on the rows kernels of the repacked
    // matrices), then 8 greedy decode steps.
    let prompt: Vec<u32> = (0..12).map(|i| 100 + 37 * i).collect();
    let rt = Runtime::new(2);
    let mut runs = Vec::new();
    for chunks in [1, 2, 8, 32] {
        rt.pool.chunks_per_thread().set_one_token(chunks);
        rt.pool.chunks_per_thread().set_several_tokens(chunks);
        assert_eq!(rt.pool.chunks_per_thread().of(1), chunks);
        assert_eq!(rt.pool.chunks_per_thread().of(6), chunks);
        let mut kv = PagedKv::new_sequence(&p, None);
        let (rows, ids) = greedy_run(&model, &rt, &mut kv, &prompt, 6, 8);
        runs.push((chunks, rows, ids));
    }
    let (_, want_rows, want_ids) = &runs[0];
    for (chunks, rows, ids) in &runs[1..] {
        assert_eq!(ids, want_ids, "{chunks} chunks a thread");
        assert_same_bits(rows, want_rows, &format!("{chunks} chunks a thread"));
    }
}
