//! The tensor table and metadata of a synthetic model, computed without generating weights.

use airs_gguf::writer::{MetaValue, TensorSpec};

use crate::mix::{QuantMix, TensorRole};
use crate::shape::{Hyperparameters, RopeScaling};
use crate::{Shape, SynthError, Vocabulary};

/// `general.alignment` of generated files (ggml's default, written explicitly).
pub const ALIGNMENT: u32 = 32;
/// `general.quantization_version` llama.cpp writes for block-quantized files.
const QUANTIZATION_VERSION: u32 = 2;

/// One tensor of the plan: what the file declares plus what the generator needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub spec: TensorSpec,
    pub role: TensorRole,
    /// Whether its weights are drawn sharp ([`crate::Hyperparameters::sharp`]).
    pub sharp: bool,
    /// Values computed by the plan instead of drawn (RoPE factors).
    pub fixed: Option<Vec<f32>>,
}

impl PlannedTensor {
    /// Values per row (`dims[0]`, ggml's `ne0`).
    pub fn row_len(&self) -> usize {
        self.spec.dims[0] as usize
    }

    /// Rows: the product of the other dimensions.
    pub fn rows(&self) -> usize {
        self.spec.dims[1..].iter().product::<u64>() as usize
    }

    pub fn elements(&self) -> u64 {
        self.spec.dims.iter().product()
    }
}

/// Every tensor of `shape` under `quant`, in file order: `token_embd`, then each block's
/// tensors in llama.cpp's order (norm, q, k, v, output, ffn norm, gate, up, down), then
/// `output_norm` and `output`. Dimensions are in ggml order (`[row_len, rows]`).
pub fn plan(shape: Shape, quant: QuantMix) -> Vec<TensorSpec> {
    plan_tensors(shape, quant)
        .into_iter()
        .map(|t| t.spec)
        .collect()
}

/// [`plan`] with each tensor's role.
pub fn plan_tensors(shape: Shape, quant: QuantMix) -> Vec<PlannedTensor> {
    let hp = shape.hparams();
    let (n_embd, n_kv, n_ff, n_vocab) = (
        hp.embedding_len as u64,
        hp.kv_len() as u64,
        hp.ff_len as u64,
        hp.vocab_len as u64,
    );
    let layers = hp.layers;
    let tensor = |name: String, dims: Vec<u64>, role: TensorRole, layer: usize| PlannedTensor {
        spec: TensorSpec {
            name,
            dims,
            ty: quant.tensor_type(role, layer, layers),
        },
        role,
        sharp: hp.sharp,
        fixed: None,
    };
    let fixed = |name: &str, values: Vec<f32>| PlannedTensor {
        spec: TensorSpec {
            name: name.into(),
            dims: vec![values.len() as u64],
            ty: airs_gguf::GgmlType::F32,
        },
        role: TensorRole::RopeFactors,
        sharp: hp.sharp,
        fixed: Some(values),
    };

    let mut out = vec![tensor(
        "token_embd.weight".into(),
        vec![n_embd, n_vocab],
        TensorRole::TokenEmbedding,
        0,
    )];
    match hp.rope_scaling {
        None => {}
        Some(RopeScaling::Llama3) => out.push(fixed("rope_freqs.weight", llama3_factors(&hp))),
        Some(RopeScaling::LongRope { .. }) => {
            // llama.cpp declares them with head_dim/2 values (the rotated pairs use the first).
            let pairs = hp.head_dim() / 2;
            let long = (0..pairs).map(|i| 1.0 + 0.5 * i as f32).collect();
            let short = (0..pairs).map(|i| 1.0 + 0.02 * i as f32).collect();
            out.push(fixed("rope_factors_long.weight", long));
            out.push(fixed("rope_factors_short.weight", short));
        }
    }
    for l in 0..layers {
        let name = |suffix: &str| format!("blk.{l}.{suffix}");
        out.push(tensor(
            name("attn_norm.weight"),
            vec![n_embd],
            TensorRole::AttnNorm,
            l,
        ));
        let projections: &[(&str, u64, TensorRole)] = if hp.fused {
            &[("attn_qkv", n_embd + 2 * n_kv, TensorRole::AttnQkv)]
        } else {
            &[
                ("attn_q", n_embd, TensorRole::AttnQ),
                ("attn_k", n_kv, TensorRole::AttnK),
                ("attn_v", n_kv, TensorRole::AttnV),
            ]
        };
        for &(proj, width, role) in projections {
            out.push(tensor(
                name(&format!("{proj}.weight")),
                vec![n_embd, width],
                role,
                l,
            ));
            if hp.qkv_bias {
                out.push(tensor(
                    name(&format!("{proj}.bias")),
                    vec![width],
                    TensorRole::AttnBias,
                    l,
                ));
            }
        }
        if hp.qk_norm {
            for norm in ["attn_q_norm", "attn_k_norm"] {
                out.push(tensor(
                    name(&format!("{norm}.weight")),
                    vec![hp.head_dim() as u64],
                    TensorRole::AttnQkNorm,
                    l,
                ));
            }
        }
        out.push(tensor(
            name("attn_output.weight"),
            vec![n_embd, n_embd],
            TensorRole::AttnOutput,
            l,
        ));
        out.push(tensor(
            name("ffn_norm.weight"),
            vec![n_embd],
            TensorRole::FfnNorm,
            l,
        ));
        if hp.fused {
            out.push(tensor(
                name("ffn_up.weight"),
                vec![n_embd, 2 * n_ff],
                TensorRole::FfnGateUp,
                l,
            ));
        } else {
            out.push(tensor(
                name("ffn_gate.weight"),
                vec![n_embd, n_ff],
                TensorRole::FfnGate,
                l,
            ));
            out.push(tensor(
                name("ffn_up.weight"),
                vec![n_embd, n_ff],
                TensorRole::FfnUp,
                l,
            ));
        }
        out.push(tensor(
            name("ffn_down.weight"),
            vec![n_ff, n_embd],
            TensorRole::FfnDown,
            l,
        ));
    }
    out.push(tensor(
        "output_norm.weight".into(),
        vec![n_embd],
        TensorRole::OutputNorm,
        0,
    ));
    out.push(tensor(
        "output.weight".into(),
        vec![n_embd, n_vocab],
        TensorRole::Output,
        0,
    ));
    out
}

