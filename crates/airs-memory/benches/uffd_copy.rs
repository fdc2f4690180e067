//! UFFDIO_COPY throughput by chunk size (64 KiB vs 2 MiB), two ways:
//! - `copy`: the loader copies chunk after chunk into a registered region (prefetch/filler path);
//! - `fault`: a reader touches every page in order and each fault is resolved by copying the
//!   aligned chunk around it (fault-around path: one fault per chunk).
//!
//! `cargo bench -p airs-memory --bench uffd_copy` (plain `main`, no harness).

use std::time::Instant;

use airs_memory::uffd::{Event, Userfaultfd};

const REGION: usize = 512 << 20;

struct Region {
    ptr: *mut libc::c_void,
}

impl Region {
    fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Self { ptr }
    }
    fn addr(&self) -> usize {
        self.ptr as usize
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; no reference into it survives (reader threads are joined).
        unsafe { libc::munmap(self.ptr, REGION) };
    }
}

fn copy_throughput(chunk: usize, src: &[u8]) -> f64 {
    let region = Region::new();
    let uffd = Userfaultfd::open().expect("userfaultfd");
    // SAFETY: our fresh private mapping; nothing reads it.
    unsafe { uffd.register_missing(region.addr(), REGION) }.unwrap();
    let t0 = Instant::now();
    for off in (0..REGION).step_by(chunk) {
        uffd.copy(region.addr() + off, &src[off..off + chunk], true)
            .unwrap();
    }
    REGION as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn fault_throughput(chunk: usize, src: &[u8]) -> (f64, usize) {
    let region = Region::new();
    let uffd = Userfaultfd::open().expect("userfaultfd");
    // SAFETY: our fresh private mapping; the reader blocks until we fill each page.
    unsafe { uffd.register_missing(region.addr(), REGION) }.unwrap();
    let base = region.addr();
    let page = rustix::param::page_size();
    let t0 = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut sum = 0u64;
        for off in (0..REGION).step_by(page) {
            // SAFETY: the region outlives the join below; each page is filled by the handler.
            sum += u64::from(unsafe { std::ptr::read_volatile((base + off) as *const u8) });
        }
        sum
    });
    let mut filled = 0;
    let mut faults = 0;
    while filled < REGION {
        let mut fds = [rustix::event::PollFd::new(
            &uffd,
            rustix::event::PollFlags::IN,
        )];
        rustix::event::poll(&mut fds, None).unwrap();
        while let Some(Event::PageFault { address, .. }) = uffd.read_event().unwrap() {
            faults += 1;
            let start = (address as usize - base) / chunk * chunk;
            let (Ok(n) | Err((_, n))) = uffd.copy(base + start, &src[start..start + chunk], true);
            filled += n;
        }
    }
    reader.join().unwrap();
    (REGION as f64 / t0.elapsed().as_secs_f64() / 1e9, faults)
}

fn main() {
    // The source is as large as the region (like page-cache data, not hot in the CPU caches).
    let src: Vec<u8> = (0..REGION).map(|i| (i >> 12) as u8).collect();
    println!("UFFDIO_COPY into a {} MiB region", REGION >> 20);
    for chunk in [64 << 10, 2 << 20] {
        let copy = (0..3)
            .map(|_| copy_throughput(chunk, &src))
            .fold(0.0, f64::max);
        let (fault, n) = (0..3)
            .map(|_| fault_throughput(chunk, &src))
            .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
        println!(
            "chunk {:>5} KiB: copy loop {copy:5.2} GB/s   fault-around {fault:5.2} GB/s ({n} faults)",
            chunk >> 10
        );
    }
}
