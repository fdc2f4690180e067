//! [`HugePageBuffer`]: zero-filled anonymous memory mapped the way a weight region maps its
//! bytes — the start aligned to the huge-page size and the range advised for huge pages — for
//! buffers that must be read the way the weights are read (the read-bandwidth probes of `airs
//! bench`), outside the model pool.
//!
//! Why it exists: a heap buffer sits on base pages whenever THP runs in its `madvise` mode (the
//! default of most distributions, and the benchmark host's), while the regions' weights sit on
//! huge pages. On the benchmark host, under one memory link, one thread streamed 19-25 GB/s from
//! base pages and 29-30 GB/s from huge pages (BENCHMARKS.md, "The read probe on huge pages"): the hardware
//! prefetchers stop at every 4 KiB page and the TLB misses there. A probe on base pages
//! understates what the weights can be read at, and with it every "decode ÷ probe" figure and
//! the alone/together ratio that names the threads' placement.
//!
//! Where huge pages are not to be had (THP `never`, a fragmented host, a kernel without THP) the
//! buffer stays on base pages, as a region does; [`HugePageBuffer::huge_bytes`] says which.
//! Cost: `len` rounded up to the huge-page size, plus one guard page each side of address space;
//! pages are populated on first touch (whose thread places them).

use crate::error::{ErrorKind, MemoryError, Result};
use crate::sys::{AnonMapping, huge_page_size, round_up, smaps_totals};

/// Zero-filled read-write memory aligned to the huge-page size and advised for huge pages.
#[derive(Debug)]
pub struct HugePageBuffer {
    mapping: AnonMapping,
    len: usize,
}

impl HugePageBuffer {
    /// Maps `len` bytes (rounded up to whole huge pages; zero still maps one).
    pub fn new(len: usize) -> Result<Self> {
        let huge = huge_page_size();
        let mapping = AnonMapping::new(round_up(len.max(1), huge), huge).map_err(|errno| {
            MemoryError::with_errno(
                ErrorKind::Map,
                format!("mapping a {len}-byte buffer"),
                errno,
            )
        })?;
        // Without THP the buffer stays on base pages, like a region there.
        let _ = mapping.advise_huge_pages();
        Ok(Self { mapping, len })
    }

    /// Bytes asked for (the mapping may be longer).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether zero bytes were asked for.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: a private anonymous read-write mapping that is never registered with a
        // userfaultfd: every page reads (as zeros until written) without blocking; `&self` rules
        // out a live `&mut` from `as_mut_slice`. `len` is within the mapping.
        unsafe { &self.mapping.as_slice()[..self.len] }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the mapping is writable; `&mut self` makes this the only
        // reference to its bytes.
        unsafe { &mut self.mapping.as_mut_slice()[..self.len] }
    }

    /// Bytes of the mapping on huge pages now (`/proc/self/smaps`), if it can be read.
    pub fn huge_bytes(&self) -> Option<u64> {
        let start = self.mapping.addr();
        smaps_totals(start, start + self.mapping.len())
            .ok()
            .map(|t| t.huge)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_buffer_is_zeroed_aligned_to_a_huge_page_and_keeps_what_is_written() {
        let len = (3 << 20) + 123;
        let mut buffer = HugePageBuffer::new(len).unwrap();
        assert_eq!(buffer.len(), len);
        assert!(!buffer.is_empty());
        assert_eq!(buffer.as_slice().as_ptr() as usize % huge_page_size(), 0);
        assert!(buffer.as_slice().iter().all(|&b| b == 0));
        for (i, b) in buffer.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert!(
            buffer
                .as_slice()
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 251) as u8)
        );
        let huge = buffer.huge_bytes().expect("smaps readable");
        assert!(huge <= round_up(len, huge_page_size()) as u64);
    }

    #[test]
    fn an_empty_request_still_maps_a_byte() {
        let buffer = HugePageBuffer::new(0).unwrap();
        assert_eq!(buffer.len(), 0);
        assert!(buffer.is_empty());
        assert!(buffer.as_slice().is_empty());
    }
}
