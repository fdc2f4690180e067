//! On-disk layouts of ggml's legacy quant blocks (ggml-common.h), viewed in place.
//!
//! Every struct is `#[repr(C)]` with only byte-array fields, so it has alignment 1, no padding,
//! and every bit pattern is valid: a weight row's bytes can be reinterpreted as a slice of
//! blocks without copying. Multi-byte fields are little-endian, as ggml writes them.

/// Elements in one legacy quant block (QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32).
pub(crate) const BLOCK_LEN: usize = 32;

/// `block_q4_0`: scale `d` (f16); 32 4-bit values, element `j < 16` in the low nibble of
/// `qs[j]` and element `j + 16` in its high nibble; value = (nibble − 8) · d.
#[repr(C)]
pub(crate) struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

/// `block_q4_1`: scale `d` and minimum `m` (f16); nibbles as in Q4_0; value = nibble · d + m.
#[repr(C)]
pub(crate) struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; 16],
}

/// `block_q5_0`: scale `d` (f16); the 5th bit of element `j` is bit `j` of the little-endian
/// u32 `qh`; the low 4 bits are nibbles as in Q4_0; value = (q − 16) · d.
#[repr(C)]
pub(crate) struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `block_q5_1`: scale `d`, minimum `m` (f16); bits as in Q5_0; value = q · d + m.
#[repr(C)]
pub(crate) struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `block_q8_0`: scale `d` (f16); 32 values as i8 (stored here as their u8 bit patterns);
/// value = q · d. Also the activation encoding for every legacy quant.
#[repr(C)]
pub(crate) struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [u8; 32],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18 && align_of::<BlockQ4_0>() == 1);
const _: () = assert!(size_of::<BlockQ4_1>() == 20 && align_of::<BlockQ4_1>() == 1);
const _: () = assert!(size_of::<BlockQ5_0>() == 22 && align_of::<BlockQ5_0>() == 1);
const _: () = assert!(size_of::<BlockQ5_1>() == 24 && align_of::<BlockQ5_1>() == 1);
const _: () = assert!(size_of::<BlockQ8_0>() == 34 && align_of::<BlockQ8_0>() == 1);

/// A block type made only of byte arrays.
///
/// # Safety
/// Implementors must have alignment 1, no padding and no invalid bit patterns, so that any
/// `size_of::<Self>()` bytes are a valid `Self`.
pub(crate) unsafe trait PlainBlock: Sized {}

// SAFETY: each struct is #[repr(C)] of u8 arrays only (align 1, no padding, checked above),
// so every byte pattern is a valid value.
unsafe impl PlainBlock for BlockQ4_0 {}
// SAFETY: as above.
unsafe impl PlainBlock for BlockQ4_1 {}
// SAFETY: as above.
unsafe impl PlainBlock for BlockQ5_0 {}
// SAFETY: as above.
unsafe impl PlainBlock for BlockQ5_1 {}
// SAFETY: as above.
unsafe impl PlainBlock for BlockQ8_0 {}

/// Views the first `count` blocks of `bytes` as `&[B]`, in place.
///
/// Panics if `bytes` is shorter than `count` blocks (callers in lib.rs check exact lengths, so
/// this is a cheap O(1) guard that keeps the SIMD code sound even for crate-internal misuse).
#[inline]
pub(crate) fn blocks<B: PlainBlock>(bytes: &[u8], count: usize) -> &[B] {
    let needed = count
        .checked_mul(size_of::<B>())
        .expect("block count overflows usize");
    assert!(
        bytes.len() >= needed,
        "row of {} bytes is shorter than {count} blocks of {} bytes",
        bytes.len(),
        size_of::<B>()
    );
    // SAFETY: `bytes` holds at least `count * size_of::<B>()` initialized bytes (asserted
    // above); `B: PlainBlock` has alignment 1 and accepts every bit pattern, and the result
    // borrows `bytes`, so the lifetime and aliasing (shared, read-only) are preserved.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), count) }
}

/// Mutable variant of [`blocks`] for the quantizers.
#[inline]
pub(crate) fn blocks_mut<B: PlainBlock>(bytes: &mut [u8], count: usize) -> &mut [B] {
    let needed = count
        .checked_mul(size_of::<B>())
        .expect("block count overflows usize");
    assert!(
        bytes.len() >= needed,
        "row of {} bytes is shorter than {count} blocks of {} bytes",
        bytes.len(),
        size_of::<B>()
    );
    // SAFETY: as in `blocks`; the result holds the unique borrow of `bytes`, and writes of
    // any byte pattern keep both views valid.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), count) }
}
