//! Function calling on real models: Qwen2.5 (whose template has a tool format) calls the tool a
//! question needs and answers other questions in text; a forced call is a call of the right
//! function with arguments of its schema, from Qwen and from stories260K (a story model that
//! has never seen a tool, so only the constraint can make it one).

use std::sync::Arc;

use airs_runtime::json_schema::SchemaValue;
use airs_runtime::tools::{ToolCall, ToolChoice, Tools, parse_reply};
use airs_runtime::{
    FinishReason, GenerationParams, LoadedModel, OutputFormat, Prompt, Request, Scheduler,
    SchedulerConfig,
};
use airs_tokenizer::chat::ChatMessage;
use serde_json::Value;

/// `get_weather(city)` and `add(a, b)`, as every tool test offers them.
const TOOLS: &str = include_str!("../../../testdata/tools/weather-and-add.json");

fn tools() -> Arc<Tools> {
    let list: Vec<SchemaValue> = serde_json::from_str(TOOLS).unwrap();
    Arc::new(Tools::from_openai(&list).unwrap())
}

fn greedy(max_tokens: usize) -> GenerationParams {
    let mut p = GenerationParams {
        max_tokens,
        ..GenerationParams::default()
    };
    p.sampler.temperature = 0.0;
    p
}

/// The reply to `ask` with the tools offered under `choice`: its text, calls and end.
fn ask(
    s: &mut Scheduler,
    tools: &Arc<Tools>,
    ask: &str,
    choice: &ToolChoice,
) -> (String, Vec<ToolCall>, FinishReason) {
    let mut params = greedy(96);
    if let Some(schema) = tools.forced_call_schema(choice).unwrap() {
        params.format = OutputFormat::JsonSchema(Arc::new(schema));
    }
    let prompt = Prompt::ChatWithTools {
        messages: vec![ChatMessage::user(ask)],
        tools: Arc::clone(tools),
    };
    let c = s.serve(Request::generate(prompt, params)).unwrap();
    let choice = &c.choices[0];
    let (text, calls) = parse_reply(tools, &choice.text);
    eprintln!(
        "{ask}: {:?} {:?} -> {text:?} {calls:?}",
        choice.reason, choice.text
    );
    (text, calls, choice.reason)
}

fn arguments(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap()
}

#[test]
fn qwen_calls_the_tool_a_question_needs_and_answers_the_rest_in_text() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    assert!(
        model.template.renders_tools(),
        "Qwen2.5's template has a tool format"
    );
    let mut s = Scheduler::new(model, SchedulerConfig::new(64 << 20), None).unwrap();
    let tools = tools();

    let (text, calls, reason) = ask(
        &mut s,
        &tools,
        "What's the weather like in Paris today?",
        &ToolChoice::Auto,
    );
    assert_eq!((text.as_str(), reason), ("", FinishReason::EndOfGeneration));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(arguments(&calls[0]), serde_json::json!({"city": "Paris"}));

    let (_, calls, _) = ask(&mut s, &tools, "What is 17 plus 25?", &ToolChoice::Auto);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "add");
    assert_eq!(arguments(&calls[0]), serde_json::json!({"a": 17, "b": 25}));

    // A question no tool answers: text.
    let haiku = "Write a haiku about the sea.";
    let (text, calls, _) = ask(&mut s, &tools, haiku, &ToolChoice::Auto);
    assert!(calls.is_empty() && !text.is_empty(), "{text:?}");

    // The same question with a call forced: a call of that function, arguments of its schema.
    let (text, calls, reason) = ask(
        &mut s,
        &tools,
        haiku,
        &ToolChoice::Function("get_weather".into()),
    );
    assert_eq!((text.as_str(), reason), ("", FinishReason::EndOfGeneration));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
    assert!(arguments(&calls[0])["city"].is_string(), "{calls:?}");
    let (_, calls, _) = ask(&mut s, &tools, haiku, &ToolChoice::Required);
    assert_eq!(calls.len(), 1, "required: one call");
    assert_of_its_schema(&calls[0]);
}

/// A call's arguments are of the schema of the function it names.
fn assert_of_its_schema(call: &ToolCall) {
    let args = arguments(call);
    let keys: Vec<&str> = args
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    match call.name.as_str() {
        "add" => assert!(
            args["a"].is_i64() && args["b"].is_i64() && keys.len() == 2,
            "{args}"
        ),
        "get_weather" => assert!(args["city"].is_string() && keys == ["city"], "{args}"),
        other => panic!("{other}"),
    }
}

#[test]
fn a_story_model_forced_to_call_writes_a_call_of_the_schema() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::stories_path(), 1).unwrap());
    assert!(!model.template.renders_tools());
    let mut s = Scheduler::new(model, SchedulerConfig::new(8 << 20), None).unwrap();
    let tools = tools();
    let (_, calls, _) = ask(&mut s, &tools, "Once upon a time", &ToolChoice::Auto);
    assert!(calls.is_empty(), "left to itself, a story: {calls:?}");
    let (text, calls, reason) = ask(
        &mut s,
        &tools,
        "Once upon a time",
        &ToolChoice::Function("add".into()),
    );
    assert_eq!((text.as_str(), reason), ("", FinishReason::EndOfGeneration));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "add");
    assert_of_its_schema(&calls[0]);
    // Either function: the arguments follow the one the name chose.
    for prompt in ["Once upon a time", "Tom went to", "The weather"] {
        let (text, calls, reason) = ask(&mut s, &tools, prompt, &ToolChoice::Required);
        assert_eq!((text.as_str(), reason), ("", FinishReason::EndOfGeneration));
        assert_eq!(calls.len(), 1);
        assert_of_its_schema(&calls[0]);
    }
}

