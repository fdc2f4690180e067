//! A streaming GGUF v3 writer: metadata and tensor infos first, then each tensor's bytes as a
//! callback produces them, so multi-gigabyte synthetic models are written without holding
//! their weights in memory. Used by `airs gen-model` and by the malformed-file tests.

use std::io::{self, Write};

use crate::GgmlType;
use crate::reader::ValueType;

/// An owned metadata value to write.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// An array whose elements all have type `elem`.
    Array(ValueType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::String(_) => ValueType::String,
            MetaValue::Array(..) => ValueType::Array,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F64(_) => ValueType::F64,
        }
    }

    /// An array of strings.
    pub fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> MetaValue {
        MetaValue::Array(
            ValueType::String,
            items
                .into_iter()
                .map(|s| MetaValue::String(s.into()))
                .collect(),
        )
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            MetaValue::U8(v) => out.push(*v),
            MetaValue::I8(v) => out.push(*v as u8),
            MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::Bool(v) => out.push(u8::from(*v)),
            MetaValue::String(s) => write_str(out, s.as_bytes()),
            MetaValue::Array(elem, items) => {
                out.extend_from_slice(&elem.id().to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    item.write_payload(out);
                }
            }
            MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

/// A tensor to be written: its name, ggml-order dimensions and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    /// Bytes of the tensor's data; an `InvalidInput` error when the shape is not a whole
    /// number of blocks or its size overflows u64.
    pub fn bytes(&self) -> io::Result<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|elements| self.ty.bytes_for(elements))
            .ok_or_else(|| {
                invalid(format!(
                    "tensor {} shape {:?} is not whole {} blocks or overflows",
                    self.name, self.dims, self.ty
                ))
            })
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// Encode the header (magic through tensor infos, padded to `alignment`) of a GGUF v3 file.
/// Returns the header bytes; tensor `i`'s data must follow at `data_offsets[i]` relative to
/// the end of the header. `alignment` must be a power of two (it is not written: put a
/// `general.alignment` u32 in `metadata` when it is not the default 32).
pub fn encode_header(
    metadata: &[(String, MetaValue)],
    tensors: &[TensorSpec],
    alignment: u64,
) -> io::Result<(Vec<u8>, Vec<u64>)> {
    if !alignment.is_power_of_two() {
        return Err(invalid(format!(
            "alignment {alignment} is not a power of two"
        )));
    }
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        write_str(&mut out, key.as_bytes());
        out.extend_from_slice(&value.value_type().id().to_le_bytes());
        value.write_payload(&mut out);
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut next = 0u64;
    for t in tensors {
        write_str(&mut out, t.name.as_bytes());
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
        offsets.push(next);
        next = next
            .checked_add(t.bytes()?)
            .and_then(|end| end.checked_next_multiple_of(alignment))
            .ok_or_else(|| invalid(format!("tensor {} ends past u64::MAX", t.name)))?;
    }
    let padded = (out.len() as u64).next_multiple_of(alignment);
    out.resize(padded as usize, 0);
    Ok((out, offsets))
}

/// Write a whole GGUF v3 file. `fill(i, buf)` must append exactly tensor `i`'s bytes to `buf`
/// (which arrives empty); tensors are produced one at a time, in order.
pub fn write_gguf<W: Write>(
    out: &mut W,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorSpec],
    alignment: u64,
    mut fill: impl FnMut(usize, &mut Vec<u8>) -> io::Result<()>,
) -> io::Result<u64> {
    let (header, offsets) = encode_header(metadata, tensors, alignment)?;
    out.write_all(&header)?;
    let mut written = 0u64;
    let mut buf = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let pad = offsets[i] - written;
        out.write_all(&vec![0u8; pad as usize])?;
        written += pad;
        buf.clear();
        fill(i, &mut buf)?;
        if buf.len() as u64 != t.bytes()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "tensor {} produced {} bytes, expected {}",
                    t.name,
                    buf.len(),
                    t.bytes()?
                ),
            ));
        }
        out.write_all(&buf)?;
        written += buf.len() as u64;
    }
    Ok(header.len() as u64 + written)
}
