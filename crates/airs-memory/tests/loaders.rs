//! Each loader yields an exact image of the file; eager and lazy regions end up locked, huge-page
//! backed and read-only; forced degradations produce notices and still correct bytes.

mod common;

use std::process::Command;
use std::time::Duration;

use airs_memory::{Backing, LoadOptions, LoaderKind, ModelRegion, NoticeKind};
use common::*;

fn load(model: &TempModel, options: &LoadOptions) -> std::sync::Arc<ModelRegion> {
    ModelRegion::load(&model.path, standard_layout(), options).expect("load")
}

fn assert_finalized(region: &ModelRegion) {
    let stats = region.stats();
    assert_eq!(stats.backing, Backing::Anonymous);
    assert!(stats.read_only, "{stats:?}");
    assert!(stats.pinned, "{stats:?}");
    assert_eq!(stats.filled_bytes, Some(FILE_LEN));
    assert_eq!(stats.locked_bytes, stats.mapped_bytes, "{stats:?}");
    assert_eq!(stats.resident_bytes, stats.mapped_bytes, "{stats:?}");
    if thp_usable() {
        assert!(
            stats.huge_page_bytes * 2 >= stats.mapped_bytes,
            "at least half huge pages: {stats:?} {:?}",
            region.notices()
        );
    }
    assert_eq!(
        region.as_bytes().as_ptr() as usize % stats.huge_page_size,
        0,
        "region aligned to the PMD size"
    );
}

#[test]
fn eager_region_is_exact_locked_huge_and_read_only() {
    let model = standard_model(1);
    let region = load(&model, &LoadOptions::with_loader(LoaderKind::Eager));
    assert_eq!(region.loader_kind(), LoaderKind::Eager);
    assert!(region.as_bytes() == model.bytes.as_slice());
    assert!(region.loader().is_resident());
    assert_finalized(&region);
    assert!(region.notices().is_empty(), "{:?}", region.notices());
}

#[test]
fn lazy_region_is_exact_locked_huge_and_read_only() {
    let model = standard_model(2);
    let region = load(&model, &LoadOptions::default());
    assert_eq!(region.loader_kind(), LoaderKind::Lazy);
    // Reads may start before the load completes.
    assert!(region.as_bytes() == model.bytes.as_slice());
    let loader = region.loader();
    loader.wait_resident().expect("lazy load completes");
    assert!(loader.fully_resident_after().is_some());
    assert!(loader.error().is_none());
    assert_finalized(&region);
    assert!(region.as_bytes() == model.bytes.as_slice());
    assert!(region.notices().is_empty(), "{:?}", region.notices());
}

#[test]
fn mmap_region_is_exact_file_backed_and_not_pinned() {
    let model = standard_model(3);
    let region = load(&model, &LoadOptions::with_loader(LoaderKind::Mmap));
    assert!(region.as_bytes() == model.bytes.as_slice());
    let stats = region.stats();
    assert_eq!(stats.backing, Backing::FileMapping);
    assert!(stats.read_only && !stats.pinned);
    assert_eq!(stats.filled_bytes, None);
    assert!(stats.resident_bytes > 0);
    let session = region.acquire();
    assert!(!session.is_safe_for_inference(), "mmap is never pinned");
}

#[test]
fn refcount_and_inference_safety() {
    let model = standard_model(4);
    let region = load(&model, &LoadOptions::with_loader(LoaderKind::Eager));
    assert_eq!(region.refcount(), 0);
    assert!(!region.is_safe_for_inference(), "no session holds it");
    let a = region.acquire();
    assert!(region.is_safe_for_inference());
    let b = a.clone();
    assert_eq!(region.refcount(), 2);
    assert_eq!(b.bytes()[..64], model.bytes[..64]);
    drop(a);
    assert_eq!(region.refcount(), 1);
    assert!(b.is_safe_for_inference());
    drop(b);
    assert_eq!(region.refcount(), 0);
    assert!(!region.is_safe_for_inference());
}

#[test]
fn lazy_region_is_not_safe_until_resident() {
    let model = standard_model(5);
    let options = LoadOptions {
        background_fill: false,
        ..LoadOptions::default()
    };
    let region = load(&model, &options);
    let _session = region.acquire();
    assert!(!region.is_safe_for_inference(), "not pinned while loading");
    assert!(!region.loader().is_resident());
    // Touch every chunk: the faults load everything, then the loader finalizes.
    assert!(region.as_bytes() == model.bytes.as_slice());
    region.loader().wait_resident().unwrap();
    assert!(region.is_safe_for_inference());
}

#[test]
fn no_uffd_falls_back_to_mmap_with_notice() {
    let model = standard_model(6);
    let options = LoadOptions {
        force_no_uffd: true,
        ..LoadOptions::default()
    };
    let region = load(&model, &options);
    assert_eq!(region.loader_kind(), LoaderKind::Mmap);
    let notices = region.notices();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].kind, NoticeKind::LazyFellBackToMmap);
    assert!(notices[0].to_string().contains("MADV_WILLNEED"));
    assert!(!notices[0].to_string().contains('\n'));
    region.loader().enter_layer(3);
    assert!(region.as_bytes() == model.bytes.as_slice());
    assert!(!region.stats().pinned);
    assert!(region.loader().wait_resident().is_ok());
}

