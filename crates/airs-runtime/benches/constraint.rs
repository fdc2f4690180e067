//! The JSON constraint's cost per draw over Qwen2.5's 151,936-token vocabulary, single thread,
//! in µs: the check of a drawn token (every constrained draw pays it), and the mask a redraw
//! needs when the drawn token cannot continue the JSON, after texts that leave few tokens
//! possible (after `{`, `:` or a number) and many (inside a string), for any object
//! (`json_object`), for a schema (`json_schema`, whose checker's state is larger to copy) and
//! for a call forced among two functions (`tool_choice: "required"`, a tagged union); and
//! building the table of token bytes (once per model).
//!
//! `cargo bench -p airs-runtime --bench constraint` (the model from `AIRS_QWEN_MODEL`, or
//! installed by `scripts/install-qwen.sh` as the tests do).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airs_runtime::LoadedModel;
use airs_runtime::constraint::{JsonConstraint, VocabBytes};
use airs_runtime::json_schema::{Schema, SchemaValue};
use airs_runtime::tools::{ToolChoice, Tools};

/// The best time of `f` in µs over about 300 ms.
fn best_us(mut f: impl FnMut()) -> f64 {
    f();
    let (start, mut best, mut runs) = (Instant::now(), f64::INFINITY, 0);
    while start.elapsed() < Duration::from_millis(300) || runs < 5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best * 1e6
}

fn main() {
    let model = LoadedModel::open(&airs_testdata::qwen_path(), 1).expect("the Qwen2.5 model");
    let vocab_len = model.tokenizer.vocab_len();
    println!("{:<44} {:>10}", "case (Qwen2.5, single thread)", "µs");
    let build = best_us(|| {
        black_box(VocabBytes::new(&model.tokenizer));
    });
    println!(
        "{:<44} {:>10.1}",
        "build the token bytes (once per model)", build
    );
    let vocab = Arc::new(VocabBytes::new(&model.tokenizer));
    println!(
        "({} of {vocab_len} tokens continue any string unchecked; the table: {} bytes)",
        vocab.string_tokens(),
        vocab.heap_bytes()
    );
    // Logits of no particular shape: the mask's cost does not depend on them.
    let logits: Vec<f32> = (0..vocab_len).map(|i| (i % 97) as f32 * 0.1).collect();
    let schema: SchemaValue = serde_json::from_str(
        r#"{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age"]}"#,
    )
    .expect("a schema");
    let schema = Arc::new(Schema::compile(&schema).expect("it compiles"));
    // A call forced among two functions (`tool_choice: "required"`): a tagged union.
    let tools: Vec<SchemaValue> = serde_json::from_str(
        r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {
              "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
              "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}}}]"#,
    )
    .expect("tools");
    let call = Arc::new(
        Tools::from_openai(&tools)
            .expect("tools")
            .forced_call_schema(&ToolChoice::Required)
            .expect("a schema")
            .expect("forced"),
    );
    for (kind, schema, label, text) in [
        ("object", None, "after {", "{"),
        ("object", None, "after {\"name\":", "{\"name\":"),
        ("object", None, "after {\"age\": 3", "{\"age\": 3"),
        ("object", None, "inside a string", "{\"name\": \"Whisk"),
        ("schema", Some(&schema), "after {", "{"),
        ("schema", Some(&schema), "after {\"name\":", "{\"name\":"),
        (
            "schema",
            Some(&schema),
            "inside a string",
            "{\"name\": \"Whisk",
        ),
        ("call", Some(&call), "inside the name", "{\"name\": \"get_"),
        (
            "call",
            Some(&call),
            "arguments of the name",
            "{\"name\": \"get_weather\", \"arguments\": {",
        ),
        (
            "call",
            Some(&call),
            "inside an argument",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        ),
    ] {
        let label = format!("{kind} {label}");
        let mut constraint = JsonConstraint::new(Arc::clone(&vocab), schema.cloned());
        for id in model.encode_prompt(text).into_iter() {
            if model.tokenizer.bos_id().map(u32::from) != Some(id) {
                assert!(constraint.allows(id), "{text:?}");
                constraint.accept(id);
            }
        }
        let allowed = constraint
            .mask(&logits)
            .map_or(0, |m| m.iter().filter(|l| l.is_finite()).count());
        let mask = best_us(|| {
            black_box(constraint.mask(black_box(&logits)));
        });
        let check = best_us(|| {
            for id in (0..vocab_len as u32).step_by(1009) {
                black_box(constraint.allows(black_box(id)));
            }
        }) / (vocab_len / 1009 + 1) as f64;
        println!(
            "{:<44} {:>10.1}",
            format!("mask {label} ({allowed} allowed)"),
            mask
        );
        println!(
            "{:<44} {:>10.3}",
            format!("check a drawn token {label}"),
            check
        );
    }
}
