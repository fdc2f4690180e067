//! The layer map: which tensors belong to transformer block `blk.N`, the byte range each layer
//! occupies in the file, and the tensors outside any layer (embedding, output, norms).
//!
//! Loaders use it to fill and prefetch a model in the order inference touches it. Cost: one
//! pass over the tensor table, O(tensors).

use std::ops::Range;

use crate::reader::Gguf;

/// The tensors and bytes of one `blk.N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerInfo {
    pub index: u32,
    /// Indices into [`Gguf::tensors`], in file order.
    pub tensors: Vec<usize>,
    /// Smallest absolute byte range covering every tensor of the layer.
    pub byte_range: Range<u64>,
    /// Sum of the layer's tensor bytes.
    pub bytes: u64,
}

/// Tensors grouped by layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerMap {
    /// Layers `0..n`, in index order; a layer index absent from the file has no entry, so
    /// `layers[i].index` need not equal `i` in a malformed file.
    pub layers: Vec<LayerInfo>,
    /// Indices of tensors that are not in any `blk.N`.
    pub other: Vec<usize>,
}

impl LayerMap {
    pub fn new(gguf: &Gguf<'_>) -> LayerMap {
        let mut layers: Vec<LayerInfo> = Vec::new();
        let mut other = Vec::new();
        for (i, t) in gguf.tensors().iter().enumerate() {
            let Some(index) = t.layer() else {
                other.push(i);
                continue;
            };
            let range = t.byte_range();
            match layers.binary_search_by_key(&index, |l| l.index) {
                Ok(pos) => {
                    let l = &mut layers[pos];
                    l.tensors.push(i);
                    l.byte_range.start = l.byte_range.start.min(range.start);
                    l.byte_range.end = l.byte_range.end.max(range.end);
                    l.bytes += t.bytes;
                }
                Err(pos) => layers.insert(
                    pos,
                    LayerInfo {
                        index,
                        tensors: vec![i],
                        byte_range: range,
                        bytes: t.bytes,
                    },
                ),
            }
        }
        LayerMap { layers, other }
    }
}
