//! Loads a file with each loader and prints timings, region statistics and notices.
//!
//! `cargo run --release -p airs-memory --example load_report -- FILE [MB_PER_S [LOADER]]`
//! (without FILE, a 256 MiB pseudo-random file is made in the temp directory).

use std::time::Instant;

use airs_memory::{LoadOptions, LoaderKind, ModelRegion, RegionLayout};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut made = None;
    let path = match args.next() {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let p = std::env::temp_dir().join("airs-memory-load-report.bin");
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let bytes: Vec<u8> = (0..256usize << 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            std::fs::write(&p, bytes)?;
            made = Some(p.clone());
            p
        }
    };
    let rate: Option<u64> = args.next().map(|s| s.parse::<u64>()).transpose()?;
    let only: Option<LoaderKind> = args.next().map(|s| s.parse()).transpose()?;
    let len = std::fs::metadata(&path)?.len();
    for loader in [LoaderKind::Eager, LoaderKind::Mmap, LoaderKind::Lazy] {
        if only.is_some_and(|o| o != loader) {
            continue;
        }
        let options = LoadOptions {
            loader,
            storage_bytes_per_s: rate.map(|r| r * 1_000_000),
            ..LoadOptions::default()
        };
        let t0 = Instant::now();
        let region = ModelRegion::load(&path, RegionLayout::whole_file(len), &options)?;
        let first = region.as_bytes()[0];
        let first_byte = t0.elapsed();
        let sum: u64 = region
            .as_bytes()
            .iter()
            .step_by(4096)
            .map(|&b| u64::from(b))
            .sum();
        let all_pages = t0.elapsed();
        region.loader().wait_resident()?;
        let resident = t0.elapsed();
        let s = region.stats();
        println!(
            "{loader:>5}: first byte {first_byte:>10.3?}  every page {all_pages:>10.3?}  \
             resident+finalized {resident:>10.3?}  rss {} MiB  locked {} MiB  huge {} MiB  \
             ro {} pinned {}  (checksum {})",
            s.resident_bytes >> 20,
            s.locked_bytes >> 20,
            s.huge_page_bytes >> 20,
            s.read_only,
            s.pinned,
            sum + u64::from(first)
        );
        for n in region.notices() {
            println!("       note: {n}");
        }
    }
    if let Some(p) = made {
        std::fs::remove_file(p)?;
    }
    Ok(())
}
