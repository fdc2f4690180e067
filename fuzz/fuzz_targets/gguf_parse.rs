//! Fuzz target: `Gguf::parse` on arbitrary bytes must return a typed error or a file whose
//! every view is usable: all metadata (arrays walked recursively), all tensor data, the layer
//! map and the hyperparameters. Nothing may panic, and the reader's documented invariants
//! (checked with `assert!` below) must hold for anything it accepts.
#![no_main]

use airs_gguf::{Array, Gguf, LayerMap, MAX_ARRAY_DEPTH, ModelConfig, Value, ValueType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Gguf::parse(data) {
        Ok(g) => exercise(data, &g),
        Err(e) => {
            // Error rendering must not panic either.
            let _ = e.to_string();
            if let Some(offset) = e.offset() {
                assert!(
                    offset <= data.len() as u64,
                    "error offset past the end: {e}"
                );
            }
        }
    }
});

fn exercise(data: &[u8], g: &Gguf<'_>) {
    assert!(matches!(g.version(), 2 | 3));
    assert!(g.alignment().is_power_of_two());
    assert_eq!(g.data_offset() % g.alignment(), 0);
    for (key, value) in g.metadata() {
        // Every key is findable and maps back to its own value.
        assert_eq!(g.get(key).map(|v| v.value_type()), Some(value.value_type()));
        walk(value, 0);
        let _ = g.get_str(key);
        let _ = g.get_u64(key);
        let _ = g.get_f64(key);
        let _ = g.get_array(key);
    }
    let image = data.as_ptr_range();
    let mut end = g.data_offset();
    let mut ranges = Vec::new();
    for t in g.tensors() {
        assert!(std::ptr::eq(g.tensor(t.name).unwrap(), t));
        let bytes = g.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.bytes);
        assert!(bytes.is_empty() || image.contains(&bytes.as_ptr()));
        assert_eq!((t.offset - g.data_offset()) % g.alignment(), 0);
        assert!(t.offset >= g.data_offset());
        let _ = (t.elements(), t.row_len(), t.rows(), t.layer(), t.ty.name());
        assert_eq!(t.ty.bytes_for(t.elements()), Some(t.bytes));
        ranges.push(t.byte_range());
        end = end.max(t.byte_range().end);
    }
    assert!(end <= data.len() as u64 || g.tensors().is_empty());
    ranges.sort_by_key(|r| r.start);
    for w in ranges.windows(2) {
        assert!(w[0].end <= w[1].start, "overlapping tensors accepted");
    }
    let map = LayerMap::new(g);
    let mapped: usize = map.layers.iter().map(|l| l.tensors.len()).sum::<usize>() + map.other.len();
    assert_eq!(mapped, g.tensors().len());
    for l in &map.layers {
        assert!(l.bytes <= l.byte_range.end - l.byte_range.start);
    }
    if let Ok(cfg) = ModelConfig::from_gguf(g) {
        assert!(cfg.heads > 0 && cfg.kv_heads > 0 && cfg.head_dim > 0);
        assert_eq!(cfg.embedding_len % cfg.heads, 0);
        assert_eq!(cfg.heads % cfg.kv_heads, 0);
        assert!(cfg.rope_dims <= cfg.head_dim);
        assert!(cfg.context_len > 0 && cfg.rope_attn_factor > 0.0);
        let _ = (cfg.kv_len(), cfg.q_len());
        for l in 0..cfg.layers.min(64) {
            let window = cfg.layer_window(l);
            assert!(window.is_none_or(|w| w > 0));
            assert!(cfg.layer_rope_base(l) > 0.0);
        }
    }
}

fn walk(value: &Value<'_>, depth: u32) {
    let _ = (
        value.as_u64(),
        value.as_i64(),
        value.as_f64(),
        value.as_bool(),
        value.as_str(),
    );
    if let Some(a) = value.as_array() {
        assert!(
            depth < MAX_ARRAY_DEPTH,
            "array nested deeper than the limit"
        );
        walk_array(&a, depth + 1);
    }
}

fn walk_array(a: &Array<'_>, depth: u32) {
    let mut n = 0;
    for v in a.iter() {
        assert_eq!(v.value_type(), a.elem_type());
        walk(&v, depth);
        n += 1;
    }
    assert_eq!(n, a.len(), "array yields fewer elements than its length");
    assert_eq!(a.is_empty(), n == 0);
    if let Some(s) = a.strings() {
        assert_eq!(s.count(), a.len());
    }
    if let Some(f) = a.f32s() {
        assert_eq!(f.count(), a.len());
    }
    if let Some(i) = a.ints() {
        assert_eq!(i.count(), a.len());
    }
    assert_eq!(a.strings().is_some(), a.elem_type() == ValueType::String);
}
