//! Operating-system facts and the few memory syscalls the region needs: page sizes, the THP mode,
//! an aligned anonymous mapping, a read-only file mapping, `/proc/self/smaps` accounting.
//!
//! Design: §6.2 (pinned, huge-page backed, read-only model memory) mapped onto Linux user space as
//! the design README reads it: sizes are read at run time (4 KB or 16 KB base pages; 2 MB or
//! 32 MB PMD huge pages), huge pages come from `MADV_COLLAPSE` after the range is populated,
//! pinning is `mlock` after filling. Wrappers use rustix, and libc for `MADV_COLLAPSE`.
//! Cost: each call is one syscall, except [`smaps_totals`], which reads and parses the whole of
//! `/proc/self/smaps` (the kernel walks the page tables of every mapping: milliseconds) — it is
//! for statistics, not hot paths.

use std::ffi::c_void;
use std::fs::File;
use std::ptr::NonNull;

use rustix::io::Errno;
use rustix::mm::{Advice, MapFlags, MlockFlags, MprotectFlags, ProtFlags};

/// PMD huge-page size assumed when sysfs does not say (x86-64 and 4 KB-page arm64).
pub const FALLBACK_HUGE_PAGE_BYTES: usize = 2 << 20;

/// The base page size (sysconf/auxv): 4 KiB on x86-64 and Pi 4, 16 KiB on a Pi 5 kernel.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// The PMD huge-page size from `/sys/kernel/mm/transparent_hugepage/hpage_pmd_size`, or 2 MiB if
/// unreadable or implausible.
pub fn huge_page_size() -> usize {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n.is_power_of_two() && n > page_size())
        .unwrap_or(FALLBACK_HUGE_PAGE_BYTES)
}

/// The transparent-huge-page policy (`/sys/kernel/mm/transparent_hugepage/enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThpMode {
    Always,
    Madvise,
    Never,
    /// The file is missing (kernel without THP).
    Unavailable,
}

/// Reads the THP mode: the bracketed word of the `enabled` file.
pub fn thp_mode() -> ThpMode {
    match std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") {
        Ok(s) => parse_thp_mode(&s),
        Err(_) => ThpMode::Unavailable,
    }
}

/// Whether a `MADV_HUGEPAGE` range may get huge pages: THP `always` or `madvise`.
pub(crate) fn thp_usable() -> bool {
    matches!(thp_mode(), ThpMode::Always | ThpMode::Madvise)
}

fn parse_thp_mode(s: &str) -> ThpMode {
    let selected = s
        .split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']'));
    match selected {
        Some("always") => ThpMode::Always,
        Some("madvise") => ThpMode::Madvise,
        Some("never") => ThpMode::Never,
        _ => ThpMode::Unavailable,
    }
}

/// Rounds `n` up to a multiple of the power of two `align`.
/// Sets the calling thread's nice value to `nice` (negative: more CPU share and earlier wake-ups
/// than the compute threads). Needs CAP_SYS_NICE (or RLIMIT_NICE) for negative values; returns
/// whether it was applied. Advisory: a refused request changes nothing.
pub(crate) fn set_this_thread_nice(nice: i32) -> bool {
    let tid = rustix::thread::gettid();
    rustix::process::setpriority_process(Some(tid), nice).is_ok()
}

pub fn round_up(n: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two());
    (n + align - 1) & !(align - 1)
}

