//! The GGUF reader: parses a whole file image (a mapped file or a model region) into borrowed
//! views — metadata keys and string values are `&[u8]`/`&str` slices of the image, arrays are
//! walked lazily, tensor data are sub-slices — so opening a 500 MB model copies nothing but the
//! small tables.
//!
//! Format: ggml's GGUF spec (docs/gguf.md in ggml): magic `GGUF`, u32 version (2 or 3), u64
//! tensor count, u64 metadata count, the metadata key/value pairs, the tensor-info table,
//! padding to `general.alignment` (default 32), then tensor data at aligned offsets.
//!
//! Hardening: every count is checked against the bytes left before anything is allocated
//! (a metadata entry takes at least 12 bytes, a tensor info at least 24), string lengths must
//! fit in the file, arrays may nest at most [`MAX_ARRAY_DEPTH`] deep, shapes are checked for
//! overflow and whole blocks, and tensor data must be aligned, inside the data section and
//! non-overlapping. Cost: O(file header) time, O(entries + tensors) memory.

use std::collections::HashMap;

use crate::GgmlType;
use crate::error::{GgufError, GgufErrorKind};

/// How deeply metadata arrays may nest (`[[[x]]]` is depth 3).
pub const MAX_ARRAY_DEPTH: u32 = 8;
/// The alignment used when a file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest alignment accepted (1 GiB), so padding arithmetic cannot overflow.
const MAX_ALIGNMENT: u64 = 1 << 30;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;
/// Most metadata entries or tensor infos reserved up front. A count that passed the
/// bytes-left check can still be ~file_len/13; reserving that many 48-byte entries before
/// reading one would turn a lying count in a large file into a multi-gigabyte allocation, so
/// the tables grow past this only as entries are actually read.
const MAX_PREALLOC: usize = 4096;

/// A metadata value type id from the GGUF spec.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The spec's id for this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of one fixed-size value (`None` for strings and arrays).
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Smallest encoding of one element (strings: 8-byte length; arrays: type + count).
    fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1) as u64,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value, borrowing strings and arrays from the file image.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Raw bytes of a string (GGUF strings are meant to be UTF-8; vocabularies may not be).
    String(&'a [u8]),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, when it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, when it is a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as UTF-8 text, when it is a valid UTF-8 string.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<Array<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }
}

/// A metadata array: its element type, length, and encoded bytes, already validated when the
/// file was opened, so iterating it cannot fail.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Array<'a> {
    elem: ValueType,
    len: u64,
    bytes: &'a [u8],
    depth: u32,
}

impl<'a> Array<'a> {
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> usize {
        // Validated at parse time: len ≤ bytes in the file, so it fits in usize.
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements, decoded one at a time from the file image.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            cursor: Cursor {
                bytes: self.bytes,
                pos: 0,
                base: 0,
            },
            elem: self.elem,
            remaining: self.len,
            depth: self.depth,
        }
    }

    /// The elements as raw string bytes, if this is a string array.
    pub fn strings(&self) -> Option<impl Iterator<Item = &'a [u8]> + 'a> {
        // A string array's iterator decodes every element as `ValueType::String`, which only
        // ever yields `Value::String`; `filter_map` keeps that fact out of the panic paths.
        (self.elem == ValueType::String).then(|| {
            self.iter().filter_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })
        })
    }

    /// The elements as f32, if this is an f32 array (zero-copy decode of little-endian bytes).
    pub fn f32s(&self) -> Option<impl Iterator<Item = f32> + 'a> {
        (self.elem == ValueType::F32).then(|| {
            self.bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        })
    }

    /// The elements as i64, if this is an array of integers.
    pub fn ints(&self) -> Option<impl Iterator<Item = i64> + 'a> {
        matches!(
            self.elem,
            ValueType::U8
                | ValueType::I8
                | ValueType::U16
                | ValueType::I16
                | ValueType::U32
                | ValueType::I32
                | ValueType::U64
                | ValueType::I64
        )
        .then(|| self.iter().map(|v| v.as_i64().unwrap_or(i64::MAX)))
    }
}

/// Iterator over an [`Array`]'s elements.
pub struct ArrayIter<'a> {
    cursor: Cursor<'a>,
    elem: ValueType,
    remaining: u64,
    depth: u32,
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Value<'a>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        // The array was fully validated when the file was opened.
        self.cursor.value(self.elem, self.depth).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining as usize;
        (n, Some(n))
    }
}

/// One tensor-info record, with its data located in the file image.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    /// Dimensions in ggml order: `dims[0]` (ne0) is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: u64,
}

impl TensorInfo<'_> {
    /// Total number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Length of one row (`ne0`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of the other dimensions).
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Absolute byte range of the data in the file.
    pub fn byte_range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.bytes
    }

    /// The `blk.N` layer this tensor belongs to, if its name says so.
    pub fn layer(&self) -> Option<u32> {
        let rest = self.name.strip_prefix("blk.")?;
        let (index, _) = rest.split_once('.')?;
        index.parse().ok()
    }
}

