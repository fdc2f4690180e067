//! A model ready for inference: its hyperparameters and, for every weight, where its bytes lie
//! in the model image. Weights are not copied: the forward pass slices them out of
//! [`ModelImage::bytes`] at each use. Norm vectors and biases (a few KB per layer) are decoded
//! when a forward pass reaches their layer, not when the model is built, so building a model
//! over a lazily loaded region reads nothing but the header.
//!
//! Tensor names and shapes follow llama.cpp's `llama` and `qwen2` graphs: `token_embd`,
//! `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
//! ffn_down}`, `output_norm`, `output` (absent when tied to `token_embd`), for qwen2 the
//! `attn_{q,k,v}.bias` vectors, for gemma3 and qwen3 the per-head `attn_{q,k}_norm` (and
//! gemma3's `post_attention_norm` / `post_ffw_norm` vectors), for phi3 the fused `attn_qkv`
//! and gate/up `ffn_up` matrices (sliced by rows in place) and `rope_factors_short`, and
//! `rope_freqs` where Llama 3 files carry it.

use std::sync::Arc;

use airs_gguf::{GgmlType, Gguf, ModelConfig, TensorInfo};

use crate::error::{EngineError, EngineErrorKind};
use crate::image::ModelImage;

/// Where one weight matrix lies in the image: `rows` rows of `cols` values of type `ty`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub ty: GgmlType,
    /// Values per row (ggml `ne0`: the input width of a projection).
    pub cols: usize,
    /// Number of rows (the output width of a projection).
    pub rows: usize,
    /// Absolute offset of the data in the image.
    pub offset: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Groups of 16 rows the loader repacked into the rows16 layout (bit `g`: rows
    /// `16g..16g+16`; see [`crate::repack`]); `None`: every row as in the file.
    pub packed: Option<Arc<[u64]>>,
}

impl TensorRef {
    fn new(info: &TensorInfo<'_>, cols: usize, rows: usize) -> Result<TensorRef, EngineError> {
        let dims_ok = match info.dims.as_slice() {
            [c] => *c as usize == cols && rows == 1,
            [c, r] => *c as usize == cols && *r as usize == rows,
            _ => false,
        };
        if !dims_ok {
            return Err(EngineError::bad_tensor(
                info.name,
                format!("shape {:?}, expected [{cols}, {rows}]", info.dims),
            ));
        }
        if !airs_kernels::is_supported(info.ty) {
            return Err(EngineError::new(EngineErrorKind::UnsupportedTensorType {
                tensor: info.name.into(),
                ty: info.ty,
            }));
        }
        let row_bytes = airs_kernels::row_bytes(info.ty, cols)
            .map_err(|e| EngineError::bad_tensor(info.name, e.to_string()))?;
        Ok(TensorRef {
            ty: info.ty,
            cols,
            rows,
            offset: info.offset as usize,
            row_bytes,
            packed: None,
        })
    }

    /// Whether group `g` (rows `16g..16g+16`) is in the rows16 layout.
    pub fn is_packed(&self, g: usize) -> bool {
        self.packed
            .as_ref()
            .is_some_and(|bits| bits.get(g / 64).is_some_and(|w| w >> (g % 64) & 1 == 1))
    }

