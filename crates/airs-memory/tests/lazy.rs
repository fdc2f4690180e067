//! The lazy (userfaultfd) loader: concurrent faults, fault-around granularity in the embedding
//! table, layer prefetch ahead of the filler, and read errors that must not hang readers.

mod common;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use airs_memory::{ErrorKind, LoadOptions, LoaderKind, ModelRegion, NoticeKind};
use common::*;

fn lazy(model: &TempModel, options: LoadOptions) -> Arc<ModelRegion> {
    let region = ModelRegion::load(&model.path, standard_layout(), &options).expect("load");
    assert_eq!(
        region.loader_kind(),
        LoaderKind::Lazy,
        "{:?}",
        region.notices()
    );
    region
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

#[test]
fn concurrent_faults_on_same_and_different_chunks_get_correct_data() {
    let model = standard_model(21);
    let region = lazy(
        &model,
        LoadOptions {
            background_fill: false,
            prefetch_layers: 0, // only faults fill chunks here
            chunk_bytes: 1 << 20,
            storage_bytes_per_s: Some(400 * MIB),
            ..LoadOptions::default()
        },
    );
    let expected = Arc::new(model.bytes.clone());
    // Two threads on chunk 7, one each on chunks 12, 15 and the last (partial) chunk 19.
    let ranges = [
        (7 * MIB, 8 * MIB),
        (7 * MIB + 4096, 8 * MIB),
        (12 * MIB, 13 * MIB),
        (15 * MIB + 100, 16 * MIB - 100),
        (19 * MIB, FILE_LEN),
    ];
    let threads: Vec<_> = ranges
        .iter()
        .map(|&(s, e)| {
            let (r, exp) = (region.clone(), expected.clone());
            std::thread::spawn(move || {
                let (s, e) = (s as usize, e as usize);
                r.as_bytes()[s..e] == exp[s..e]
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap(), "a thread saw wrong bytes");
    }
    let loader = region.loader();
    assert!(loader.is_filled(7 * MIB..8 * MIB));
    assert!(
        !loader.is_filled(0..MIB),
        "filler is off: untouched chunks stay empty"
    );
    // Every chunk read once: filled bytes count each chunk once.
    assert_eq!(loader.progress().filled_bytes, 4 * MIB - 123);
    assert!(loader.error().is_none());
}

#[test]
fn embedding_fault_fills_only_the_touched_chunk() {
    let model = standard_model(22);
    let chunk = 512u64 << 10;
    let region = lazy(
        &model,
        LoadOptions {
            background_fill: false,
            chunk_bytes: chunk as usize,
            ..LoadOptions::default()
        },
    );
    let loader = region.loader();
    assert_eq!(loader.progress().filled_bytes, 0);
    let offset = EMBEDDING.start + 3 * chunk + 777;
    assert_eq!(
        region.as_bytes()[offset as usize],
        model.bytes[offset as usize]
    );
    assert_eq!(loader.progress().filled_bytes, chunk, "exactly one chunk");
    let touched = EMBEDDING.start + 3 * chunk;
    assert!(loader.is_filled(touched..touched + chunk));
    assert!(!loader.is_filled(EMBEDDING.start..EMBEDDING.start + chunk));
    assert!(!loader.is_filled(touched + chunk..touched + 2 * chunk));
    assert_eq!(loader.current_layer(), None, "embedding is no layer hint");
    // Give a would-be prefetcher time: still one chunk.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(loader.progress().filled_bytes, chunk);
    // Dropping a region mid-load stops its threads.
    drop(region);
    assert!(loader.wait_resident().is_err());
}

#[test]
fn enter_layer_prefetches_next_layers_before_the_filler() {
    let model = standard_model(23);
    let region = lazy(
        &model,
        LoadOptions {
            chunk_bytes: 256 << 10,
            filler_bytes_per_s: Some(2 * MIB), // a crawl: the filler needs ~10 s for the file
            ..LoadOptions::default()
        },
    );
    let loader = region.loader();
    let t0 = Instant::now();
    loader.enter_layer(4);
    let (l5, l6) = (layer_range(5), layer_range(6));
    assert!(
        wait_until(Duration::from_secs(5), || loader.is_filled(l5.clone())
            && loader.is_filled(l6.clone())),
        "layers 5 and 6 were not prefetched"
    );
    let elapsed = t0.elapsed();
    // The filler works in order from the header; it cannot have reached layers 1..4, nor 7.
    for n in [1, 2, 3, 4, 7] {
        assert!(!loader.is_filled(layer_range(n)), "layer {n} filled early");
    }
    assert!(
        loader.progress().filled_bytes < 6 * MIB,
        "{:?} after {elapsed:?}",
        loader.progress()
    );
    // And the bytes are right.
    let (s, e) = (l5.start as usize, l6.end as usize);
    assert!(region.as_bytes()[s..e] == model.bytes[s..e]);
}

#[test]
fn fault_in_a_layer_prefetches_the_following_layers() {
    let model = standard_model(24);
    let region = lazy(
        &model,
        LoadOptions {
            chunk_bytes: 256 << 10,
            background_fill: false,
            ..LoadOptions::default()
        },
    );
    let loader = region.loader();
    let at = layer_range(2).start as usize + 10;
    assert_eq!(region.as_bytes()[at], model.bytes[at]);
    assert_eq!(loader.current_layer(), Some(2));
    assert!(wait_until(Duration::from_secs(5), || loader
        .is_filled(layer_range(3))
        && loader.is_filled(layer_range(4))));
    assert!(!loader.is_filled(layer_range(6)));
}

#[test]
fn truncated_file_reports_error_instead_of_hanging() {
    let model = standard_model(25);
    let region = lazy(
        &model,
        LoadOptions {
            chunk_bytes: 256 << 10,
            storage_bytes_per_s: Some(10 * MIB), // ~2 s for the whole file
            ..LoadOptions::default()
        },
    );
    // Truncate right after the load started: most of the file is not loaded yet.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model.path)
        .unwrap()
        .set_len(5 * MIB)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = region.clone();
    std::thread::spawn(move || {
        let sum: u64 = reader.as_bytes().iter().map(|&b| u64::from(b)).sum();
        let _ = tx.send(sum);
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("reading the whole region must not hang");
    let loader = region.loader();
    let error = loader.error().expect("sticky error");
    assert_eq!(error.kind(), ErrorKind::Truncated, "{error}");
    let waited = loader.wait_resident_timeout(Duration::from_secs(30));
    assert_eq!(waited.unwrap_err().kind(), ErrorKind::Truncated);
    assert!(
        region
            .notices()
            .iter()
            .any(|n| n.kind == NoticeKind::LoadFailed)
    );
    let _session = region.acquire();
    assert!(!region.is_safe_for_inference());
    // Bytes loaded before the truncation are still right.
    assert_eq!(region.as_bytes()[..4096], model.bytes[..4096]);
}

#[test]
fn removed_file_still_loads_from_the_open_descriptor() {
    let model = standard_model(26);
    let region = lazy(
        &model,
        LoadOptions {
            storage_bytes_per_s: Some(100 * MIB),
            ..LoadOptions::default()
        },
    );
    std::fs::remove_file(&model.path).unwrap();
    assert!(region.as_bytes() == model.bytes.as_slice());
    region.loader().wait_resident().unwrap();
}

#[test]
fn lazy_reaches_first_layer_before_eager_would_finish() {
    // With SD-card-like storage, the first layer is readable long before the whole file is.
    let model = standard_model(27);
    let rate = 50 * MIB; // whole file: ~0.4 s
    let t0 = Instant::now();
    let region = lazy(
        &model,
        LoadOptions {
            storage_bytes_per_s: Some(rate),
            ..LoadOptions::default()
        },
    );
    let loader = region.loader();
    loader.enter_layer(0);
    let l0 = layer_range(0);
    let b = &region.as_bytes()[l0.start as usize..l0.end as usize];
    assert!(b == &model.bytes[l0.start as usize..l0.end as usize]);
    let first_layer = t0.elapsed();
    loader.wait_resident().unwrap();
    let all = t0.elapsed();
    assert!(first_layer < all, "{first_layer:?} vs {all:?}");
    assert!(region.as_bytes() == model.bytes.as_slice());
}
