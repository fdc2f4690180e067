//! Writing a synthetic model: the header from the plan and the vocabulary, then each tensor's
//! bytes as `threads` workers draw and quantize its rows.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use airs_gguf::GgmlType;
use airs_gguf::writer::{MetaValue, encode_header, write_gguf};
use airs_kernels::KernelError;

use crate::plan::{ALIGNMENT, PlannedTensor, metadata, plan_tensors};
use crate::weights::TensorStream;
use crate::{QuantMix, Shape, SynthError, Vocabulary};

/// Tensors with fewer values than this are generated on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Everything that determines a synthetic model's bytes. (The thread count used to write
/// it does not.)
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Recipe {
    pub shape: Shape,
    pub quant: QuantMix,
    pub seed: u64,
}

/// What [`Recipe::write_file`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenModel {
    pub path: PathBuf,
    /// Size of the file.
    pub bytes: u64,
    pub tensors: usize,
    /// Total number of weight values.
    pub parameters: u64,
}

impl Recipe {
    pub fn new(shape: Shape, quant: QuantMix, seed: u64) -> Recipe {
        Recipe { shape, quant, seed }
    }

    /// A conventional file name: `{shape}-{quant}.gguf`, plus `-seed{seed}` unless the seed is 1.
    pub fn file_name(&self) -> String {
        let seed = if self.seed == 1 {
            String::new()
        } else {
            format!("-seed{}", self.seed)
        };
        format!("{}-{}{seed}.gguf", self.shape, self.quant)
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> Vec<PlannedTensor> {
        plan_tensors(self.shape, self.quant)
    }

    /// The metadata written with `vocab`.
    pub fn metadata(&self, vocab: &Vocabulary) -> Result<Vec<(String, MetaValue)>, SynthError> {
        metadata(self.shape, self.quant, self.seed, vocab)
    }

    /// Total number of weight values.
    pub fn parameters(&self) -> u64 {
        self.tensors().iter().map(PlannedTensor::elements).sum()
    }

    /// The exact size of the file [`Recipe::write`] produces with `vocab`, computed from the
    /// header and the tensor table alone.
    pub fn file_size(&self, vocab: &Vocabulary) -> Result<u64, SynthError> {
        let specs: Vec<_> = self.tensors().into_iter().map(|t| t.spec).collect();
        let (header, offsets) = encode_header(&self.metadata(vocab)?, &specs, ALIGNMENT.into())?;
        let data_len = match (offsets.last(), specs.last()) {
            (Some(offset), Some(last)) => offset + last.bytes()?,
            _ => 0,
        };
        Ok(header.len() as u64 + data_len)
    }

    /// Write the model to `out` using `threads` workers and flush it; returns the bytes
    /// written. The bytes depend on the recipe only, never on `threads`. Memory: one
    /// tensor's encoded bytes plus one f32 row per worker.
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        vocab: &Vocabulary,
        threads: usize,
    ) -> Result<u64, SynthError> {
        if threads == 0 {
            return Err(SynthError::NoThreads);
        }
        let meta = self.metadata(vocab)?;
        let tensors = self.tensors();
        let specs: Vec<_> = tensors.iter().map(|t| t.spec.clone()).collect();
        // write_gguf's callback speaks io::Error; keep a quantizer failure typed on the side.
        let mut quantize_failure = None;
        let written = write_gguf(out, &meta, &specs, ALIGNMENT.into(), |i, buf| {
            let tensor = &tensors[i];
            encode_tensor(tensor, self.seed, threads, buf).map_err(|source| {
                quantize_failure = Some(SynthError::Quantize {
                    tensor: tensor.spec.name.clone(),
                    source,
                });
                std::io::Error::other("quantization failed")
            })
        });
        match (written, quantize_failure) {
            (_, Some(failure)) => Err(failure),
            (Ok(bytes), None) => {
                out.flush()?;
                Ok(bytes)
            }
            (Err(e), None) => Err(e.into()),
        }
    }

    /// Write the model to `path`: into `path` + `.partial` first, renamed over `path` once
    /// complete (and removed on failure), so `path` never holds a truncated model.
    pub fn write_file(
        &self,
        path: &Path,
        vocab: &Vocabulary,
        threads: usize,
    ) -> Result<WrittenModel, SynthError> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let result = self
            .write_to_path(&partial, vocab, threads)
            .and_then(|bytes| {
                std::fs::rename(&partial, path).map_err(|source| SynthError::Write {
                    path: path.into(),
                    source,
                })?;
                Ok(bytes)
            });
        match result {
            Ok(bytes) => Ok(WrittenModel {
                path: path.into(),
                bytes,
                tensors: self.tensors().len(),
                parameters: self.parameters(),
            }),
            Err(e) => {
                // Best effort: the write error is what the caller needs to see.
                let _ = std::fs::remove_file(&partial);
                Err(e)
            }
        }
    }

    fn write_to_path(
        &self,
        path: &Path,
        vocab: &Vocabulary,
        threads: usize,
    ) -> Result<u64, SynthError> {
        let io_error = |source| SynthError::Write {
            path: path.into(),
            source,
        };
        let file = File::create(path).map_err(io_error)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let bytes = self.write(&mut out, vocab, threads).map_err(|e| match e {
            SynthError::Io(source) => io_error(source),
            other => other,
        })?;
        let file = out.into_inner().map_err(|e| io_error(e.into_error()))?;
        file.sync_all().map_err(io_error)?;
        Ok(bytes)
    }
}

/// Append `tensor`'s encoded bytes to the empty `buf`, splitting its rows into `threads`
/// contiguous ranges drawn and quantized in parallel.
fn encode_tensor(
    tensor: &PlannedTensor,
    seed: u64,
    threads: usize,
    buf: &mut Vec<u8>,
) -> Result<(), KernelError> {
    let ty = tensor.spec.ty;
    let row_len = tensor.row_len();
    let rows = tensor.rows();
    let row_bytes = airs_kernels::row_bytes(ty, row_len)?;
    let stream = TensorStream::new(seed, &tensor.spec.name, tensor.role, tensor.sharp);
    buf.resize(rows * row_bytes, 0);
    if let Some(values) = &tensor.fixed {
        return airs_kernels::quantize_row(ty, values, buf);
    }

    let workers = if rows * row_len < PARALLEL_MIN_ELEMENTS {
        1
    } else {
        threads.min(rows)
    };
    if workers <= 1 {
        return encode_rows(&stream, ty, row_len, row_bytes, 0..rows, buf);
    }
    std::thread::scope(|scope| {
        let mut rest = buf.as_mut_slice();
        let mut handles = Vec::with_capacity(workers);
        for w in 0..workers {
            let range = rows * w / workers..rows * (w + 1) / workers;
            let (mine, tail) = rest.split_at_mut(range.len() * row_bytes);
            rest = tail;
            let stream = &stream;
            handles.push(
                scope.spawn(move || encode_rows(stream, ty, row_len, row_bytes, range, mine)),
            );
        }
        // Joining in order returns the first failure; the scope joins any workers left.
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })
}

/// Draw rows `rows` of the tensor and encode them as `ty` into `out`, which holds exactly
/// their `row_bytes`-byte encodings.
fn encode_rows(
    stream: &TensorStream,
    ty: GgmlType,
    row_len: usize,
    row_bytes: usize,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<(), KernelError> {
    let mut values = vec![0.0f32; row_len];
    for (row, dst) in rows.zip(out.chunks_exact_mut(row_bytes)) {
        stream.fill_row(row as u64, &mut values);
        airs_kernels::quantize_row(ty, &values, dst)?;
    }
    Ok(())
}
