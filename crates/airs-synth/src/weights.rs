//! Seeded random weights, one row at a time.
//!
//! Row `r` of tensor `name` is drawn from a splitmix64 stream seeded by `(seed, name, r)`
//! only, so the values do not depend on the thread that computes the row, on the order
//! rows are computed in, or on the tensor's type: the f32, f16, q8_0, q4_k_m, q5_k_m, q4_1 and
//! q5_1 files of one seed are encodings of the same underlying weights.
//!
//! Values are "gaussian-ish": the Irwin–Hall sum of four 16-bit uniforms from one 64-bit
//! draw (bounded at ±3.46 σ, so never an outlier that could overflow an activation), scaled
//! to the role's mean and standard deviation. Cost: about one splitmix64 step per value.

use crate::mix::TensorRole;

/// Standard deviation of the projection and embedding weights (GPT-2/llama initialisation
/// scale; trained llama weights are of the same order).
pub const WEIGHT_STD: f32 = 0.02;
/// Norm weights are `1.0 ± NORM_STD`.
pub const NORM_STD: f32 = 0.02;

/// Mean and standard deviation of the values of a tensor with `role`. With `sharp`
/// (reference-distribution shapes) embeddings have std 1, q and k projections 0.1 and the
/// output projection 0.5, so that attention is peaked and logits spread over several nats
/// instead of the near-uniform distributions of initialisation-scale weights.
pub fn distribution(role: TensorRole, sharp: bool) -> (f32, f32) {
    if role.is_norm() {
        return (1.0, NORM_STD);
    }
    let std = match role {
        TensorRole::TokenEmbedding if sharp => 1.0,
        TensorRole::AttnQ | TensorRole::AttnK | TensorRole::AttnQkv if sharp => 0.1,
        TensorRole::Output if sharp => 0.5,
        _ => WEIGHT_STD,
    };
    (0.0, std)
}

/// The splitmix64 output function (Steele, Lea & Flood 2014), a strong 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64: a 64-bit counter passed through [`mix64`].
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A value with mean 0 and standard deviation 1, approximately normal (Irwin–Hall, n = 4).
    pub fn next_gaussianish(&mut self) -> f32 {
        // Four uniforms on 0..=65535: mean 4 × 32767.5, variance 4 × (65536² − 1) / 12.
        const MEAN: f32 = 131_070.0;
        const INV_STD: f32 = 1.0 / 37_837.23;
        let r = self.next_u64();
        let sum = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
        (sum as f32 - MEAN) * INV_STD
    }
}

/// FNV-1a hash of a tensor name, to key its random stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The random stream of one tensor: hands out the generator of each of its rows.
#[derive(Copy, Clone, Debug)]
pub struct TensorStream {
    key: u64,
    mean: f32,
    std: f32,
}

impl TensorStream {
    pub fn new(seed: u64, name: &str, role: TensorRole, sharp: bool) -> TensorStream {
        let (mean, std) = distribution(role, sharp);
        TensorStream {
            key: mix64(seed ^ mix64(name_hash(name))),
            mean,
            std,
        }
    }

    /// Fill `row` with the values of row `index`.
    pub fn fill_row(&self, index: u64, row: &mut [f32]) {
        let mut rng = SplitMix64::new(mix64(self.key ^ index.wrapping_mul(GOLDEN_GAMMA)));
        for v in row {
            *v = self.mean + self.std * rng.next_gaussianish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussianish_has_unit_variance_and_zero_mean() {
        let mut rng = SplitMix64::new(7);
        let n = 1_000_000;
        let (mut sum, mut sq) = (0.0f64, 0.0f64);
        for _ in 0..n {
            let v = f64::from(rng.next_gaussianish());
            sum += v;
            sq += v * v;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
    }

    #[test]
    fn rows_depend_on_seed_name_and_index_only() {
        let a = TensorStream::new(1, "blk.0.attn_q.weight", TensorRole::AttnQ, false);
        let b = TensorStream::new(1, "blk.0.attn_k.weight", TensorRole::AttnK, false);
        let c = TensorStream::new(2, "blk.0.attn_q.weight", TensorRole::AttnQ, false);
        let row = |s: &TensorStream, i| {
            let mut r = vec![0.0; 64];
            s.fill_row(i, &mut r);
            r
        };
        assert_eq!(row(&a, 3), row(&a, 3));
        assert_ne!(row(&a, 3), row(&a, 4));
        assert_ne!(row(&a, 3), row(&b, 3));
        assert_ne!(row(&a, 3), row(&c, 3));
    }
}