    /// Total bytes of the tensor.
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// The tensor's bytes within `image`.
    pub fn data<'a>(&self, image: &'a [u8]) -> &'a [u8] {
        &image[self.offset..self.offset + self.bytes()]
    }

    /// Decode a one-row tensor (a norm vector or bias) from `image` into `out`.
    pub fn decode_vector(&self, image: &[u8], out: &mut Vec<f32>) {
        out.resize(self.cols, 0.0);
        airs_kernels::dequantize_row(self.ty, self.row(image, 0), out)
            .expect("vector geometry checked at model load");
    }

    /// Rows `first..first + rows` of this matrix, as a matrix of its own (a slice of a fused
    /// tensor, read in place).
    fn sub_rows(&self, first: usize, rows: usize) -> TensorRef {
        assert!(first + rows <= self.rows, "row range inside the tensor");
        assert!(self.packed.is_none(), "fused matrices are never repacked");
        TensorRef {
            rows,
            offset: self.offset + first * self.row_bytes,
            ..self.clone()
        }
    }

    /// Row `row`'s bytes within `image`, for a tensor in the file's layout (the rows of a
    /// repacked group are interleaved with their neighbours': use [`Self::dequantize_row`]).
    pub fn row<'a>(&self, image: &'a [u8], row: usize) -> &'a [u8] {
        debug_assert!(!self.is_packed(row / airs_kernels::rows16::GROUP_ROWS));
        let start = self.offset + row * self.row_bytes;
        &image[start..start + self.row_bytes]
    }

    /// Decode row `row` from `image` into `out` (`cols` values), in either layout.
    pub fn dequantize_row(
        &self,
        image: &[u8],
        row: usize,
        out: &mut [f32],
    ) -> Result<(), airs_kernels::KernelError> {
        const G: usize = airs_kernels::rows16::GROUP_ROWS;
        if self.is_packed(row / G) {
            let start = self.offset + row / G * G * self.row_bytes;
            let group = &image[start..start + G * self.row_bytes];
            return airs_kernels::rows16::dequantize_row(self.ty, self.cols, group, row % G, out);
        }
        airs_kernels::dequantize_row(self.ty, self.row(image, row), out)
    }
}

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: TensorRef,
    pub wq: TensorRef,
    pub wk: TensorRef,
    pub wv: TensorRef,
    pub wo: TensorRef,
    pub bq: Option<TensorRef>,
    pub bk: Option<TensorRef>,
    pub bv: Option<TensorRef>,
    /// Per-head RMSNorm weights of q and k (`head_dim` values each).
    pub q_norm: Option<TensorRef>,
    pub k_norm: Option<TensorRef>,
    /// RMSNorm of the attention output before its residual add.
    pub post_attn_norm: Option<TensorRef>,
    pub ffn_norm: TensorRef,
    pub w_gate: TensorRef,
    pub w_up: TensorRef,
    pub w_down: TensorRef,
    /// RMSNorm of the feed-forward output before its residual add.
    pub post_ffn_norm: Option<TensorRef>,
}

/// A model: hyperparameters plus the location of every weight in its image.
pub struct Model {
    image: Arc<dyn ModelImage>,
    pub config: ModelConfig,
    pub token_embd: TensorRef,
    pub output_norm: TensorRef,
    /// The output projection (`token_embd` itself when tied).
    pub output: TensorRef,
    /// RoPE frequency factors (`rope_freqs` or Phi-3's short LongRoPE factors): at least
    /// `rope_dims / 2` values.
    pub rope_factors: Option<TensorRef>,
    pub layers: Vec<LayerWeights>,
}

