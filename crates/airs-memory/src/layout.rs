//! The model file's layout as the loader sees it: byte spans of the GGUF file tagged as the
//! embedding table, a transformer layer, or something else, and the fill plan derived from it.
//!
//! Design: §6.4 — "the handler knows the GGUF file layout (tensor offsets)" and prefetches "in
//! inference order". airs-memory does not parse GGUF: the engine builds a [`RegionLayout`] from the
//! tensor table (one span per tensor, or per layer) and passes it to the loader. The loader cuts
//! the region into fixed chunks (`chunk_bytes`) and orders them: spans before the first layer
//! (header, metadata), layers 0..N in order, spans after the layers (output norm and head), and the
//! embedding table last — token 1 needs one row of it, which a fault fills chunk by chunk.
//! Cost: planning is O(spans + chunks) time and 4–12 bytes per chunk.

use std::ops::Range;

use crate::error::{ErrorKind, MemoryError, Result};

/// What a span of the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// The token-embedding table: only the rows a prompt uses are needed early.
    Embedding,
    /// Tensors of transformer layer `n` (attention and FFN of block n).
    Layer(u32),
    /// Anything else: GGUF header and metadata, output norm, output head.
    Other,
}

/// A byte range `[start, end)` of the file (= of the region) and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: u64,
    pub end: u64,
    pub kind: SpanKind,
}

impl Span {
    /// The layer this span belongs to, if any.
    pub fn layer(&self) -> Option<u32> {
        match self.kind {
            SpanKind::Layer(n) => Some(n),
            _ => None,
        }
    }
}

/// The file length and its tagged spans. Bytes no span covers are treated as [`SpanKind::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionLayout {
    pub file_len: u64,
    pub spans: Vec<Span>,
}

impl RegionLayout {
    /// A layout with no spans: the loader then fills the file in file order.
    pub fn whole_file(file_len: u64) -> Self {
        Self {
            file_len,
            spans: Vec::new(),
        }
    }

    /// Adds a span (builder style).
    pub fn with_span(mut self, start: u64, end: u64, kind: SpanKind) -> Self {
        self.spans.push(Span { start, end, kind });
        self
    }

