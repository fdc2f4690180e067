//! The KV cache interface the forward pass writes keys/values into and attends through, and
//! its contiguous implementation (one `[capacity × kv_len]` array per layer for K and for V).
//!
//! The contiguous cache reserves its whole capacity up front; the paged cache (block pool and
//! block tables) replaces it in the engine and keeps it only as a test oracle. Cost: `store`
//! is O(kv_len) per position; `attend` is O(n_ctx × head_dim) per query head.

use half::f16;

use crate::error::{EngineError, EngineErrorKind};

/// Element type of cached keys and values.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    /// Bytes per cached element.
    pub fn element_bytes(self) -> f64 {
        match self {
            KvType::F32 => 4.0,
            KvType::F16 => 2.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<KvType, String> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            other => Err(format!("unknown KV type {other:?} (f32 or f16)")),
        }
    }
}

/// Geometry of a model's KV cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Values per position per layer for K (and for V).
    pub fn kv_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Storage of a sequence's keys and values, as the forward pass uses it.
pub trait KvCache: Send + Sync {
    /// Positions currently stored (the next position to write).
    fn len(&self) -> usize;

    /// Whether no position is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Make room for positions up to `new_len` (exclusive). Called before a forward pass
    /// writes them; fails when the cache cannot grow.
    fn reserve(&mut self, new_len: usize) -> Result<(), EngineError>;

    /// Store K and V for `positions` consecutive positions starting at `start` in `layer`:
    /// `k` and `v` hold `positions × kv_len` values.
    fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]);

    /// Record that positions `0..len` are now stored (after every layer wrote them).
    fn set_len(&mut self, len: usize);

    /// Attention of one query head against positions `0..n_ctx` of `kv_head` in `layer`:
    /// `out = softmax(scale · K q) · V`. `scores` is scratch space of at least `n_ctx` floats.
    fn attend(
        &self,
        layer: usize,
        kv_head: usize,
        q: &[f32],
        n_ctx: usize,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    );

    /// Bytes of memory the cache holds.
    fn allocated_bytes(&self) -> usize;
}

enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A contiguous cache holding `capacity` positions for every layer.
pub struct ContiguousKv {
    shape: KvShape,
    capacity: usize,
    len: usize,
    /// Per layer: K then V, each `capacity × kv_len`.
    layers: Vec<(Store, Store)>,
}

impl ContiguousKv {
    pub fn new(shape: KvShape, capacity: usize, ty: KvType) -> ContiguousKv {
        let n = capacity * shape.kv_len();
        let make = || match ty {
            KvType::F32 => Store::F32(vec![0.0; n]),
            KvType::F16 => Store::F16(vec![f16::ZERO; n]),
        };
        ContiguousKv {
            shape,
            capacity,
            len: 0,
            layers: (0..shape.layers).map(|_| (make(), make())).collect(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

fn write(store: &mut Store, at: usize, src: &[f32]) {
    match store {
        Store::F32(d) => d[at..at + src.len()].copy_from_slice(src),
        Store::F16(d) => {
            for (o, &x) in d[at..at + src.len()].iter_mut().zip(src) {
                *o = f16::from_f32(x);
            }
        }
    }
}

/// How attention rounds its inputs, to match llama.cpp's kernels for each KV type.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rounding {
    /// f32 throughout.
    None,
    /// As ggml multiplies f16 K and V: the query and the softmax weights are rounded to f16
    /// before their dot products (ggml converts the f32 operand to the f16 `vec_dot_type`).
    F16,
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `softmax(scale · K q) · V` over `n_ctx` cached rows, read one row at a time by `k_row` and
/// `v_row`. Softmax sums in f64 as ggml does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_rows(
    k_row: impl Fn(usize, &mut [f32]),
    v_row: impl Fn(usize, &mut [f32]),
    q: &[f32],
    n_ctx: usize,
    scale: f32,
    rounding: Rounding,
    out: &mut [f32],
    scores: &mut [f32],
) {
    let head_dim = q.len();
    let mut q_buf = [0.0f32; 256];
    let q = match rounding {
        Rounding::None => q,
        Rounding::F16 => {
            for (o, &x) in q_buf.iter_mut().zip(q) {
                *o = round_f16(x);
            }
            &q_buf[..head_dim]
        }
    };
    let mut row = [0.0f32; 256];
    let row = &mut row[..head_dim];
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores[..n_ctx].iter_mut().enumerate() {
        k_row(j, row);
        *s = dot(q, row) * scale;
        max = max.max(*s);
    }
    let mut sum = 0.0f64;
    for s in &mut scores[..n_ctx] {
        *s = (*s - max).exp();
        sum += f64::from(*s);
    }
    let inv = (1.0 / sum) as f32;
    out.fill(0.0);
    for (j, &s) in scores[..n_ctx].iter().enumerate() {
        v_row(j, row);
        let w = match rounding {
            Rounding::None => s * inv,
            Rounding::F16 => round_f16(s * inv),
        };
        for (o, &v) in out.iter_mut().zip(row.iter()) {
            *o += w * v;
        }
    }
}

#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorize without reassociation.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for i in chunks..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

fn read_row(store: &Store, at: usize, out: &mut [f32]) {
    match store {
        Store::F32(d) => out.copy_from_slice(&d[at..at + out.len()]),
        Store::F16(d) => {
            let n = out.len();
            for (o, x) in out.iter_mut().zip(&d[at..at + n]) {
                *o = x.to_f32();
            }
        }
    }
}

impl KvCache for ContiguousKv {
    fn len(&self) -> usize {
        self.len
    }

    fn reserve(&mut self, new_len: usize) -> Result<(), EngineError> {
        if new_len > self.capacity {
            return Err(EngineError::new(EngineErrorKind::ContextFull {
                needed: new_len,
                capacity: self.capacity,
            }));
        }
        Ok(())
    }

    fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let at = start * self.shape.kv_len();
        let (ks, vs) = &mut self.layers[layer];
        write(ks, at, k);
        write(vs, at, v);
    }

    fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    fn attend(
        &self,
        layer: usize,
        kv_head: usize,
        q: &[f32],
        n_ctx: usize,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let kv_len = self.shape.kv_len();
        let off = kv_head * self.shape.head_dim;
        let (ks, vs) = &self.layers[layer];
        let rounding = match ks {
            Store::F32(_) => Rounding::None,
            Store::F16(_) => Rounding::F16,
        };
        attend_rows(
            |j, row| read_row(ks, j * kv_len + off, row),
            |j, row| read_row(vs, j * kv_len + off, row),
            q,
            n_ctx,
            scale,
            rounding,
            out,
            scores,
        );
    }

    fn allocated_bytes(&self) -> usize {
        let per = match &self.layers.first() {
            Some((Store::F16(_), _)) => 2,
            _ => 4,
        };
        2 * self.shape.layers * self.capacity * self.shape.kv_len() * per
    }
}