/// Gemma 3 (its file has no template: the Gemma fallback, which has no tool format) is told
/// about the tools in its first user turn, and a forced call is a call of the schema.
#[test]
fn gemma_without_a_tool_format_is_told_the_tools_and_calls_when_forced() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::gemma_path(), 2).unwrap());
    assert!(!model.template.renders_tools());
    let tools = tools();
    let prompt = model
        .template
        .render_with_tools(
            &[ChatMessage::user("Add 2 and 3.")],
            Some(tools.chat()),
            true,
        )
        .unwrap();
    assert!(
        prompt.contains("<start_of_turn>user\n# Tools\n")
            && prompt.contains(r#"{"type": "function", "function": {"name": "add""#)
            && prompt.ends_with("Add 2 and 3.<end_of_turn>\n<start_of_turn>model\n"),
        "{prompt}"
    );
    let mut s = Scheduler::new(model, SchedulerConfig::new(64 << 20), None).unwrap();
    for choice in [ToolChoice::Function("add".into()), ToolChoice::Required] {
        let (text, calls, reason) = ask(&mut s, &tools, "Add 2 and 3.", &choice);
        assert_eq!((text.as_str(), reason), ("", FinishReason::EndOfGeneration));
        assert_eq!(calls.len(), 1, "{choice:?}");
        assert_of_its_schema(&calls[0]);
    }
}

/// A session's turn with `messages` (its new ones) and `tools`: the reply's text as generated.
fn session_turn(
    s: &mut Scheduler,
    messages: Vec<ChatMessage>,
    tools: Option<&Arc<Tools>>,
) -> String {
    let prompt = match tools {
        Some(tools) => Prompt::ChatWithTools {
            messages,
            tools: Arc::clone(tools),
        },
        None => Prompt::Chat(messages),
    };
    let mut request = Request::generate(prompt, greedy(64));
    request.session = Some(airs_runtime::SessionTurn {
        name: "agent".into(),
        system: None,
    });
    s.serve(request).unwrap().choices[0].text.clone()
}

/// The reply to the whole conversation `messages` sent at once (no session).
fn whole(s: &mut Scheduler, messages: Vec<ChatMessage>, tools: &Arc<Tools>) -> String {
    let prompt = Prompt::ChatWithTools {
        messages,
        tools: Arc::clone(tools),
    };
    s.serve(Request::generate(prompt, greedy(64)))
        .unwrap()
        .choices[0]
        .text
        .clone()
}

#[test]
fn a_qwen_session_calls_a_tool_takes_its_result_and_continues_after_a_restart() {
    // A session with tools: the client sends the question, then only the function's result,
    // then (from a new process's scheduler on the same database, the tools not sent again)
    // the next question. Each reply is the reply to the whole conversation sent at once, with
    // the replies as generated: the session's cache holds exactly that conversation.
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    let dir = std::env::temp_dir().join(format!("airs-tools-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("sessions.db");
    let _ = std::fs::remove_file(&db);
    let scheduler = || {
        let store =
            airs_runtime::HistoryStore::open(&db, airs_runtime::Durability::Normal).unwrap();
        Scheduler::new(
            Arc::clone(&model),
            SchedulerConfig::new(64 << 20),
            Some(store),
        )
        .unwrap()
    };
    let mut alone =
        Scheduler::new(Arc::clone(&model), SchedulerConfig::new(64 << 20), None).unwrap();
    let tools = tools();
    let question = ChatMessage::user("What's the weather like in Paris today?");
    let result = ChatMessage::new("tool", r#"{"temperature_c": 18, "sky": "cloudy"}"#);
    let next = ChatMessage::user("Thanks. What is 17 plus 25?");

    let mut s = scheduler();
    let first = session_turn(&mut s, vec![question.clone()], Some(&tools));
    let (_, calls) = parse_reply(&tools, &first);
    assert_eq!(calls.len(), 1, "{first:?}");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(first, whole(&mut alone, vec![question.clone()], &tools));

    let second = session_turn(&mut s, vec![result.clone()], Some(&tools));
    let so_far = vec![
        question.clone(),
        ChatMessage::assistant(first.as_str()),
        result.clone(),
    ];
    assert_eq!(
        second,
        whole(&mut alone, so_far.clone(), &tools),
        "{second:?}"
    );
    let tokens_before = s.sessions()[0].sequence_tokens;
    drop(s);

    let mut s = scheduler();
    let third = session_turn(&mut s, vec![next.clone()], None);
    let mut all = so_far;
    all.extend([ChatMessage::assistant(second.as_str()), next]);
    assert_eq!(third, whole(&mut alone, all, &tools), "{third:?}");
    let (_, calls) = parse_reply(&tools, &third);
    eprintln!("{first:?} / {second:?} / {third:?} {calls:?}");
    let history = s.history("agent").unwrap();
    let roles: Vec<&str> = history.iter().map(|(r, _)| r.name()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert!(s.sessions()[0].sequence_tokens > tokens_before);

    // A session's tools are fixed by its first turn.
    let other = tools.json().replace("get_weather", "get_forecast");
    let other = Arc::new(Tools::from_json(&other).unwrap());
    let mut request = Request::generate(
        Prompt::ChatWithTools {
            messages: vec![ChatMessage::user("And Rome?")],
            tools: other,
        },
        greedy(8),
    );
    request.session = Some(airs_runtime::SessionTurn {
        name: "agent".into(),
        system: None,
    });
    let err = s.serve(request).unwrap_err();
    assert!(
        err.to_string().contains("tools are set by its first turn"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
