//! Weights repacked at load into the kernels' 16-row interleaved layout
//! ([`airs_kernels::rows16`]), as a [`ChunkTransform`] the loader applies to each chunk while
//! it copies the file into the model region — no extra pass over the weights, and the region
//! stays exactly the file's size, byte for byte a permutation of it.
//!
//! What is repacked: the matrices that enter matrix products — `attn_{q,k,v,output}`,
//! `ffn_{gate,up,down}` of every block and the output projection (`token_embd` when tied,
//! whose lookups then decode a row out of its group) — of a type the runtime's
//! instruction set multiplies fast in that layout ([`airs_kernels::rows16::fast`]). Never an
//! untied `token_embd` (only looked up), vectors, or fused matrices that the model
//! slices by rows (Phi-3's `attn_qkv` and gate/up `ffn_up`). A group of 16 rows is repacked
//! when it lies inside one load chunk, because a chunk is all a transform sees; a group that
//! straddles a chunk boundary (at most one per boundary, < 1 % of a matrix) and a final group
//! of fewer than 16 rows keep the GGUF layout, and [`RepackPlan::packed_groups`] tells the
//! model which is which by the same rule. Results do not depend on the layout: both kernels
//! are bit-identical to the scalar reference.
//!
//! Where the design comes from: ik_llama.cpp's run-time repacking (`-rtr`), which converts
//! tensors to `_R4`/`_R8` types after loading (an extra pass, and the file's type is gone);
//! here the layout is a view of the same type, made in the loader's copy. Cost: one read and
//! one write of each repacked chunk while it is in cache, on the loading thread (not
//! measured apart: the loader benchmarks time whole loads).

use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

use airs_gguf::{GgmlType, Gguf, ModelConfig};
use airs_kernels::Isa;
use airs_kernels::rows16::{self, GROUP_ROWS};
use airs_memory::ChunkTransform;

/// One matrix to repack.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Planned {
    offset: u64,
    ty: GgmlType,
    cols: usize,
    rows: usize,
    row_bytes: usize,
}

impl Planned {
    fn group_bytes(&self) -> u64 {
        (GROUP_ROWS * self.row_bytes) as u64
    }

    /// Whether group `g` is repacked: a whole group inside one chunk.
    fn packed(&self, g: usize, chunk_bytes: u64) -> bool {
        let start = self.offset + g as u64 * self.group_bytes();
        let end = start + self.group_bytes();
        (g + 1) * GROUP_ROWS <= self.rows && start / chunk_bytes == (end - 1) / chunk_bytes
    }
}

/// Which matrices of one model file are repacked, for one load chunk size.
#[derive(Debug)]
pub struct RepackPlan {
    chunk_bytes: u64,
    /// Sorted by offset.
    tensors: Vec<Planned>,
}

thread_local! {
    /// One group's GGUF bytes while it is rewritten in place.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl RepackPlan {
    /// The plan for the file `gguf` loaded in `chunk_bytes` chunks and multiplied with `isa`,
    /// or `None` when nothing in it would be repacked.
    pub fn new(gguf: &Gguf<'_>, chunk_bytes: u64, isa: Isa) -> Option<RepackPlan> {
        let config = ModelConfig::from_gguf(gguf).ok()?;
        let mut names: Vec<String> = Vec::new();
        for l in 0..config.layers {
            let mut kinds = vec!["attn_output", "ffn_gate", "ffn_down"];
            if !config.fused_qkv {
                kinds.extend(["attn_q", "attn_k", "attn_v"]);
            }
            if !config.fused_gate_up {
                kinds.push("ffn_up");
            }
            names.extend(kinds.iter().map(|k| format!("blk.{l}.{k}.weight")));
        }
        // A tied output is the embedding matrix: repacked too (its lookups decode one row of
        // a group, ≈ 16 rows' bytes read per token, against the whole matrix per product).
        names.push(
            if config.tied_output {
                "token_embd.weight"
            } else {
                "output.weight"
            }
            .into(),
        );
        let mut tensors: Vec<Planned> = names
            .iter()
            .filter_map(|name| {
                let info = gguf.tensor(name)?;
                let [cols, rows] = info.dims.as_slice().try_into().ok()?;
                let (cols, rows) = (usize::try_from(cols).ok()?, usize::try_from(rows).ok()?);
                let row_bytes = airs_kernels::row_bytes(info.ty, cols).ok()?;
                let bytes = rows.checked_mul(row_bytes)? as u64;
                (rows16::fast(isa, info.ty) && info.bytes == bytes).then_some(Planned {
                    offset: info.offset,
                    ty: info.ty,
                    cols,
                    rows,
                    row_bytes,
                })
            })
            .collect();
        tensors.sort_by_key(|t| t.offset);
        (!tensors.is_empty() && chunk_bytes > 0).then_some(RepackPlan {
            chunk_bytes,
            tensors,
        })
    }

    /// For the matrix whose data starts at `offset`: one bit per group of 16 rows, set where
    /// the group is in the rows16 layout; `None` if the matrix is not repacked.
    pub fn packed_groups(&self, offset: u64) -> Option<Arc<[u64]>> {
        let i = self
            .tensors
            .binary_search_by_key(&offset, |t| t.offset)
            .ok()?;
        let t = &self.tensors[i];
        let groups = t.rows.div_ceil(GROUP_ROWS);
        let mut bits = vec![0u64; groups.div_ceil(64)];
        for g in 0..groups {
            if t.packed(g, self.chunk_bytes) {
                bits[g / 64] |= 1 << (g % 64);
            }
        }
        Some(bits.into())
    }

    /// Matrices the plan repacks.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }
}