/// A private anonymous read-write mapping of `len` bytes (a page multiple) whose start is aligned
/// to `align`, with at least one inaccessible guard page on each side so that the kernel never
/// merges it with a neighbouring mapping (which would blur its `/proc/self/smaps` accounting).
#[derive(Debug)]
pub struct AnonMapping {
    reservation: NonNull<c_void>,
    reservation_len: usize,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it hands out no references by itself,
// and the unsafe accessors put the aliasing obligations on their callers.
unsafe impl Send for AnonMapping {}
// SAFETY: as for Send; every `&self` method is a syscall on the range, which the kernel serialises.
unsafe impl Sync for AnonMapping {}

impl AnonMapping {
    /// Maps `len` bytes (rounded up to the page size) aligned to `align` (a power of two,
    /// at least the page size).
    pub fn new(len: usize, align: usize) -> Result<Self, Errno> {
        let page = page_size();
        let align = align.max(page);
        let len = round_up(len.max(1), page);
        let reservation_len = len.checked_add(align + page).ok_or(Errno::NOMEM)?;
        // SAFETY: a fresh PROT_NONE reservation at an address of the kernel's choosing touches no
        // existing memory.
        let raw = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                reservation_len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?;
        let reservation = NonNull::new(raw).ok_or(Errno::NOMEM)?;
        let base_addr = round_up(raw as usize + page, align);
        let base = raw.cast::<u8>().wrapping_add(base_addr - raw as usize);
        // SAFETY: [base, base + len) lies inside the reservation we just made (base_addr - raw
        // <= page + align - page, plus len, fits in reservation_len) and nothing references it.
        let r = unsafe {
            rustix::mm::mprotect(base.cast(), len, MprotectFlags::READ | MprotectFlags::WRITE)
        };
        let mapping = Self {
            reservation,
            reservation_len,
            base: NonNull::new(base).ok_or(Errno::NOMEM)?,
            len,
        };
        r.map(|()| mapping)
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Length in bytes (a page multiple).
    pub fn len(&self) -> usize {
        self.len
    }

    fn sub(&self, offset: usize, len: usize) -> Result<*mut c_void, Errno> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Errno::INVAL);
        }
        Ok(self.base.as_ptr().wrapping_add(offset).cast())
    }

    /// `madvise(MADV_HUGEPAGE)` on the whole mapping: faults (and khugepaged) may use huge pages.
    pub fn advise_huge_pages(&self) -> Result<(), Errno> {
        // SAFETY: the range is our mapping; MADV_HUGEPAGE only changes the THP policy.
        unsafe { rustix::mm::madvise(self.base.as_ptr().cast(), self.len, Advice::LinuxHugepage) }
    }

    /// `madvise(MADV_COLLAPSE)` on `[offset, offset + len)`: populated base pages become huge
    /// pages (a copy). Ranges already on huge pages are skipped cheaply.
    pub fn collapse(&self, offset: usize, len: usize) -> Result<(), Errno> {
        let p = self.sub(offset, len)?;
        // SAFETY: MADV_COLLAPSE replaces populated base pages by huge pages with the same contents;
        // the range is inside our mapping.
        let r = unsafe { libc::madvise(p, len, libc::MADV_COLLAPSE) };
        if r == 0 {
            Ok(())
        } else {
            Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::INVAL))
        }
    }

    /// `madvise(MADV_NOHUGEPAGE)` on the whole mapping: keep it on base pages.
    pub fn no_huge_pages(&self) -> Result<(), Errno> {
        // SAFETY: the range is our mapping; MADV_NOHUGEPAGE only changes the THP policy.
        unsafe { rustix::mm::madvise(self.base.as_ptr().cast(), self.len, Advice::LinuxNoHugepage) }
    }

    /// `mprotect(PROT_READ)` on the whole mapping: later writes fault with SIGSEGV.
    pub fn make_read_only(&self) -> Result<(), Errno> {
        // SAFETY: the range is our mapping. Removing write permission cannot create dangling or
        // aliased references; a stray write becomes a SIGSEGV, not a silent change.
        unsafe { rustix::mm::mprotect(self.base.as_ptr().cast(), self.len, MprotectFlags::READ) }
    }

    /// `mlock` on the whole mapping (populates and pins it).
    pub fn lock(&self) -> Result<(), Errno> {
        // SAFETY: the range is our mapping; mlock only populates and pins pages.
        unsafe { rustix::mm::mlock(self.base.as_ptr().cast(), self.len) }
    }

    /// `mlock2(MLOCK_ONFAULT)` on the whole mapping (pins pages present now or faulted later).
    pub fn lock_on_fault(&self) -> Result<(), Errno> {
        // SAFETY: the range is our mapping; mlock2 only pins pages.
        unsafe { rustix::mm::mlock_with(self.base.as_ptr().cast(), self.len, MlockFlags::ONFAULT) }
    }

    /// The mapping as bytes.
    ///
    /// # Safety
    /// Every page of the mapping must be readable without blocking forever (populated, or resolved
    /// by a live userfaultfd handler), and nobody may write it while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the pointer/length describe our live mapping; the rest is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// The mapping as mutable bytes.
    ///
    /// # Safety
    /// The mapping must be writable, not registered with a userfaultfd, and no other reference to
    /// its bytes may exist while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: pointer/length describe our live mapping; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: we own the whole reservation and no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.reservation.as_ptr(), self.reservation_len) };
    }
}

/// A private read-only mapping of a whole file (`MAP_PRIVATE`, no `MAP_POPULATE`): the kernel
/// pages it in from the page cache on demand.
#[derive(Debug)]
pub struct FileMapping {
    base: NonNull<u8>,
    len: usize,
    file_len: usize,
}

// SAFETY: a read-only mapping owned by this value; see AnonMapping.
unsafe impl Send for FileMapping {}
// SAFETY: a read-only mapping; `&self` methods are syscalls or reads.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps `file` (of `file_len` > 0 bytes) read-only.
    pub fn new(file: &File, file_len: usize) -> Result<Self, Errno> {
        let len = round_up(file_len.max(1), page_size());
        // SAFETY: a new mapping at an address of the kernel's choosing touches no existing memory.
        let raw = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::PRIVATE,
                file,
                0,
            )
        }?;
        Ok(Self {
            base: NonNull::new(raw.cast()).ok_or(Errno::NOMEM)?,
            len,
            file_len,
        })
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Mapped length (page multiple).
    pub fn len(&self) -> usize {
        self.len
    }

    /// `madvise(MADV_WILLNEED)` on the page-aligned hull of `[offset, offset + len)`: starts
    /// asynchronous readahead.
    pub fn will_need(&self, offset: usize, len: usize) -> Result<(), Errno> {
        let page = page_size();
        let start = offset / page * page;
        let end = round_up(offset.saturating_add(len), page).min(self.len);
        if start >= end {
            return Ok(());
        }
        // SAFETY: the range is inside our mapping; WILLNEED only schedules readahead.
        unsafe {
            rustix::mm::madvise(
                self.base.as_ptr().add(start).cast(),
                end - start,
                Advice::WillNeed,
            )
        }
    }

    /// The file image.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live and read-only for as long as `self`; the file is treated as
        // immutable while mapped (as with memmap2::Mmap — modifying or truncating it from outside
        // is outside the contract and shows as changed bytes or SIGBUS, never as a dangling read).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.file_len) }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Memory accounting of the mappings overlapping an address range, from `/proc/self/smaps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmapsTotals {
    /// `Rss` summed, bytes.
    pub rss: u64,
    /// `Locked` summed, bytes.
    pub locked: u64,
    /// `AnonHugePages` + `FilePmdMapped` summed, bytes.
    pub huge: u64,
    /// How many mappings overlapped the range.
    pub mappings: usize,
}

