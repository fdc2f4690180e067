//! Request bodies of `airs serve`, as a client could send them: every body parses into a typed
//! request or a 400 `ApiError`, and every accepted chat request's conversation renders through
//! chat templates (the embedded model's fallback, and the real Qwen2 and Phi-3 templates of the
//! repository's vocabulary files) and tokenizes, whatever the message contents; a
//! `response_format` schema compiles or is refused, and the JSON checkers read every message
//! byte by byte against it; `tools` are checked, rendered through the templates (Qwen2.5's
//! own tool format among them) and every message is read as a reply that may call them — never a panic and never an unbounded allocation. The first byte
//! picks the endpoint.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use airs_memory::ModelPool;
use airs_runtime::json_syntax::JsonSyntax;
use airs_runtime::schema_syntax::SchemaSyntax;
use airs_runtime::tools::{ToolCallParser, parse_reply};
use airs_runtime::{EMBEDDED_MODEL, EMBEDDED_MODEL_NAME, LoadedModel, OutputFormat, Prompt, Task};
use airs_server::openai;
use airs_tokenizer::Tokenizer;
use airs_tokenizer::chat::ChatTemplate;
use libfuzzer_sys::fuzz_target;

fn model() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| {
        LoadedModel::embedded(
            EMBEDDED_MODEL,
            EMBEDDED_MODEL_NAME,
            &ModelPool::new(u64::MAX),
            1,
        )
        .expect("the embedded model")
    })
}

/// Tokenizers and chat templates of the vocabulary files that have one.
fn templates() -> &'static [(Tokenizer, ChatTemplate)] {
    static T: OnceLock<Vec<(Tokenizer, ChatTemplate)>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizer");
        let mut out: Vec<(Tokenizer, ChatTemplate)> =
            ["ggml-vocab-qwen2.gguf", "ggml-vocab-phi-3.gguf"]
                .iter()
                .map(|f| {
                    let bytes: Arc<Vec<u8>> =
                        Arc::new(std::fs::read(dir.join(f)).expect("vocab file"));
                    let g = airs_gguf::Gguf::parse(&bytes).expect("vocab file parses");
                    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
                    let t = ChatTemplate::from_gguf(&g, &tok).expect("template");
                    (tok, t)
                })
                .collect();
        // Qwen2.5's template, which renders tools, calls and results itself.
        let qwen25 = std::fs::read_to_string(dir.join("../templates/qwen2.5-instruct.jinja"))
            .expect("template file");
        let bytes = std::fs::read(dir.join("ggml-vocab-qwen2.gguf")).expect("vocab file");
        let g = airs_gguf::Gguf::parse(&bytes).expect("vocab file parses");
        let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
        out.push((
            tok,
            ChatTemplate::new(qwen25, "", "<|im_end|>").expect("template"),
        ));
        out
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
            let (messages, tools) = match &request.prompt {
                Prompt::Chat(messages) => (messages, None),
                Prompt::ChatWithTools { messages, tools } => (messages, Some(tools)),
                _ => return,
            };
            {
                let _ = m.encode_chat_with_tools(messages, tools.map(|t| t.chat()));
                for (tok, t) in templates() {
                    let _ = t.encode_with_tools(tok, messages, tools.map(|t| t.chat()), true);
                }
                // Each message read as a reply that may hold calls, whole and in two pieces.
                if let Some(tools) = tools {
                    for msg in messages {
                        let _ = parse_reply(tools, &msg.content);
                        let cut = (0..=msg.content.len() / 2)
                            .rev()
                            .find(|&i| msg.content.is_char_boundary(i))
                            .unwrap_or(0);
                        let mut p = ToolCallParser::new(Arc::clone(tools));
                        let _ = p.push(&msg.content[..cut]);
                        let _ = p.push(&msg.content[cut..]);
                        let _ = p.finish();
                    }
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
