//! Conversations that call tools: a template with its own tool format (Qwen2.5's) renders the
//! tools, calls and results as `transformers` does; a template without one gets the same
//! instructions in its system message and the calls and results as text.

use std::path::PathBuf;

use airs_tokenizer::chat::{
    CHATML_TEMPLATE, ChatMessage, ChatTemplate, ChatToolCall, ChatTools, GEMMA_TEMPLATE,
};

fn qwen_template() -> ChatTemplate {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/templates/qwen2.5-instruct.jinja");
    ChatTemplate::new(std::fs::read_to_string(path).unwrap(), "", "<|im_end|>").unwrap()
}

/// Members deliberately out of alphabetical order, and text that minijinja's own `tojson`
/// would escape for HTML.
const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
    "description": "Weather <now> & \"here\"", "parameters": {"type": "object",
    "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "city": {"type": "string"}},
    "required": ["city"]}}}]"#;

const TOOL_JSON: &str = r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & \"here\"", "parameters": {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "city": {"type": "string"}}, "required": ["city"]}}}"#;

fn conversation() -> Vec<ChatMessage> {
    let mut call = ChatMessage::assistant("");
    call.tool_calls.push(ChatToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: r#"{"unit":"celsius","city":"Paris"}"#.into(),
    });
    let mut result = ChatMessage::new("tool", "22 degrees");
    result.tool_call_id = Some("call_1".into());
    let mut second = ChatMessage::new("tool", "sunny");
    second.tool_call_id = Some("call_1".into());
    vec![
        ChatMessage::user("What's the weather in Paris?"),
        call,
        result,
        second,
    ]
}

/// [`conversation`] with [`TOOLS`] offered, as Qwen2.5's template renders it after the system
/// message `system` (and as airs writes it for a ChatML model without a tool format).
fn with_tools_and_calls(system: &str) -> String {
    format!(
        "<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more functions to \
         assist with the user query.\n\nYou are provided with function signatures within \
         <tools></tools> XML tags:\n<tools>\n{TOOL_JSON}\n</tools>\n\nFor each function call, \
         return a json object with function name and arguments within <tool_call></tool_call> \
         XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": \
         {{\"unit\": \"celsius\", \"city\": \"Paris\"}}}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n22 degrees\n</tool_response>\n<tool_response>\n\
         sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
}

#[test]
fn qwen_renders_tools_calls_and_results_as_transformers_does() {
    let template = qwen_template();
    assert!(template.renders_tools());
    let tools = ChatTools::from_json(TOOLS).unwrap();
    let text = template
        .render_with_tools(&conversation(), Some(&tools), true)
        .unwrap();
    let expected = with_tools_and_calls(
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    );
    assert_eq!(text, expected);
    // Without tools the template is the plain conversation.
    let plain = template.render(&[ChatMessage::user("Hi")], true).unwrap();
    assert_eq!(
        plain,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn a_template_without_a_tool_format_gets_the_instructions_and_text_calls() {
    let template = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
    assert!(!template.renders_tools());
    let tools = ChatTools::from_json(TOOLS).unwrap();
    let mut messages = vec![ChatMessage::system("Be brief.")];
    messages.extend(conversation());
    let text = template
        .render_with_tools(&messages, Some(&tools), true)
        .unwrap();
    // Word for word what Qwen2.5's own template writes, after this system message.
    let expected = with_tools_and_calls("Be brief.");
    assert_eq!(text, expected);
    // No system message: one is added for the instructions.
    let text = template
        .render_with_tools(&conversation()[..1], Some(&tools), true)
        .unwrap();
    assert!(text.starts_with("<|im_start|>system\n# Tools\n"), "{text}");
    // A conversation with calls but no tools offered now still renders its calls as text.
    let text = template.render(&conversation(), true).unwrap();
    assert!(!text.contains("# Tools"), "{text}");
    assert!(text.contains("<tool_response>\n22 degrees"), "{text}");
}

#[test]
fn gemma_turns_alternate_with_tool_results_as_one_user_turn() {
    // Gemma's template has no system role (the system text joins the first user turn) and
    // Gemma's own raises unless user and model turns alternate: consecutive results must be
    // one user turn.
    let template = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
    let tools = ChatTools::from_json(TOOLS).unwrap();
    let text = template
        .render_with_tools(&conversation(), Some(&tools), true)
        .unwrap();
    assert!(text.starts_with("<start_of_turn>user\n# Tools\n"), "{text}");
    assert_eq!(text.matches("<start_of_turn>user").count(), 2, "{text}");
    assert_eq!(text.matches("<start_of_turn>model").count(), 2, "{text}");
    assert!(text.ends_with(
        "<start_of_turn>user\n<tool_response>\n22 degrees\n</tool_response>\n<tool_response>\n\
         sunny\n</tool_response><end_of_turn>\n<start_of_turn>model\n"
    ));
}

#[test]
fn arguments_that_are_not_json_render_as_a_string() {
    let template = qwen_template();
    let mut call = ChatMessage::assistant("Let me check.");
    call.tool_calls.push(ChatToolCall {
        id: "c".into(),
        name: "f".into(),
        arguments: "not json".into(),
    });
    let text = template
        .render(&[ChatMessage::user("x"), call], false)
        .unwrap();
    assert!(
        text.ends_with(
            "<|im_start|>assistant\nLet me check.\n<tool_call>\n{\"name\": \"f\", \
             \"arguments\": \"not json\"}\n</tool_call><|im_end|>\n"
        ),
        "{text}"
    );
    assert!(ChatTools::from_json("{\"a\": 1}").is_err());
    assert!(ChatTools::from_json("[").is_err());
}
