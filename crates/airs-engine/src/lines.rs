//! A buffer of `f32` that starts on a 64-byte cache line: the activation buffers the matrix
//! products write, so that several tokens' outputs can leave with streaming stores, which need
//! whole aligned lines (`airs_kernels::rows16`; on Intel's cores they took a 4-token Q4_K
//! product from DRAM from 273-300 to 238-258 µs). It costs at most 15 floats of padding.

use std::ops::{Deref, DerefMut};

/// One cache line of floats.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

const _: () = assert!(std::mem::size_of::<Line>() == 64 && std::mem::align_of::<Line>() == 64);

/// `len` floats, zeroed, starting on a cache line; read and written as a `[f32]`.
pub(crate) struct LineBuf {
    lines: Vec<Line>,
    len: usize,
}

impl LineBuf {
    pub(crate) fn zeroed(len: usize) -> LineBuf {
        LineBuf {
            lines: vec![Line([0.0; 16]); len.div_ceil(16)],
            len,
        }
    }
}

impl Deref for LineBuf {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is 16 `f32` without padding (`repr(C)`, size asserted), so `lines` is
        // `16 · lines.len() ≥ len` initialized floats, borrowed for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for LineBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, borrowed mutably for as long as `self` is.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_holds_exactly_its_floats() {
        for len in [0, 1, 15, 16, 17, 5632 * 4] {
            let mut buf = LineBuf::zeroed(len);
            assert!(buf.as_ptr().addr().is_multiple_of(64));
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&x| x == 0.0));
            for (i, x) in buf.iter_mut().enumerate() {
                *x = i as f32;
            }
            assert!(buf.iter().enumerate().all(|(i, &x)| x == i as f32));
        }
    }
}