impl Model {
    /// Build a model over `image`, whose parsed header is `gguf`.
    pub fn new(image: Arc<dyn ModelImage>, gguf: &Gguf<'_>) -> Result<Model, EngineError> {
        let config = ModelConfig::from_gguf(gguf)?;
        let n_embd = config.embedding_len;
        let tensor = |name: &str| {
            gguf.tensor(name)
                .ok_or_else(|| EngineError::bad_tensor(name, "missing"))
        };
        let matrix =
            |name: &str, cols: usize, rows: usize| TensorRef::new(tensor(name)?, cols, rows);
        let vector = |name: &str, len: usize| TensorRef::new(tensor(name)?, len, 1);
        let opt_vector = |name: &str, len: usize| -> Result<Option<TensorRef>, EngineError> {
            match gguf.tensor(name) {
                None => Ok(None),
                Some(_) => vector(name, len).map(Some),
            }
        };

        let mut token_embd = matrix("token_embd.weight", n_embd, config.vocab_len)?;
        let mut output = if config.tied_output {
            token_embd.clone()
        } else {
            matrix("output.weight", n_embd, config.vocab_len)?
        };
        let output_norm = vector("output_norm.weight", n_embd)?;
        let rope_factors = match config.rope_factors {
            None => None,
            Some(f) => {
                let info = tensor(f.tensor_name())?;
                let len = info.dims.first().copied().unwrap_or(0) as usize;
                if len < config.rope_dims / 2 {
                    return Err(EngineError::bad_tensor(
                        f.tensor_name(),
                        format!("{len} factors for {} rotated pairs", config.rope_dims / 2),
                    ));
                }
                Some(TensorRef::new(info, len, 1)?)
            }
        };
        let (q_len, kv_len, ff) = (config.q_len(), config.kv_len(), config.ff_len);
        let head_dim = config.head_dim;
        // A vector the configuration requires (`Some`) or has no use for (`None`).
        let wanted =
            |name: &str, len: usize, wanted: bool| -> Result<Option<TensorRef>, EngineError> {
                wanted.then(|| vector(name, len)).transpose()
            };
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let name = |t: &str| format!("blk.{l}.{t}");
            // Fused matrices are read in place as row ranges, never copied.
            let (wq, wk, wv) = if config.fused_qkv {
                let qkv = matrix(&name("attn_qkv.weight"), n_embd, q_len + 2 * kv_len)?;
                (
                    qkv.sub_rows(0, q_len),
                    qkv.sub_rows(q_len, kv_len),
                    qkv.sub_rows(q_len + kv_len, kv_len),
                )
            } else {
                (
                    matrix(&name("attn_q.weight"), n_embd, q_len)?,
                    matrix(&name("attn_k.weight"), n_embd, kv_len)?,
                    matrix(&name("attn_v.weight"), n_embd, kv_len)?,
                )
            };
            let (w_gate, w_up) = if config.fused_gate_up {
                let gate_up = matrix(&name("ffn_up.weight"), n_embd, 2 * ff)?;
                (gate_up.sub_rows(0, ff), gate_up.sub_rows(ff, ff))
            } else {
                (
                    matrix(&name("ffn_gate.weight"), n_embd, ff)?,
                    matrix(&name("ffn_up.weight"), n_embd, ff)?,
                )
            };
            layers.push(LayerWeights {
                attn_norm: vector(&name("attn_norm.weight"), n_embd)?,
                wq,
                wk,
                wv,
                wo: matrix(&name("attn_output.weight"), q_len, n_embd)?,
                bq: opt_vector(&name("attn_q.bias"), q_len)?,
                bk: opt_vector(&name("attn_k.bias"), kv_len)?,
                bv: opt_vector(&name("attn_v.bias"), kv_len)?,
                q_norm: wanted(&name("attn_q_norm.weight"), head_dim, config.qk_norm)?,
                k_norm: wanted(&name("attn_k_norm.weight"), head_dim, config.qk_norm)?,
                post_attn_norm: wanted(
                    &name("post_attention_norm.weight"),
                    n_embd,
                    config.post_norms,
                )?,
                ffn_norm: vector(&name("ffn_norm.weight"), n_embd)?,
                w_gate,
                w_up,
                w_down: matrix(&name("ffn_down.weight"), ff, n_embd)?,
                post_ffn_norm: wanted(&name("post_ffw_norm.weight"), n_embd, config.post_norms)?,
            });
        }
        // Where the loader repacked matrices, say which groups, by the plan's own rule.
        if let Some(plan) = image.repack_plan() {
            let mark = |t: &mut TensorRef| t.packed = plan.packed_groups(t.offset as u64);
            for l in &mut layers {
                for t in [
                    &mut l.wq,
                    &mut l.wk,
                    &mut l.wv,
                    &mut l.wo,
                    &mut l.w_gate,
                    &mut l.w_up,
                    &mut l.w_down,
                ] {
                    // Slices of fused matrices start inside an unplanned tensor: no match.
                    mark(t);
                }
            }
            mark(&mut output);
            if config.tied_output {
                token_embd.packed = output.packed.clone();
            }
        }
        Ok(Model {
            image,
            config,
            token_embd,
            output_norm,
            output,
            rope_factors,
            layers,
        })
    }

    /// The image the weights are read from.
    pub fn image(&self) -> &Arc<dyn ModelImage> {
        &self.image
    }

    /// Bytes of every weight matrix a decoded token reads once (all layers plus the output
    /// projection; the embedding lookup reads one row).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.layer_matrix_bytes() + self.output.bytes() + self.token_embd.row_bytes
    }

    /// Multiply-accumulates of the matrix products of one token: every layer matrix and the
    /// output projection, rows × columns each (attention over the cache not counted).
    pub fn matmul_macs_per_token(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .chain([&self.output])
            .map(|t| t.rows * t.cols)
            .sum()
    }

    /// Bytes of all weights in the image (tensor data, header excluded).
    pub fn weight_bytes(&self) -> usize {
        let untied = if self.config.tied_output {
            0
        } else {
            self.output.bytes()
        };
        self.layer_matrix_bytes() + untied + self.token_embd.bytes()
    }

    fn layer_matrix_bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .map(TensorRef::bytes)
            .sum()
    }
}