#[test]
fn refused_mlock_pins_on_fault_with_notice() {
    let model = standard_model(7);
    for loader in [LoaderKind::Eager, LoaderKind::Lazy] {
        let options = LoadOptions {
            loader,
            force_no_mlock: true,
            ..LoadOptions::default()
        };
        let region = load(&model, &options);
        region.loader().wait_resident().unwrap();
        assert!(region.as_bytes() == model.bytes.as_slice());
        let notices = region.notices();
        assert!(
            notices.iter().any(|n| n.kind == NoticeKind::PinnedOnFault),
            "{notices:?}"
        );
        let stats = region.stats();
        assert!(stats.pinned);
        assert_eq!(stats.locked_bytes, stats.mapped_bytes);
    }
}

#[test]
fn refused_mlock_and_onfault_leave_region_unpinned_with_notice() {
    let model = standard_model(8);
    let options = LoadOptions {
        loader: LoaderKind::Eager,
        force_no_mlock: true,
        force_no_mlock_onfault: true,
        ..LoadOptions::default()
    };
    let region = load(&model, &options);
    assert!(region.as_bytes() == model.bytes.as_slice());
    let notices = region.notices();
    assert!(
        notices.iter().any(|n| n.kind == NoticeKind::NotPinned),
        "{notices:?}"
    );
    let stats = region.stats();
    assert!(!stats.pinned && stats.read_only);
    assert_eq!(stats.locked_bytes, 0);
    let _s = region.acquire();
    assert!(!region.is_safe_for_inference());
}

#[test]
fn no_thp_uses_base_pages_with_notice() {
    let model = standard_model(9);
    for loader in [LoaderKind::Eager, LoaderKind::Lazy] {
        let options = LoadOptions {
            loader,
            force_no_thp: true,
            ..LoadOptions::default()
        };
        let region = load(&model, &options);
        region.loader().wait_resident().unwrap();
        assert!(region.as_bytes() == model.bytes.as_slice());
        let notices = region.notices();
        assert!(
            notices.iter().any(|n| n.kind == NoticeKind::NoHugePages),
            "{notices:?}"
        );
        let stats = region.stats();
        assert_eq!(stats.huge_page_bytes, 0, "{stats:?}");
        assert!(stats.pinned && stats.read_only);
    }
}

#[test]
fn small_chunks_and_tiny_files_work() {
    let model = temp_model(100_000, 10);
    for loader in [LoaderKind::Eager, LoaderKind::Mmap, LoaderKind::Lazy] {
        let options = LoadOptions {
            loader,
            chunk_bytes: 64 << 10,
            ..LoadOptions::default()
        };
        let layout = airs_memory::RegionLayout::whole_file(100_000);
        let region = ModelRegion::load(&model.path, layout, &options).unwrap();
        assert!(region.as_bytes() == model.bytes.as_slice(), "{loader}");
        region.loader().wait_resident().unwrap();
    }
}

#[test]
fn layout_must_match_file() {
    let model = temp_model(4096, 11);
    let layout = airs_memory::RegionLayout::whole_file(4097);
    let e = ModelRegion::load(&model.path, layout, &LoadOptions::default()).unwrap_err();
    assert_eq!(e.kind(), airs_memory::ErrorKind::Layout);
    let missing = ModelRegion::load(
        "/nonexistent/model.gguf",
        airs_memory::RegionLayout::whole_file(1),
        &LoadOptions::default(),
    )
    .unwrap_err();
    assert_eq!(missing.kind(), airs_memory::ErrorKind::Open);
}

/// Environment variable selecting the child mode of `write_into_loaded_region_segfaults`.
const CHILD_MODE: &str = "AIRS_MEMORY_TEST_WRITE_CHILD";

#[test]
fn write_into_loaded_region_segfaults() {
    if let Ok(loader) = std::env::var(CHILD_MODE) {
        let model = standard_model(12);
        let options = LoadOptions::with_loader(loader.parse().unwrap());
        let region = load(&model, &options);
        region.loader().wait_resident().unwrap();
        // The child dies below without running destructors: remove its file now (a mapping
        // keeps the unlinked file's pages).
        std::fs::remove_file(&model.path).unwrap();
        let p = region.as_bytes()[4096..].as_ptr() as *mut u8;
        // SAFETY: deliberately not sound: this child process exists to show that a write into
        // the read-only model region is stopped by the MMU (SIGSEGV) instead of happening.
        unsafe { std::ptr::write_volatile(p, 1) };
        std::process::exit(0); // not reached when the region is read-only
    }
    use std::os::unix::process::ExitStatusExt;
    for loader in ["eager", "lazy", "mmap"] {
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "write_into_loaded_region_segfaults",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_MODE, loader)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGSEGV),
            "{loader}: child status {status:?}"
        );
    }
}