/// Sums the smaps entries of every mapping overlapping `[start, end)`.
pub fn smaps_totals(start: usize, end: usize) -> std::io::Result<SmapsTotals> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    Ok(parse_smaps(&text, start as u64, end as u64))
}

fn parse_smaps(text: &str, start: u64, end: u64) -> SmapsTotals {
    let mut totals = SmapsTotals::default();
    let mut inside = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some(name) = first.strip_suffix(':') {
            if !inside {
                continue;
            }
            let kb: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            match name {
                "Rss" => totals.rss += kb * 1024,
                "Locked" => totals.locked += kb * 1024,
                "AnonHugePages" | "FilePmdMapped" => totals.huge += kb * 1024,
                _ => {}
            }
        } else if let Some((a, b)) = first.split_once('-') {
            let (Ok(vs), Ok(ve)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
                inside = false;
                continue;
            };
            inside = vs < end && ve > start;
            totals.mappings += usize::from(inside);
        }
    }
    totals
}

#[cfg(test)]
mod tests {

    #[test]
    fn thread_nice_applies_to_the_calling_thread_only_where_permitted() {
        let main_nice = rustix::process::getpriority_process(None).unwrap();
        std::thread::spawn(move || {
            let tid = rustix::thread::gettid();
            let before = rustix::process::getpriority_process(Some(tid)).unwrap();
            let applied = set_this_thread_nice(before - 1);
            let after = rustix::process::getpriority_process(Some(tid)).unwrap();
            // Raising priority needs CAP_SYS_NICE: applied exactly when permitted.
            assert_eq!(after, if applied { before - 1 } else { before });
            // Lowering it is always permitted.
            assert!(set_this_thread_nice(after + 2));
            assert_eq!(
                rustix::process::getpriority_process(Some(tid)).unwrap(),
                after + 2
            );
        })
        .join()
        .unwrap();
        assert_eq!(
            rustix::process::getpriority_process(None).unwrap(),
            main_nice
        );
    }
    use super::*;

    #[test]
    fn thp_mode_parses_bracketed_word() {
        assert_eq!(parse_thp_mode("always [madvise] never\n"), ThpMode::Madvise);
        assert_eq!(parse_thp_mode("always madvise [never]"), ThpMode::Never);
        assert_eq!(parse_thp_mode("[always] madvise never"), ThpMode::Always);
        assert_eq!(parse_thp_mode(""), ThpMode::Unavailable);
    }

    #[test]
    fn sizes_are_sane() {
        assert!(page_size().is_power_of_two());
        assert!(huge_page_size() > page_size());
    }

    #[test]
    fn smaps_parsing_sums_overlapping_mappings() {
        let text = "\
1000-3000 rw-p 00000000 00:00 0
Rss:                   8 kB
Locked:                4 kB
AnonHugePages:         0 kB
VmFlags: rd wr
3000-5000 r--p 00000000 00:00 0 /x
Rss:                   2 kB
Locked:                2 kB
AnonHugePages:      2048 kB
5000-6000 r--p 00000000 00:00 0
Rss:                 100 kB
";
        let t = parse_smaps(text, 0x2000, 0x5000);
        assert_eq!(
            t,
            SmapsTotals {
                rss: 10 * 1024,
                locked: 6 * 1024,
                huge: 2048 * 1024,
                mappings: 2
            }
        );
    }

    #[test]
    fn anon_mapping_is_aligned_guarded_and_accounted() {
        let huge = huge_page_size();
        let m = AnonMapping::new(3 * page_size() + 1, huge).unwrap();
        assert_eq!(m.addr() % huge, 0);
        assert_eq!(m.len(), 4 * page_size());
        // SAFETY: fresh writable mapping, no other reference.
        unsafe { m.as_mut_slice() }.fill(7);
        let t = smaps_totals(m.addr(), m.addr() + m.len()).unwrap();
        assert_eq!(t.mappings, 1, "guard pages keep the mapping separate");
        assert_eq!(t.rss, m.len() as u64);
        m.make_read_only().unwrap();
        m.lock().unwrap();
        let t = smaps_totals(m.addr(), m.addr() + m.len()).unwrap();
        assert_eq!(t.locked, m.len() as u64);
    }
}
