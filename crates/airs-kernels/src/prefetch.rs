//! Bringing bytes toward a core before it reads them: a software prefetch of every cache line
//! of a range into the core's L2 (`prefetcht1` on x86-64, `prfm pldl2keep` on aarch64).
//!
//! What for: a thread that waits at the end of one matrix product (for the other threads, or
//! for the caller's norms and activation quantization before the next) has nothing to compute
//! but knows what it will read first in the next product, and memory that would otherwise sit
//! idle can bring it in meanwhile (the engine's pool, `airs_engine::pool`). Where this comes
//! from: the kernels' own prefetches ahead of their loads (`rows16`), applied across the gap
//! between two jobs rather than within one.
//!
//! Cost: one instruction per 64-byte line, which retires when a fill buffer takes it; a thread
//! that issues many in a row stalls until lines arrive, at about one core's share of the read
//! bandwidth. Never faults, whatever the address: a prefetch of memory that is not mapped, or
//! no longer is, does nothing.

/// Bytes of a cache line on the targets served (x86-64; the Pi's Cortex-A72/A76).
pub const LINE_BYTES: usize = 64;

/// Prefetch every cache line of `bytes` bytes from `start` into this core's L2.
///
/// Safe for any address: a prefetch reads nothing the program can observe and never faults.
#[inline]
pub fn to_l2(start: *const u8, bytes: usize) {
    for line in 0..bytes.div_ceil(LINE_BYTES) {
        let at = start.wrapping_add(line * LINE_BYTES);
        line_to_l2(at);
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn line_to_l2(at: *const u8) {
    // SAFETY: `prefetcht1` is a hint that never faults, whatever the address (`wrapping_add`
    // keeps the arithmetic defined); it writes no register and no flags and touches no stack.
    unsafe {
        std::arch::asm!(
            "prefetcht1 [{}]",
            in(reg) at,
            options(nostack, preserves_flags, readonly)
        )
    };
}

#[cfg(target_arch = "aarch64")]
#[inline]
fn line_to_l2(at: *const u8) {
    // SAFETY: `prfm` is a hint that never faults, whatever the address (`wrapping_add` keeps
    // the arithmetic defined); it writes no register and no flags and touches no stack.
    unsafe {
        std::arch::asm!(
            "prfm pldl2keep, [{}]",
            in(reg) at,
            options(nostack, preserves_flags, readonly)
        )
    };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline]
fn line_to_l2(_at: *const u8) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_any_address_neither_faults_nor_changes_memory() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let before = bytes.clone();
        to_l2(bytes.as_ptr(), bytes.len());
        // Past the end, unmapped, and the null page: hints, never faults.
        to_l2(bytes.as_ptr().wrapping_add(1 << 40), 4096);
        to_l2(std::ptr::null(), 4096);
        to_l2(usize::MAX as *const u8, 256);
        assert_eq!(bytes, before);
    }
}
