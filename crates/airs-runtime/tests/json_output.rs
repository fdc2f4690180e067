//! Generation constrained to one JSON object (`OutputFormat::JsonObject`, OpenAI's
//! `response_format: {"type": "json_object"}`), judged by an independent parser (serde_json):
//! every text the constraint lets through is JSON or a prefix of it, and a choice that ends by
//! itself is one whole object.
mod common;

use std::sync::Arc;

use airs_runtime::{
    FinishReason, GenerationParams, LoadedModel, OutputFormat, Prompt, Request, Scheduler,
    SchedulerConfig,
};
use serde_json::Value;

fn params(
    max_tokens: usize,
    format: OutputFormat,
    temperature: f32,
    seed: u64,
) -> GenerationParams {
    let mut p = GenerationParams {
        max_tokens,
        format,
        n: 4,
        ..GenerationParams::default()
    };
    p.sampler.temperature = temperature;
    p.sampler.top_k = 0;
    p.sampler.top_p = 1.0;
    p.sampler.min_p = 0.0;
    p.sampler.seed = seed;
    p
}

/// Whether `text` is a JSON object (`Some(true)`), a proper prefix of one (`Some(false)`), or
/// neither (`None`), as serde_json reads it.
fn json_state(text: &str) -> Option<bool> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => v.is_object().then_some(true),
        Err(e) if e.is_eof() && text.trim_start().starts_with('{') => Some(false),
        Err(_) => None,
    }
}

#[test]
fn a_story_model_constrained_to_json_writes_nothing_but_json() {
    let model = common::model();
    let mut s = Scheduler::new(model, SchedulerConfig::new(8 << 20), None).unwrap();
    for (temperature, seed) in [(0.0, 0), (1.0, 10), (1.0, 20), (1.5, 30), (2.0, 40)] {
        let prompt = Prompt::Text("Once upon a time".into());
        let free = s
            .serve(Request::generate(
                prompt.clone(),
                params(96, OutputFormat::Text, temperature, seed),
            ))
            .unwrap();
        // Left to itself the model tells a story, which is no JSON.
        assert!(
            free.choices.iter().all(|c| json_state(&c.text).is_none()),
            "{:?}",
            free.choices
        );
        let json = s
            .serve(Request::generate(
                prompt,
                params(96, OutputFormat::JsonObject, temperature, seed),
            ))
            .unwrap();
        assert_eq!(json.choices.len(), 4);
        for c in &json.choices {
            let state = json_state(&c.text);
            eprintln!("T {temperature} seed {seed}: {:?} {:?}", c.reason, c.text);
            match c.reason {
                FinishReason::EndOfGeneration => assert_eq!(state, Some(true), "{:?}", c.text),
                FinishReason::MaxTokens => assert_eq!(state, Some(false), "{:?}", c.text),
                other => panic!("{other:?}: {:?}", c.text),
            }
        }
    }
}

/// A request for JSON gets one whole object, also where the model would not write one unasked.
#[test]
fn qwen_asked_for_json_answers_with_one_object() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    let mut s = Scheduler::new(model, SchedulerConfig::new(64 << 20), None).unwrap();
    for (ask, unasked_is_json) in [
        (
            "Describe a fictional cat: its name, age and favourite food. Answer in JSON.",
            true,
        ),
        ("Write a haiku about rain.", false),
    ] {
        let prompt = Prompt::Chat(vec![airs_tokenizer::chat::ChatMessage::user(ask)]);
        for format in [OutputFormat::Text, OutputFormat::JsonObject] {
            let mut p = params(160, format.clone(), 0.0, 0);
            p.n = 1;
            let redraws = s.stats().constrained_redraws;
            let c = s.serve(Request::generate(prompt.clone(), p)).unwrap();
            let choice = &c.choices[0];
            eprintln!("{ask} {format:?}: {:?} {:?}", choice.reason, choice.text);
            if format == OutputFormat::Text {
                assert_eq!(json_state(&choice.text) == Some(true), unasked_is_json);
                assert_eq!(s.stats().constrained_redraws, redraws);
                continue;
            }
            // Where the model would not open with `{`, the first draw is redrawn (counted).
            if !unasked_is_json {
                assert!(s.stats().constrained_redraws > redraws);
            }
            assert_eq!(choice.reason, FinishReason::EndOfGeneration);
            let v: Value = serde_json::from_str(&choice.text).expect("one JSON object");
            assert!(!v.as_object().unwrap().is_empty(), "{v}");
        }
    }
}

/// A request with a JSON schema gets an object of that schema: its properties in order, the
/// required ones present, an enum's value, an integer.
#[test]
fn qwen_asked_for_a_schema_answers_with_an_instance_of_it() {
    use airs_runtime::json_schema::{Schema, SchemaValue};
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    let mut s = Scheduler::new(model, SchedulerConfig::new(64 << 20), None).unwrap();
    let schema: SchemaValue = serde_json::from_str(
        r#"{"type": "object", "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "food": {"enum": ["fish", "meat", "milk"]},
            "toys": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "indoor": {"type": "boolean"}},
          "required": ["name", "age", "food", "indoor"], "additionalProperties": false}"#,
    )
    .unwrap();
    let format = OutputFormat::JsonSchema(Arc::new(Schema::compile(&schema).unwrap()));
    for ask in ["Describe a fictional cat.", "Write a haiku about rain."] {
        let prompt = Prompt::Chat(vec![airs_tokenizer::chat::ChatMessage::user(ask)]);
        let mut p = params(200, format.clone(), 0.0, 0);
        p.n = 1;
        let c = s.serve(Request::generate(prompt, p)).unwrap();
        let choice = &c.choices[0];
        eprintln!("{ask}: {:?} {:?}", choice.reason, choice.text);
        assert_eq!(choice.reason, FinishReason::EndOfGeneration);
        let v: Value = serde_json::from_str(&choice.text).expect("one JSON object");
        let o = v.as_object().unwrap();
        assert!(
            o["name"].is_string() && o["age"].is_i64() && o["indoor"].is_boolean(),
            "{v}"
        );
        assert!(
            ["fish", "meat", "milk"].contains(&o["food"].as_str().unwrap()),
            "{v}"
        );
        assert!(
            o.get("toys")
                .is_none_or(|t| t.as_array().unwrap().len() <= 3),
            "{v}"
        );
        assert!(
            o.keys()
                .all(|k| ["name", "age", "food", "toys", "indoor"].contains(&k.as_str()))
        );
        let at = |k: &str| choice.text.find(&format!("\"{k}\"")).unwrap();
        assert!(at("name") < at("age") && at("age") < at("food") && at("food") < at("indoor"));
    }
}
