//! A model whose engine thread panics (an engine bug, injected here between two steps) costs the
//! requests it was running, not the server: a stream it cut short ends with an `engine_failed`
//! error event, the next request loads the model again and is answered, and the failure is
//! counted in `/metrics`. A real server on a loopback port, driven over HTTP.

use std::time::{Duration, Instant};

use airs_memory::{LoadOptions, ModelRegistry};
use airs_runtime::DraftConfig;
use airs_server::models::{ModelSpec, Models, ServingConfig};
use airs_server::{AppState, ServerConfig};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_engine_fails_its_requests_and_the_model_is_loaded_again() {
    let serving = ServingConfig {
        threads: 1,
        load: LoadOptions::default(),
        kv_pool_bytes: 16 << 20,
        kv_type: airs_engine::KvType::F16,
        parallel: 4,
        queue: 16,
        draft: DraftConfig::default(),
        db: None,
    };
    let registry = std::sync::Arc::new(ModelRegistry::new(256 << 20));
    let models = Models::new(Some(registry), vec![ModelSpec::embedded()], serving);
    let state = AppState::new(models, None, ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(airs_server::serve(state.clone(), listener, async {
        let _ = stop_rx.await;
    }));
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("{base}/health"))
        .send()
        .await
        .map_or(true, |r| r.status() != 200)
    {
        assert!(Instant::now() < deadline, "never healthy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A chat request, sent.
    let chat = |stream: bool, max_tokens: u32| {
        let body = json!({
            "model": "stories260K",
            "stream": stream,
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
        });
        http.post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };

    // A long stream; once it has tokens, the engine panics.
    let mut stream = chat(true, 100_000).await.unwrap();
    assert_eq!(stream.status(), 200);
    let mut body = String::new();
    while body.matches("data:").count() < 4 {
        let chunk = stream
            .chunk()
            .await
            .unwrap()
            .expect("the stream ended early");
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    let served = state.models.loaded().pop().expect("the model is loaded");
    served.service.inject_panic("an engine invariant broke");
    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
        assert!(Instant::now() < deadline, "the stream did not end");
    }
    let error: Value = body
        .split("data:")
        .map(str::trim)
        .filter(|d| d.contains("\"error\""))
        .find_map(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| panic!("no error event in the stream: {body}"));
    assert_eq!(error["error"]["code"], "engine_failed", "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("an engine invariant broke"), "{message}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    drop(served);

    // The next request is answered by the model loaded again.
    let reply = chat(false, 8).await.unwrap();
    assert_eq!(reply.status(), 200);
    let reply: Value = serde_json::from_str(&reply.text().await.unwrap()).unwrap();
    assert_eq!(reply["usage"]["completion_tokens"], 8, "{reply}");
    assert!(
        state
            .models
            .loaded()
            .iter()
            .all(|s| s.service.failure().is_none())
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("\nairs_engine_failures_total 1\n"),
        "{metrics}"
    );

    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
