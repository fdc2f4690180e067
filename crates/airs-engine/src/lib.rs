//! airs-engine: the inference engine — model weights read in place from a model image, the
//! llama/qwen2 forward pass as one step over a batch of sequences, KV caches (contiguous and
//! paged), and the sampler, on an explicit thread pool; `repack` plans which matrices the loader
//! stores in the kernels' interleaved layout, and `bandwidth` probes the memory they stream from. Generation (the decode loop, stop
//! strings, scheduling) lives in airs-runtime.

pub mod bandwidth;
pub mod cores;
pub mod dot_peak;
pub mod error;
pub mod footprint;
pub mod forward;
pub mod image;
pub mod kv;
mod kv_q8;
mod lines;
mod math;
pub mod model;
pub mod paged;
mod par;
pub mod pool;
pub mod repack;
pub mod sampler;

pub use bandwidth::{ReadBandwidth, ReadProbe, probe_read_bandwidth};
pub use cores::{
    CoreShare, ReadPlacement, Sharing, probe_core_share, probe_read_path, probe_read_placement,
    probe_round_trip,
};
pub use dot_peak::{DotPeak, probe_int8_dot_peak};
pub use error::{EngineError, EngineErrorKind};
pub use forward::{BatchOutput, BatchSeq, Logits, Output, Runtime};
pub use image::{MappedFile, ModelImage, OwnedImage, StaticImage};
pub use kv::{ContiguousKv, KvCache, KvShape, KvType};
pub use model::{LayerWeights, Model, TensorRef};
pub use paged::{PagedKv, PagedKvConfig, PagedKvPool};
pub use pool::{ChunksPerThread, ThreadPool};
pub use sampler::{Sampler, SamplerConfig};
