//! airs-engine: the inference engine — model weights read in place from a model image, the
//! llama/qwen2 forward pass, KV caches, sampling and generation, on an explicit thread pool.

pub mod error;
pub mod footprint;
pub mod forward;
pub mod generate;
pub mod image;
pub mod kv;
mod math;
pub mod model;
pub mod paged;
mod par;
pub mod pool;
pub mod sampler;

pub use error::{EngineError, EngineErrorKind};
pub use forward::{Logits, Runtime};
pub use generate::{GenerateConfig, Generation, StopReason, generate};
pub use image::{MappedFile, ModelImage, OwnedImage, StaticImage};
pub use kv::{ContiguousKv, KvCache, KvShape, KvType};
pub use model::{LayerWeights, Model, TensorRef};
pub use paged::{PagedKv, PagedKvConfig, PagedKvPool};
pub use pool::ThreadPool;
pub use sampler::{Sampler, SamplerConfig};
