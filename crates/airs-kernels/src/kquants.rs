//! k-quant kernels: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the Q8_K activation type.
use crate::{GgmlType, TypeKernels};

pub(crate) fn kernels(_ty: GgmlType) -> Option<&'static TypeKernels> {
    None
}
