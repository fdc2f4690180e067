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
//! slices by rows (Phi-3's `attn_qkv` and gate/up `ffn_up`). Every whole group of 16 rows is
//! repacked, also one that straddles a load chunk boundary (at most one per boundary per side:
//! 1-5 % of the bytes at 2 MiB chunks): each of its two chunks asks the loader for the file's
//! bytes of the group beyond its edge ([`ChunkTransform::context`]), repacks the whole group and
//! keeps its own part. That costs each chunk at most two groups of extra reading, so a
//! straddling group is repacked only when it is at most an eighth of a chunk (always at the
//! default 2 MiB; at the smallest 64 KiB chunks, groups under 8 KiB). A group that is not, and a
//! final group of fewer than 16 rows, keep the GGUF layout, and [`RepackPlan::packed_groups`]
//! tells the model which is which by the same rule. Which rows keep the file's layout is
//! fixed by the plan, so a row's results never depend on batching; where the instruction set's
//! GGUF-layout kernels are bit-identical to the scalar reference (AVX-512 VNNI, NEON with
//! `sdot`) they do not depend on the layout either (AVX2's GGUF-layout dots sum in ggml's
//! order, the rows16 ones in the reference's).
//!
//! Where the design comes from: ik_llama.cpp's run-time repacking (`-rtr`), which converts
//! tensors to `_R4`/`_R8` types after loading (an extra pass, and the file's type is gone);
//! here the layout is a view of the same type, made in the loader's copy. Cost: one read and
//! one write of each repacked chunk while it is in cache, on the loading thread, plus the
//! straddling groups' context reads (not measured apart: the loader benchmarks time whole
//! loads).

use std::any::Any;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use airs_gguf::{GgmlType, Gguf, ModelConfig};
use airs_kernels::Isa;
use airs_kernels::rows16::{self, GROUP_ROWS};
use airs_memory::{ChunkTransform, Context};

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

    /// The file range of group `g` (a final partial group is shorter).
    fn group_range(&self, g: usize) -> Range<u64> {
        let start = self.offset + g as u64 * self.group_bytes();
        start..(start + self.group_bytes()).min(self.end())
    }

    fn end(&self) -> u64 {
        self.offset + (self.rows * self.row_bytes) as u64
    }

    /// Whether group `g` is repacked: a whole group, inside one chunk or at most an eighth of
    /// one (see the module documentation).
    fn packed(&self, g: usize, chunk_bytes: u64) -> bool {
        let Range { start, end } = self.group_range(g);
        (g + 1) * GROUP_ROWS <= self.rows
            && (start / chunk_bytes == (end - 1) / chunk_bytes
                || self.group_bytes() <= airs_memory::max_context_bytes(chunk_bytes))
    }

    /// The groups that overlap the file range `range`.
    fn groups_overlapping(&self, range: &Range<u64>) -> Range<usize> {
        let group_bytes = self.group_bytes();
        let first = range.start.saturating_sub(self.offset) / group_bytes;
        let last = (range.end.min(self.end()).saturating_sub(self.offset)).div_ceil(group_bytes);
        first as usize..last as usize
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
    /// One group's GGUF bytes while it is rewritten, and a straddling group's repacked bytes.
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
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

    /// The planned matrix that holds the file byte at `at`.
    fn tensor_at(&self, at: u64) -> Option<&Planned> {
        let i = self.tensors.partition_point(|t| t.end() <= at);
        self.tensors.get(i).filter(|t| t.offset <= at)
    }
}

impl ChunkTransform for RepackPlan {
    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn context(&self, chunk: Range<u64>) -> (u64, u64) {
        // The straddling groups at the two edges, if they are repacked.
        let straddler = |at: u64| {
            let t = self.tensor_at(at)?;
            let g = t.groups_overlapping(&(at..at + 1)).start;
            let range = t.group_range(g);
            (range.start < at && t.packed(g, self.chunk_bytes)).then_some(range)
        };
        let before = straddler(chunk.start).map_or(0, |g| chunk.start - g.start);
        let after = straddler(chunk.end).map_or(0, |g| g.end - chunk.end);
        (before, after)
    }