    /// Checks every span is non-empty and inside the file.
    pub fn validate(&self) -> Result<()> {
        for s in &self.spans {
            if s.start >= s.end || s.end > self.file_len {
                return Err(MemoryError::new(
                    ErrorKind::Layout,
                    format!(
                        "span {}..{} ({:?}) is empty or outside the {}-byte file",
                        s.start, s.end, s.kind, self.file_len
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Number of layers (highest layer index + 1; 0 without layer spans).
    pub fn layer_count(&self) -> u32 {
        self.spans
            .iter()
            .filter_map(Span::layer)
            .max()
            .map_or(0, |m| m + 1)
    }

    /// The smallest byte range covering every span of `layer`.
    pub fn layer_range(&self, layer: u32) -> Option<Range<u64>> {
        let mut it = self.spans.iter().filter(|s| s.layer() == Some(layer));
        let first = it.next()?;
        Some(it.fold(first.start..first.end, |r, s| {
            r.start.min(s.start)..r.end.max(s.end)
        }))
    }

    /// The span containing byte `offset`, if any.
    pub fn span_at(&self, offset: u64) -> Option<&Span> {
        self.spans
            .iter()
            .find(|s| s.start <= offset && offset < s.end)
    }
}

/// Chunks of the region in the order the loader fills them.
#[derive(Debug, Clone)]
pub(crate) struct ChunkPlan {
    pub chunk_bytes: u64,
    pub chunk_count: usize,
    /// Every chunk index once, in fill order.
    pub fill_order: Vec<u32>,
    /// Chunks overlapping each layer, ascending (index = layer).
    pub layer_chunks: Vec<Vec<u32>>,
    /// Spans sorted by start, for fault → layer lookups.
    sorted_spans: Vec<Span>,
}

impl ChunkPlan {
    pub fn new(layout: &RegionLayout, chunk_bytes: u64) -> Self {
        let chunk_count = layout.file_len.div_ceil(chunk_bytes).max(1) as usize;
        let layers = layout.layer_count();
        let first_layer_start = layout
            .spans
            .iter()
            .filter(|s| s.layer().is_some())
            .map(|s| s.start)
            .min();
        let after_layers = u64::from(layers) + 1;
        let other_rank = |start: u64| match first_layer_start {
            Some(f) if start >= f => after_layers,
            _ => 0,
        };
        let mut rank: Vec<Option<u64>> = vec![None; chunk_count];
        let mut layer_chunks = vec![Vec::new(); layers as usize];
        for s in &layout.spans {
            let r = match s.kind {
                SpanKind::Layer(n) => 1 + u64::from(n),
                SpanKind::Other => other_rank(s.start),
                SpanKind::Embedding => u64::MAX,
            };
            let (first, last) = (s.start / chunk_bytes, (s.end - 1) / chunk_bytes);
            for c in first..=last.min(chunk_count as u64 - 1) {
                let slot = &mut rank[c as usize];
                *slot = Some(slot.map_or(r, |old| old.min(r)));
                if let SpanKind::Layer(n) = s.kind {
                    layer_chunks[n as usize].push(c as u32);
                }
            }
        }
        for v in &mut layer_chunks {
            v.sort_unstable();
            v.dedup();
        }
        let mut fill_order: Vec<u32> = (0..chunk_count as u32).collect();
        fill_order.sort_by_key(|&c| {
            let r = rank[c as usize].unwrap_or_else(|| other_rank(u64::from(c) * chunk_bytes));
            (r, c)
        });
        let mut sorted_spans = layout.spans.clone();
        sorted_spans.sort_by_key(|s| s.start);
        Self {
            chunk_bytes,
            chunk_count,
            fill_order,
            layer_chunks,
            sorted_spans,
        }
    }

    /// The layer whose span contains `offset`, if any.
    pub fn layer_at(&self, offset: u64) -> Option<u32> {
        let i = self.sorted_spans.partition_point(|s| s.start <= offset);
        self.sorted_spans[..i]
            .last()
            .filter(|s| offset < s.end)
            .and_then(Span::layer)
    }

    /// Byte range of chunk `c`, clipped to `file_len`.
    pub fn chunk_range(&self, c: usize, file_len: u64) -> Range<u64> {
        let start = c as u64 * self.chunk_bytes;
        start..(start + self.chunk_bytes).min(file_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn layout() -> RegionLayout {
        // header 0..1M, embedding 1M..5M, layers 0..3 of 2 MiB each at 5M.., output 11M..12M.
        let mut l = RegionLayout::whole_file(12 * MB)
            .with_span(0, MB, SpanKind::Other)
            .with_span(MB, 5 * MB, SpanKind::Embedding);
        for n in 0..3 {
            let s = 5 * MB + u64::from(n) * 2 * MB;
            l = l.with_span(s, s + 2 * MB, SpanKind::Layer(n));
        }
        l.with_span(11 * MB, 12 * MB, SpanKind::Other)
    }

    #[test]
    fn validates_spans() {
        assert!(layout().validate().is_ok());
        let bad = RegionLayout::whole_file(10).with_span(5, 11, SpanKind::Other);
        assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::Layout);
        assert_eq!(layout().layer_count(), 3);
        assert_eq!(layout().layer_range(1), Some(7 * MB..9 * MB));
    }

    #[test]
    fn fill_order_is_header_layers_output_embedding() {
        let plan = ChunkPlan::new(&layout(), MB);
        assert_eq!(plan.chunk_count, 12);
        assert_eq!(plan.fill_order, vec![0, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3, 4]);
        assert_eq!(plan.layer_chunks[2], vec![9, 10]);
        assert_eq!(plan.layer_at(8 * MB), Some(1));
        assert_eq!(plan.layer_at(2 * MB), None);
        assert_eq!(plan.chunk_range(11, 12 * MB - 5), 11 * MB..12 * MB - 5);
    }

    #[test]
    fn chunk_shared_by_embedding_and_layer_goes_with_the_layer() {
        let l = RegionLayout::whole_file(4 * MB)
            .with_span(0, 3 * MB / 2, SpanKind::Embedding)
            .with_span(3 * MB / 2, 4 * MB, SpanKind::Layer(0));
        let plan = ChunkPlan::new(&l, MB);
        assert_eq!(plan.fill_order, vec![1, 2, 3, 0]);
    }

    #[test]
    fn no_spans_means_file_order() {
        let plan = ChunkPlan::new(&RegionLayout::whole_file(3 * MB + 1), MB);
        assert_eq!(plan.fill_order, vec![0, 1, 2, 3]);
    }
}