/// A parsed GGUF file, borrowing everything from its image.
#[derive(Debug)]
pub struct Gguf<'a> {
    image: &'a [u8],
    version: u32,
    metadata: Vec<(&'a str, Value<'a>)>,
    index: HashMap<&'a str, usize>,
    tensors: Vec<TensorInfo<'a>>,
    tensor_index: HashMap<&'a str, usize>,
    alignment: u64,
    data_offset: u64,
}

impl<'a> Gguf<'a> {
    /// Parse and validate a whole GGUF file image.
    pub fn parse(image: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        let mut c = Cursor {
            bytes: image,
            pos: 0,
            base: 0,
        };
        let magic = c.array::<4>("magic")?;
        if &magic != b"GGUF" {
            return Err(GgufError::at(GgufErrorKind::BadMagic(magic), 0));
        }
        let version = c.u32("version")?;
        match version {
            2 | 3 => {}
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(GgufError::at(GgufErrorKind::BigEndian, 4));
            }
            v => return Err(GgufError::at(GgufErrorKind::UnsupportedVersion(v), 4)),
        }
        let tensor_count = c.u64("tensor count")?;
        let kv_count = c.u64("metadata count")?;
        // A metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
        // at least 8 (name length) + 4 (dims) + 4 (type) + 8 (offset), since ggml allows zero
        // dimensions (a scalar).
        let kv_cap = c.cap_count("metadata", kv_count, 13)?.min(MAX_PREALLOC);
        let tensor_cap = c.cap_count("tensor", tensor_count, 24)?.min(MAX_PREALLOC);

