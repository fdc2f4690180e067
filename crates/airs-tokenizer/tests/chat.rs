//! Chat templates: ChatML rendering, templates that fail to parse or render, the fallbacks
//! for models without a template, and BOS handling.

use std::path::PathBuf;

use airs_gguf::Gguf;
use airs_tokenizer::chat::{
    CHATML_TEMPLATE, ChatMessage, ChatTemplate, ChatTemplateErrorKind, TemplateSource,
};
use airs_tokenizer::{TokenId, Tokenizer};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn with_gguf<T>(path: &str, f: impl FnOnce(&Gguf<'_>, &Tokenizer) -> T) -> T {
    let bytes = std::fs::read(repo(path)).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    f(&gguf, &tokenizer)
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("Hi!"),
        ChatMessage::assistant("Hello."),
        ChatMessage::user("2+2?"),
    ]
}

#[test]
fn chatml_renders_every_turn_and_the_generation_prompt() {
    let template = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
    let expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
                    <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n";
    assert_eq!(template.render(&conversation(), false).unwrap(), expected);
    assert_eq!(
        template.render(&conversation(), true).unwrap(),
        format!("{expected}<|im_start|>assistant\n")
    );
}

#[test]
fn templates_that_do_not_parse_are_syntax_errors() {
    for source in [
        "{% for message in messages %}",
        "{{ messages[0]['role'] ",
        "{% bogus %}",
    ] {
        let err = ChatTemplate::new(source, "", "").unwrap_err();
        assert!(
            matches!(err.kind(), ChatTemplateErrorKind::Syntax(_)),
            "{source}: {err}"
        );
    }
}

#[test]
fn raise_exception_and_runtime_errors_are_render_errors() {
    let template = ChatTemplate::new(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user turn') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    let err = template.render(&conversation(), true).unwrap_err();
    match err.kind() {
        ChatTemplateErrorKind::Render(message) => {
            assert!(
                message.contains("Conversation must start with a user turn"),
                "{message}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        template.render(&[ChatMessage::user("x")], true).unwrap(),
        "ok"
    );

    let template =
        ChatTemplate::new("{{ messages | no_such_filter }}", "", "").unwrap_or_else(|e| {
            // minijinja may resolve unknown filters at parse time instead; either is an error.
            assert!(matches!(e.kind(), ChatTemplateErrorKind::Syntax(_)));
            ChatTemplate::new("{{ 1 + 'a' }}", "", "").unwrap()
        });
    assert!(matches!(
        template.render(&conversation(), true).unwrap_err().kind(),
        ChatTemplateErrorKind::Render(_)
    ));
}

#[test]
fn hugging_face_conveniences_work() {
    // Python string methods, tojson, namespace, loop variables, strftime_now, and the
    // trim_blocks/lstrip_blocks whitespace rules of apply_chat_template.
    let source = "{% set ns = namespace(n=0) %}\n\
                  {% for m in messages %}\n\
                      {% set ns.n = ns.n + 1 %}\n\
                      {{ m.content.strip().upper() }}{% if not loop.last %},{% endif %}\n\
                  {% endfor %}\n\
                  {{ ns.n }} {{ messages[0] | tojson }} {{ strftime_now('%Y') | length }}";
    let template = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let text = template
        .render(
            &[ChatMessage::system("  a "), ChatMessage::user("b")],
            false,
        )
        .unwrap();
    // tojson as transformers' (Python's json.dumps): ", " and ": " between members.
    assert_eq!(text, "A,B2 {\"role\": \"system\", \"content\": \"  a \"} 4");
}

#[test]
fn models_without_a_template_fall_back_by_vocabulary() {
    // stories260K has no template and no chat tokens: a plain transcript.
    with_gguf("models/stories260K.gguf", |gguf, tokenizer| {
        let template = ChatTemplate::from_gguf(gguf, tokenizer).unwrap();
        assert_eq!(template.source(), TemplateSource::FallbackPlain);
        assert_eq!(
            template.render(&conversation(), true).unwrap(),
            "System: Be brief.\nUser: Hi!\nAssistant: Hello.\nUser: 2+2?\nAssistant:"
        );
        let ids = template
            .encode(tokenizer, &[ChatMessage::user("Hi")], true)
            .unwrap();
        assert_eq!(ids[0], TokenId(1), "BOS first");
        assert_eq!(tokenizer.decode(&ids), "User: Hi\nAssistant:");
    });
    // The Qwen2 vocabulary has <|im_start|>/<|im_end|>: ChatML.
    with_gguf(
        "testdata/tokenizer/ggml-vocab-qwen2.gguf",
        |_, tokenizer| {
            let template = ChatTemplate::fallback_for(tokenizer);
            assert_eq!(template.source(), TemplateSource::FallbackChatMl);
            let ids = template
                .encode(tokenizer, &[ChatMessage::user("Hi")], true)
                .unwrap();
            let pieces: Vec<&str> = ids
                .iter()
                .map(|&id| tokenizer.token_piece(id).unwrap())
                .collect();
            assert_eq!(
                pieces,
                [
                    "<|im_start|>",
                    "user",
                    "Ċ",
                    "Hi",
                    "<|im_end|>",
                    "Ċ",
                    "<|im_start|>",
                    "assistant",
                    "Ċ"
                ]
            );
        },
    );
}

#[test]
fn a_bos_written_by_the_template_is_not_doubled() {
    // Phi-3's template starts with {{ bos_token }} and the model also adds BOS.
    with_gguf(
        "testdata/tokenizer/ggml-vocab-phi-3.gguf",
        |gguf, tokenizer| {
            let template = ChatTemplate::from_gguf(gguf, tokenizer).unwrap();
            assert_eq!(template.source(), TemplateSource::Model);
            let messages = [ChatMessage::user("Hello")];
            let text = template.render(&messages, true).unwrap();
            assert_eq!(text, "<s><|user|>\nHello<|end|>\n<|assistant|>\n");
            let ids = template.encode(tokenizer, &messages, true).unwrap();
            let bos = tokenizer.bos_id().unwrap();
            assert_eq!(ids[0], bos);
            assert_eq!(ids.iter().filter(|&&id| id == bos).count(), 1, "{ids:?}");
            let end = tokenizer.token_id("<|end|>").unwrap();
            assert!(ids.contains(&end));
            assert!(tokenizer.is_end_of_generation(end));
        },
    );
}

#[test]
fn a_non_string_template_is_an_error() {
    use airs_gguf::writer::{MetaValue, encode_header};
    let meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            MetaValue::String("llama".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_owned(),
            MetaValue::strings(["<unk>", "<s>", "</s>", "a"]),
        ),
        ("tokenizer.chat_template".to_owned(), MetaValue::U32(7)),
    ];
    let (bytes, _) = encode_header(&meta, &[], 32).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    let err = ChatTemplate::from_gguf(&gguf, &tokenizer).unwrap_err();
    assert_eq!(err.kind(), &ChatTemplateErrorKind::NotAString);
}

/// The Gemma fallback: turns as `<start_of_turn>role`, the assistant's role written `model`,
/// system messages prefixed to the next user turn (Gemma has no system role), and the model's
/// turn opened for generation.
#[test]
fn the_gemma_fallback_renders_gemma_turns() {
    let template =
        ChatTemplate::new(airs_tokenizer::chat::GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
    assert_eq!(
        template.render(&conversation(), true).unwrap(),
        "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n\
         <start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\n2+2?<end_of_turn>\n\
         <start_of_turn>model\n"
    );
}
