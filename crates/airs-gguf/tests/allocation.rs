//! Memory bounds of `Gguf::parse`: a counting global allocator records the largest single
//! allocation and the peak of live heap bytes while one parse runs. Lying counts and lengths
//! must be refused before anything proportional to them is reserved, and even a count that
//! passes the bytes-left check in a large file must not reserve table space up front.
//! This binary holds a single test so no other thread allocates while it measures.
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use airs_gguf::{Gguf, GgufErrorKind as K};
use common::*;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn record_alloc(size: usize) {
    let live = LIVE.fetch_add(size, Relaxed) + size;
    PEAK.fetch_max(live, Relaxed);
    LARGEST.fetch_max(size, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is exactly System's; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded under the caller's guarantees (non-zero size layout).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            record_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above (i.e. by System) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Largest single allocation and peak extra live bytes while `f` runs.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    LARGEST.store(0, Relaxed);
    let out = f();
    (
        out,
        LARGEST.load(Relaxed),
        PEAK.load(Relaxed).saturating_sub(base),
    )
}

const LIMIT: usize = 1 << 20;

fn assert_refused_within_limit(name: &str, bytes: &[u8], expect: impl Fn(&K) -> bool) {
    let (kind, largest, peak) =
        measure(|| Gguf::parse(bytes).map(|_| ()).unwrap_err().kind().clone());
    assert!(expect(&kind), "{name}: wrong error {kind:?}");
    assert!(
        largest < LIMIT,
        "{name}: largest allocation {largest} bytes"
    );
    assert!(peak < LIMIT, "{name}: peak {peak} bytes");
}

#[test]
fn parse_never_allocates_in_proportion_to_a_lying_field() {
    let l = small();
    let patched = |at: usize, v: u64, wide: bool| {
        let mut b = l.bytes.clone();
        if wide {
            put_u64(&mut b, at, v);
        } else {
            put_u32(&mut b, at, v as u32);
        }
        b
    };
    for n in [u64::MAX, 1 << 40, 1 << 32] {
        assert_refused_within_limit("kv count", &patched(KV_COUNT_AT, n, true), |k| {
            matches!(k, K::CountTooLarge { .. })
        });
        assert_refused_within_limit("tensor count", &patched(TENSOR_COUNT_AT, n, true), |k| {
            matches!(k, K::CountTooLarge { .. })
        });
        assert_refused_within_limit("array length", &patched(l.kv[2].value + 4, n, true), |k| {
            matches!(k, K::CountTooLarge { .. })
        });
        assert_refused_within_limit("string length", &patched(l.kv[0].value, n, true), |k| {
            matches!(k, K::StringTooLong { .. })
        });
    }
    assert_refused_within_limit(
        "dims",
        &patched(l.tensors[0].n_dims, u64::MAX, false),
        |k| matches!(k, K::TooManyDims { .. }),
    );

    // 16 MiB of zeros after the header: the counts below pass the bytes-left check (each
    // zero-filled entry is a well-formed 13-byte metadata entry or 24-byte tensor info with an
    // empty name), so the parser starts reading; the second entry is a duplicate. Reserving
    // the claimed counts up front would take tens of megabytes.
    let body = 16 << 20;
    let mut zeros = vec![0u8; HEADER_LEN + body];
    zeros[..8].copy_from_slice(&l.bytes[..8]);
    put_u64(&mut zeros, KV_COUNT_AT, (body / 13) as u64);
    assert_refused_within_limit(
        "zero-filled metadata",
        &zeros,
        |k| matches!(k, K::DuplicateKey(key) if key.is_empty()),
    );
    put_u64(&mut zeros, KV_COUNT_AT, 0);
    put_u64(&mut zeros, TENSOR_COUNT_AT, (body / 24) as u64);
    assert_refused_within_limit(
        "zero-filled tensor table",
        &zeros,
        |k| matches!(k, K::DuplicateTensor(name) if name.is_empty()),
    );

    // and valid real files cost only their small tables: the vocabularies stay in the image
    for rel in [
        "models/stories260K.gguf",
        "testdata/tokenizer/ggml-vocab-llama-bpe.gguf",
        "testdata/tokenizer/ggml-vocab-qwen2.gguf",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel);
        let bytes = std::fs::read(&path).unwrap();
        let (tables, largest, peak) = measure(|| {
            let g = Gguf::parse(&bytes).unwrap();
            (g.metadata().len(), g.tensors().len())
        });
        assert!(
            largest < 64 << 10 && peak < 256 << 10,
            "{rel} {tables:?}: largest {largest}, peak {peak}"
        );
    }
}