        let mut metadata = Vec::with_capacity(kv_cap);
        let mut index = HashMap::with_capacity(kv_cap);
        for _ in 0..kv_count {
            let at = c.offset();
            let key = c.utf8_string("metadata key")?;
            let ty_id = c.u32("metadata value type")?;
            let ty = ValueType::from_id(ty_id).ok_or_else(|| {
                GgufError::at(GgufErrorKind::UnknownValueType(ty_id), c.offset() - 4)
            })?;
            let value = c.value(ty, 0)?;
            if index.insert(key, metadata.len()).is_some() {
                return Err(GgufError::at(
                    GgufErrorKind::DuplicateKey(key.to_owned()),
                    at,
                ));
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&i| metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) => u64::from(a),
            Some(v) => {
                return Err(GgufError::new(GgufErrorKind::WrongType {
                    key: "general.alignment".into(),
                    expected: if v.as_u64().is_some() {
                        "a u32"
                    } else {
                        "an integer"
                    },
                }));
            }
        };
        if alignment == 0 || !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
            return Err(GgufError::new(GgufErrorKind::BadAlignment(alignment)));
        }

        let mut tensors = Vec::with_capacity(tensor_cap);
        let mut tensor_index = HashMap::with_capacity(tensor_cap);
        for _ in 0..tensor_count {
            let at = c.offset();
            let name = c.utf8_string("tensor name")?;
            let n_dims = c.u32("tensor dimension count")?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError::at(
                    GgufErrorKind::TooManyDims {
                        tensor: name.into(),
                        dims: n_dims,
                    },
                    at,
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dimension")?);
            }
            let ty_id = c.u32("tensor type")?;
            let offset = c.u64("tensor offset")?;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
                GgufError::at(
                    GgufErrorKind::UnknownTensorType {
                        tensor: name.into(),
                        id: ty_id,
                    },
                    at,
                )
            })?;
            let bad_shape = || {
                GgufError::at(
                    GgufErrorKind::BadShape {
                        tensor: name.into(),
                    },
                    at,
                )
            };
            if dims.contains(&0) {
                return Err(bad_shape());
            }
            let elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(bad_shape)?;
            if dims.first().copied().unwrap_or(1) % ty.block_len() as u64 != 0 {
                return Err(bad_shape());
            }
            let bytes = ty.bytes_for(elements).ok_or_else(bad_shape)?;
            if offset % alignment != 0 {
                return Err(GgufError::at(
                    GgufErrorKind::MisalignedTensor {
                        tensor: name.into(),
                        offset,
                    },
                    at,
                ));
            }
            if tensor_index.insert(name, tensors.len()).is_some() {
                return Err(GgufError::at(
                    GgufErrorKind::DuplicateTensor(name.into()),
                    at,
                ));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                bytes,
            });
        }

        let file_len = image.len() as u64;
        let data_offset = c.offset().next_multiple_of(alignment);
        for t in &mut tensors {
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.bytes));
            match end {
                Some(end) if end <= file_len => t.offset += data_offset,
                _ => {
                    return Err(GgufError::new(GgufErrorKind::TensorOutOfBounds {
                        tensor: t.name.into(),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    }));
                }
            }
        }
        let mut by_offset: Vec<usize> = (0..tensors.len()).collect();
        by_offset.sort_by_key(|&i| (tensors[i].offset, tensors[i].bytes));
        for pair in by_offset.windows(2) {
            let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
            if a.offset + a.bytes > b.offset {
                return Err(GgufError::new(GgufErrorKind::OverlappingTensors {
                    first: a.name.into(),
                    second: b.name.into(),
                }));
            }
        }

        Ok(Gguf {
            image,
            version,
            metadata,
            index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The whole file image.
    pub fn image(&self) -> &'a [u8] {
        self.image
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The file's data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> &[(&'a str, Value<'a>)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.index.get(key).map(|&i| self.metadata[i].1)
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&'a str, GgufError> {
        self.typed(key, "a UTF-8 string", |v| v.as_str())
    }

    /// A required non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.typed(key, "a non-negative integer", |v| v.as_u64())
    }

    /// A required float value.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.typed(key, "a float", |v| v.as_f64())
    }

    /// A required array value.
    pub fn get_array(&self, key: &str) -> Result<Array<'a>, GgufError> {
        self.typed(key, "an array", |v| v.as_array())
    }

    /// An optional value of a given shape: `Ok(None)` when absent, an error when mistyped.
    pub fn opt<T>(
        &self,
        key: &str,
        expected: &'static str,
        f: impl Fn(&Value<'a>) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(&v).map(Some).ok_or_else(|| {
                GgufError::new(GgufErrorKind::WrongType {
                    key: key.into(),
                    expected,
                })
            }),
        }
    }

    fn typed<T>(
        &self,
        key: &str,
        expected: &'static str,
        f: impl Fn(&Value<'a>) -> Option<T>,
    ) -> Result<T, GgufError> {
        self.opt(key, expected, f)?
            .ok_or_else(|| GgufError::new(GgufErrorKind::MissingKey(key.into())))
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo<'a>] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo<'a>> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's data, borrowed from the image.
    ///
    /// # Panics
    /// If `info` is not one of this file's [`Gguf::tensors`] (or was modified) and its range
    /// lies outside the image. Infos read from the file always lie inside it.
    pub fn tensor_data(&self, info: &TensorInfo<'_>) -> &'a [u8] {
        // Validated at parse time: the range lies inside the image.
        &self.image[info.offset as usize..(info.offset + info.bytes) as usize]
    }
}

/// A bounds-checked little-endian reader over the image.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Offset of `bytes[0]` in the file, for error messages.
    base: u64,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, len: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if len > self.remaining() {
            return Err(GgufError::at(
                GgufErrorKind::Truncated { what },
                self.offset(),
            ));
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Check that `count` items of at least `min_size` bytes each can fit in what is left, and
    /// return it as a capacity to reserve.
    fn cap_count(&self, what: &'static str, count: u64, min_size: u64) -> Result<usize, GgufError> {
        if count > self.remaining() / min_size {
            return Err(GgufError::at(
                GgufErrorKind::CountTooLarge { what, count },
                self.offset(),
            ));
        }
        Ok(count as usize)
    }

    fn string(&mut self) -> Result<&'a [u8], GgufError> {
        let at = self.offset();
        let len = self.u64("string length")?;
        if len > self.remaining() {
            return Err(GgufError::at(GgufErrorKind::StringTooLong { len }, at));
        }
        self.take(len, "string")
    }

    fn utf8_string(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let at = self.offset();
        let bytes = self.string()?;
        std::str::from_utf8(bytes)
            .map_err(|_| GgufError::at(GgufErrorKind::InvalidUtf8 { what }, at))
    }

    fn value(&mut self, ty: ValueType, depth: u32) -> Result<Value<'a>, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>("u8")?[0]),
            ValueType::I8 => Value::I8(self.array::<1>("i8")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16")?)),
            ValueType::U32 => Value::U32(self.u32("u32")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32")?)),
            // Any non-zero byte is true, as in ggml.
            ValueType::Bool => Value::Bool(self.array::<1>("bool")?[0] != 0),
            ValueType::String => Value::String(self.string()?),
            ValueType::U64 => Value::U64(self.u64("u64")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::at(GgufErrorKind::NestingTooDeep, self.offset()));
                }
                let elem_id = self.u32("array element type")?;
                let elem = ValueType::from_id(elem_id).ok_or_else(|| {
                    GgufError::at(GgufErrorKind::UnknownValueType(elem_id), self.offset() - 4)
                })?;
                let len = self.u64("array length")?;
                self.cap_count("array element", len, elem.min_size())?;
                let start = self.pos;
                match elem.fixed_size() {
                    Some(size) => {
                        self.take(len * size as u64, "array")?;
                    }
                    None => {
                        for _ in 0..len {
                            self.value(elem, depth + 1)?;
                        }
                    }
                }
                Value::Array(Array {
                    elem,
                    len,
                    bytes: &self.bytes[start..self.pos],
                    depth: depth + 1,
                })
            }
        })
    }
}
