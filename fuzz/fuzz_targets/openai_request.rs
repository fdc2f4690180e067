//! Request bodies of `airs serve`, as a client could send them: every body parses into a typed
//! request or a 400 `ApiError`, and every accepted chat request's conversation renders through
//! chat templates (the embedded model's fallback, and the real Qwen2 and Phi-3 templates of the
//! repository's vocabulary files) and tokenizes, whatever the message contents; a
//! `response_format` schema compiles or is refused, and the JSON checkers read every message
//! byte by byte against it — never a panic and never an unbounded allocation. The first byte
//! picks the endpoint.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use airs_memory::ModelPool;
use airs_runtime::json_syntax::JsonSyntax;
use airs_runtime::schema_syntax::SchemaSyntax;
use airs_runtime::{EMBEDDED_MODEL, EMBEDDED_MODEL_NAME, LoadedModel, OutputFormat, Prompt, Task};
use airs_server::openai;
use airs_tokenizer::Tokenizer;
use airs_tokenizer::chat::ChatTemplate;
use libfuzzer_sys::fuzz_target;

fn model() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| {
        LoadedModel::embedded(EMBEDDED_MODEL, EMBEDDED_MODEL_NAME, &ModelPool::new(u64::MAX), 1)
            .expect("the embedded model")
    })
}

/// Tokenizers and chat templates of the vocabulary files that have one.
fn templates() -> &'static [(Tokenizer, ChatTemplate)] {
    static T: OnceLock<Vec<(Tokenizer, ChatTemplate)>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizer");
        ["ggml-vocab-qwen2.gguf", "ggml-vocab-phi-3.gguf"]
            .iter()
            .map(|f| {
                let bytes: Arc<Vec<u8>> = Arc::new(std::fs::read(dir.join(f)).expect("vocab file"));
                let g = airs_gguf::Gguf::parse(&bytes).expect("vocab file parses");
                let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
                let t = ChatTemplate::from_gguf(&g, &tok).expect("template");
                (tok, t)
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let m = model();
    match kind % 5 {
        0 => {
            let Ok(req) = openai::parse::<openai::ChatRequest>(body, "chat") else {
                return;
            };
            let Ok((request, _)) = openai::chat_request(&req, m) else {
                return;
            };
            if let Prompt::Chat(messages) = &request.prompt {
                let _ = m.encode_chat(messages);
                for (tok, t) in templates() {
                    let _ = t.encode(tok, messages, true);
                }
                // The JSON checkers over hostile text: the messages, byte by byte, against the
                // request's own schema (compiled from the body) and as any JSON object.
                if let Task::Generate(params) = &request.task {
                    for msg in messages {
                        let bytes = msg.content.as_bytes();
                        if let OutputFormat::JsonSchema(schema) = &params.format {
                            let mut s = SchemaSyntax::new(schema);
                            for &b in bytes {
                                let mut next = s;
                                if !next.push(schema, b) {
                                    break;
                                }
                                s = next;
                            }
                        }
                        let _ = JsonSyntax::new().after(bytes);
                    }
                }
            }
        }
        1 => {
            if let Ok(req) = openai::parse::<openai::CompletionRequest>(body, "completion")
                && let Ok((request, _)) = openai::completion_request(&req, m)
                && let Prompt::Text(t) = &request.prompt
            {
                let _ = m.encode_prompt(t);
            }
        }
        2 => {
            if let Ok(req) = openai::parse::<openai::EmbeddingRequest>(body, "embedding") {
                let _ = openai::embedding_requests(&req);
            }
        }
        3 => {
            let _ = openai::parse::<openai::TokenizeRequest>(body, "tokenize");
        }
        _ => {
            let _ = openai::parse::<openai::DetokenizeRequest>(body, "detokenize");
        }
    }
});
