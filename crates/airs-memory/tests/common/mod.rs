//! Test fixtures: model-like files of seeded pseudo-random bytes and a fake GGUF-like layout.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use airs_memory::{RegionLayout, SpanKind};

pub const MIB: u64 = 1 << 20;
/// Fake model: 20 MiB minus an odd tail so the last page is partial.
pub const FILE_LEN: u64 = 20 * MIB - 123;
pub const LAYERS: u32 = 8;
pub const LAYER_BYTES: u64 = 3 * MIB / 2;
pub const EMBEDDING: std::ops::Range<u64> = 2 * MIB..6 * MIB;

/// A temporary file removed on drop.
pub struct TempModel {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

impl Drop for TempModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Seeded xorshift64* bytes.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a model-like file of `len` bytes.
pub fn temp_model(len: u64, seed: u64) -> TempModel {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!(
        "airs-memory-test-{}-{}.bin",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let bytes = pseudo_random(len as usize, seed);
    std::fs::write(&path, &bytes).unwrap();
    TempModel { path, bytes }
}

/// The standard 20 MiB fake model.
pub fn standard_model(seed: u64) -> TempModel {
    temp_model(FILE_LEN, seed)
}

/// Header 0..2M (other), embedding 2M..6M, 8 layers of 1.5 MiB from 6M, output 18M..end.
pub fn standard_layout() -> RegionLayout {
    let mut l = RegionLayout::whole_file(FILE_LEN)
        .with_span(0, 2 * MIB, SpanKind::Other)
        .with_span(EMBEDDING.start, EMBEDDING.end, SpanKind::Embedding);
    for n in 0..LAYERS {
        let r = layer_range(n);
        l = l.with_span(r.start, r.end, SpanKind::Layer(n));
    }
    l.with_span(18 * MIB, FILE_LEN, SpanKind::Other)
}

pub fn layer_range(n: u32) -> std::ops::Range<u64> {
    let start = 6 * MIB + u64::from(n) * LAYER_BYTES;
    start..start + LAYER_BYTES
}

/// Whether THP can be used here (madvise or always).
pub fn thp_usable() -> bool {
    matches!(
        airs_memory::thp_mode(),
        airs_memory::ThpMode::Always | airs_memory::ThpMode::Madvise
    )
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
