//! Float and legacy block-quant kernels: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
use crate::{GgmlType, TypeKernels};

pub(crate) fn kernels(_ty: GgmlType) -> Option<&'static TypeKernels> {
    None
}