impl ChunkTransform for RepackPlan {
    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn apply(&self, offset: u64, bytes: &mut [u8]) {
        let end = offset + bytes.len() as u64;
        let first = self
            .tensors
            .partition_point(|t| t.offset + (t.rows * t.row_bytes) as u64 <= offset);
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            for t in self.tensors[first..].iter().take_while(|t| t.offset < end) {
                let group_bytes = t.group_bytes();
                // Only the groups that start inside this chunk.
                let first_group = offset.saturating_sub(t.offset).div_ceil(group_bytes) as usize;
                let last_group = ((end - t.offset).div_ceil(group_bytes) as usize)
                    .min(t.rows.div_ceil(GROUP_ROWS));
                for g in first_group..last_group {
                    let start = t.offset + g as u64 * group_bytes;
                    if start + group_bytes > end || !t.packed(g, self.chunk_bytes) {
                        continue;
                    }
                    let at = (start - offset) as usize;
                    let group = &mut bytes[at..at + group_bytes as usize];
                    scratch.clear();
                    scratch.extend_from_slice(group);
                    rows16::repack_group(t.ty, t.cols, &scratch, group)
                        .expect("planned geometry is whole groups of a rows16 type");
                }
            }
        });
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The plan behind `transform`, if the engine made it.
pub fn plan_of(transform: &dyn ChunkTransform) -> Option<&RepackPlan> {
    transform.as_any().downcast_ref::<RepackPlan>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q8_0 matrix of `rows` rows of 32 values at `offset`.
    fn planned(offset: u64, rows: usize) -> Planned {
        Planned {
            offset,
            ty: GgmlType::Q8_0,
            cols: 32,
            rows,
            row_bytes: 34,
        }
    }

    #[test]
    fn groups_inside_one_chunk_are_packed_and_straddling_or_partial_ones_are_not() {
        // Groups of 16 rows are 544 bytes: [100, 644), [644, 1188), then 8 rows.
        let t = planned(100, 40);
        assert!(t.packed(0, 4096) && t.packed(1, 4096));
        assert!(
            !t.packed(2, 4096),
            "a partial group stays in the file's layout"
        );
        assert!(
            t.packed(0, 1024) && !t.packed(1, 1024),
            "group 1 straddles byte 1024"
        );
    }

    #[test]
    fn applying_the_plan_chunk_by_chunk_repacks_exactly_the_planned_groups() {
        let chunk_bytes = 1024u64;
        let plan = RepackPlan {
            chunk_bytes,
            tensors: vec![planned(100, 40), planned(1460, 64)],
        };
        let file: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let mut region = file.clone();
        for (c, chunk) in region.chunks_mut(chunk_bytes as usize).enumerate() {
            plan.apply(c as u64 * chunk_bytes, chunk);
        }
        for t in &plan.tensors {
            let bits = plan.packed_groups(t.offset).expect("planned");
            let group_bytes = t.group_bytes() as usize;
            for g in 0..t.rows.div_ceil(GROUP_ROWS) {
                let start = t.offset as usize + g * group_bytes;
                let end = (start + group_bytes).min(t.offset as usize + t.rows * t.row_bytes);
                let packed = bits[g / 64] >> (g % 64) & 1 == 1;
                assert_eq!(packed, t.packed(g, chunk_bytes));
                if packed {
                    let mut natural = vec![0u8; group_bytes];
                    rows16::unpack_group(t.ty, t.cols, &region[start..end], &mut natural).unwrap();
                    assert_eq!(natural, file[start..end], "group {g} at {start}");
                    assert_ne!(region[start..end], file[start..end]);
                } else {
                    assert_eq!(region[start..end], file[start..end], "group {g} untouched");
                }
            }
        }
        // Bytes outside the matrices are never touched.
        assert_eq!(region[..100], file[..100]);
        assert_eq!(plan.packed_groups(101), None);
    }
}