    fn apply(&self, offset: u64, bytes: &mut [u8], context: Context<'_>) {
        let chunk = offset..offset + bytes.len() as u64;
        let first = self.tensors.partition_point(|t| t.end() <= offset);
        SCRATCH.with(|scratch| {
            let (natural, packed) = &mut *scratch.borrow_mut();
            for t in self.tensors[first..]
                .iter()
                .take_while(|t| t.offset < chunk.end)
            {
                for g in t.groups_overlapping(&chunk) {
                    if !t.packed(g, self.chunk_bytes) {
                        continue;
                    }
                    let group = t.group_range(g);
                    let inside = group.start.max(chunk.start)..group.end.min(chunk.end);
                    let here = (inside.start - offset) as usize..(inside.end - offset) as usize;
                    if inside == group {
                        natural.clear();
                        natural.extend_from_slice(&bytes[here.clone()]);
                        rows16::repack_group(t.ty, t.cols, natural, &mut bytes[here])
                            .expect("planned geometry is whole groups of a rows16 type");
                        continue;
                    }
                    // Straddling: the whole group from the context and the chunk, repacked,
                    // and this chunk's part of it kept.
                    let before = (chunk.start - group.start.min(chunk.start)) as usize;
                    let after = (group.end.max(chunk.end) - chunk.end) as usize;
                    natural.clear();
                    natural.extend_from_slice(&context.before[context.before.len() - before..]);
                    natural.extend_from_slice(&bytes[here.clone()]);
                    natural.extend_from_slice(&context.after[..after]);
                    packed.resize(natural.len(), 0);
                    rows16::repack_group(t.ty, t.cols, natural, packed)
                        .expect("planned geometry is whole groups of a rows16 type");
                    let part =
                        (inside.start - group.start) as usize..(inside.end - group.start) as usize;
                    bytes[here].copy_from_slice(&packed[part]);
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
    fn whole_groups_are_packed_and_straddling_ones_only_when_small_against_the_chunk() {
        // Groups of 16 rows are 544 bytes: [100, 644), [644, 1188), then 8 rows.
        let t = planned(100, 40);
        assert!(t.packed(0, 4096) && t.packed(1, 4096));
        assert!(
            !t.packed(2, 4096),
            "a partial group stays in the file's layout"
        );
        assert!(
            t.packed(0, 1024) && !t.packed(1, 1024),
            "group 1 straddles byte 1024 and is more than an eighth of a chunk"
        );
        assert!(
            t.packed(1, 4352) && !t.packed(2, 4352),
            "at an eighth of a chunk, a straddling group is packed too"
        );
    }

    /// Applies `plan` chunk by chunk to a copy of `file`, each chunk with the context it asks
    /// for read from `file`, as a loader does.
    fn load(plan: &RepackPlan, file: &[u8]) -> Vec<u8> {
        let chunk_bytes = plan.chunk_bytes as usize;
        let mut region = file.to_vec();
        for (c, chunk) in region.chunks_mut(chunk_bytes).enumerate() {
            let start = c * chunk_bytes;
            let end = start + chunk.len();
            let (before, after) = plan.context(start as u64..end as u64);
            let context = Context {
                before: &file[start - before as usize..start],
                after: &file[end..end + after as usize],
            };
            plan.apply(start as u64, chunk, context);
        }
        region
    }

    #[test]
    fn applying_the_plan_chunk_by_chunk_repacks_exactly_the_planned_groups() {
        let file: Vec<u8> = (0..16384u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for chunk_bytes in [1024u64, 4352, 8192] {
            let plan = RepackPlan {
                chunk_bytes,
                tensors: vec![planned(100, 40), planned(1460, 64), planned(5000, 200)],
            };
            let region = load(&plan, &file);
            let mut straddling_packed = 0;
            for t in &plan.tensors {
                let bits = plan.packed_groups(t.offset).expect("planned");
                for g in 0..t.rows.div_ceil(GROUP_ROWS) {
                    let range = t.group_range(g);
                    let (start, end) = (range.start as usize, range.end as usize);
                    let packed = bits[g / 64] >> (g % 64) & 1 == 1;
                    assert_eq!(packed, t.packed(g, chunk_bytes));
                    if packed {
                        let mut natural = vec![0u8; end - start];
                        rows16::unpack_group(t.ty, t.cols, &region[start..end], &mut natural)
                            .unwrap();
                        assert_eq!(natural, file[start..end], "group {g} at {start}");
                        assert_ne!(region[start..end], file[start..end]);
                        if start as u64 / chunk_bytes != (end as u64 - 1) / chunk_bytes {
                            straddling_packed += 1;
                        }
                    } else {
                        assert_eq!(region[start..end], file[start..end], "group {g} untouched");
                    }
                }
            }
            assert_eq!(
                straddling_packed > 0,
                chunk_bytes >= 4352,
                "chunks of {chunk_bytes}: {straddling_packed} straddling groups packed"
            );
            // Bytes outside the matrices are never touched.
            assert_eq!(region[..100], file[..100]);
            assert_eq!(region[11800..], file[11800..]);
            assert_eq!(plan.packed_groups(101), None);
        }
    }
}