#[test]
fn wait_resident_timeout_reports_progress() {
    let model = standard_model(13);
    let options = LoadOptions {
        storage_bytes_per_s: Some(200 * MIB),
        ..LoadOptions::default()
    };
    let region = load(&model, &options);
    let loader = region.loader();
    let done = loader
        .wait_resident_timeout(Duration::from_secs(20))
        .unwrap();
    assert!(done);
    assert_eq!(loader.progress().filled_bytes, FILE_LEN);
    let after = loader.fully_resident_after().unwrap();
    // 20 MiB at 200 MiB/s cannot take less than ~100 ms.
    assert!(after >= Duration::from_millis(90), "{after:?}");
}

/// A transform that XORs every byte with a function of its file offset, and the first and last
/// `context` bytes of each chunk with the file's bytes mirrored across the chunk's boundary
/// (read from the context the loader passes), recording the chunk offsets it saw.
#[derive(Debug)]
struct OffsetXor {
    chunk_bytes: u64,
    context: u64,
    file_len: u64,
    seen: std::sync::Mutex<Vec<u64>>,
}

impl OffsetXor {
    fn new(chunk_bytes: u64, context: u64) -> Self {
        Self {
            chunk_bytes,
            context,
            file_len: FILE_LEN,
            seen: Default::default(),
        }
    }

    fn byte(offset: u64) -> u8 {
        (offset.wrapping_mul(2_654_435_761) >> 7) as u8
    }

    /// The region this transform must produce from `file`.
    fn expected(&self, file: &[u8]) -> Vec<u8> {
        let len = file.len();
        let mut want: Vec<u8> = file
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ Self::byte(i as u64))
            .collect();
        for start in (0..len).step_by(self.chunk_bytes as usize) {
            let end = (start + self.chunk_bytes as usize).min(len);
            for i in 0..(self.context as usize).min(start) {
                want[start + i] ^= file[start - 1 - i];
            }
            for i in 0..(self.context as usize).min(len - end) {
                want[end - 1 - i] ^= file[end + i];
            }
        }
        want
    }
}

impl airs_memory::ChunkTransform for OffsetXor {
    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn context(&self, chunk: std::ops::Range<u64>) -> (u64, u64) {
        assert_eq!(chunk.start % self.chunk_bytes, 0, "whole chunks");
        (self.context, self.context)
    }

    fn apply(&self, offset: u64, bytes: &mut [u8], context: airs_memory::Context<'_>) {
        assert_eq!(offset % self.chunk_bytes, 0, "whole chunks");
        let end = offset + bytes.len() as u64;
        assert_eq!(context.before.len() as u64, self.context.min(offset));
        assert_eq!(
            context.after.len() as u64,
            self.context.min(self.file_len - end)
        );
        self.seen.lock().unwrap().push(offset);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b ^= Self::byte(offset + i as u64);
        }
        for (i, b) in context.before.iter().rev().enumerate() {
            bytes[i] ^= b;
        }
        let last = bytes.len() - 1;
        for (i, b) in context.after.iter().enumerate() {
            bytes[last - i] ^= b;
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn eager_and_lazy_apply_the_chunk_transform_to_every_chunk_with_its_context_and_mmap_applies_none()
{
    let model = standard_model(5);
    let file = std::fs::read(&model.path).unwrap();
    assert_eq!(file.len() as u64, FILE_LEN);
    let chunk_bytes = 256 << 10;
    for context in [0, 4099] {
        for loader in [LoaderKind::Eager, LoaderKind::Lazy, LoaderKind::Mmap] {
            let transform = std::sync::Arc::new(OffsetXor::new(chunk_bytes as u64, context));
            let want = transform.expected(&file);
            let options = LoadOptions {
                chunk_bytes,
                transform: Some(airs_memory::Transform(transform.clone())),
                ..LoadOptions::with_loader(loader)
            };
            let region = load(&model, &options);
            region.loader().wait_resident().unwrap();
            let bytes = region.as_bytes();
            if loader == LoaderKind::Mmap {
                assert!(region.transform().is_none());
                assert!(bytes == &file[..], "mmap maps the file itself");
                assert!(transform.seen.lock().unwrap().is_empty());
            } else {
                assert!(region.transform().is_some(), "{loader}");
                assert!(
                    bytes == &want[..],
                    "{loader}, context {context}: every byte transformed once, from the file's bytes"
                );
                let mut seen = transform.seen.lock().unwrap().clone();
                seen.sort_unstable();
                let chunks: Vec<u64> = (0..FILE_LEN.div_ceil(chunk_bytes as u64))
                    .map(|c| c * chunk_bytes as u64)
                    .collect();
                assert_eq!(seen, chunks, "{loader}: each chunk once");
            }
        }
    }
}

#[test]
fn a_transform_planned_for_other_chunks_is_refused() {
    let model = standard_model(6);
    let options = LoadOptions {
        chunk_bytes: 256 << 10,
        transform: Some(airs_memory::Transform(std::sync::Arc::new(OffsetXor::new(
            128 << 10,
            0,
        )))),
        ..LoadOptions::with_loader(LoaderKind::Eager)
    };
    let err = ModelRegion::load(&model.path, standard_layout(), &options).unwrap_err();
    assert_eq!(err.kind(), airs_memory::ErrorKind::Config, "{err}");
}