/// `rope_freqs` as llama.cpp's converter computes it for Llama 3.1 (`rope_scaling` factor 8,
/// low/high frequency factors 1 and 4, original context 8192): 1 for short wavelengths, 8 for
/// long ones, and a smooth interpolation between.
fn llama3_factors(hp: &Hyperparameters) -> Vec<f32> {
    let (factor, low, high, old_context) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let dims = hp.head_dim();
    (0..dims / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(hp.rope_base).powf((2 * i) as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < old_context / high {
                1.0
            } else if wavelen > old_context / low {
                factor
            } else {
                let smooth = (old_context / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// The metadata of the model: `general.*`, the `{arch}.*` hyperparameters, then the
/// vocabulary's `tokenizer.*` entries. Fails if the vocabulary's size does not fit `shape`.
pub fn metadata(
    shape: Shape,
    quant: QuantMix,
    seed: u64,
    vocab: &Vocabulary,
) -> Result<Vec<(String, MetaValue)>, SynthError> {
    vocab.check_size(shape)?;
    let hp = shape.hparams();
    let arch = hp.arch;
    let u32_of = |v: usize| MetaValue::U32(v as u32);
    let mut out: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String(arch.into()),
        ),
        (
            "general.name".into(),
            MetaValue::String(format!("synthetic-{}", shape.name())),
        ),
        (
            "general.description".into(),
            MetaValue::String(format!(
                "random weights (airs-synth, seed {seed}, mix {quant}); not a trained model"
            )),
        ),
        ("general.alignment".into(), MetaValue::U32(ALIGNMENT)),
        (
            "general.file_type".into(),
            MetaValue::U32(quant.file_type()),
        ),
    ];
    if quant.is_quantized() {
        out.push((
            "general.quantization_version".into(),
            MetaValue::U32(QUANTIZATION_VERSION),
        ));
    }
    for (key, value) in [
        ("block_count", u32_of(hp.layers)),
        ("context_length", u32_of(hp.context_len)),
        ("embedding_length", u32_of(hp.embedding_len)),
        ("feed_forward_length", u32_of(hp.ff_len)),
        ("attention.head_count", u32_of(hp.heads)),
        ("attention.head_count_kv", u32_of(hp.kv_heads)),
        ("rope.freq_base", MetaValue::F32(hp.rope_base)),
        (
            "attention.layer_norm_rms_epsilon",
            MetaValue::F32(hp.rms_eps),
        ),
        ("rope.dimension_count", u32_of(hp.rotated_dims())),
    ] {
        out.push((format!("{arch}.{key}"), value));
    }
    if let Some(window) = hp.sliding_window {
        out.push((format!("{arch}.attention.sliding_window"), u32_of(window)));
    }
    if let Some(RopeScaling::LongRope {
        attn_factor,
        original_context,
    }) = hp.rope_scaling
    {
        out.push((
            format!("{arch}.rope.scaling.attn_factor"),
            MetaValue::F32(attn_factor),
        ));
        out.push((
            format!("{arch}.rope.scaling.original_context_length"),
            u32_of(original_context),
        ));
    }
    out.extend(vocab.entries().iter().cloned());
    Ok(out)
}
