//! `airs inspect`: what a GGUF file holds — architecture, hyperparameters, tokenizer, tensors
//! by type and by layer, and the file layout.

use std::collections::BTreeMap;

use airs_gguf::{Gguf, LayerMap, ModelConfig, Value};
use serde_json::{Value as Json, json};

use airs_runtime::ModelBytes;

pub fn run(model: &ModelBytes, as_json: bool) -> anyhow::Result<()> {
    let g = model.parse()?;
    let report = report(&g, &model.name);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

fn meta_json(v: &Value<'_>) -> Json {
    match v {
        Value::String(_) => v.as_str().map_or(Json::Null, |s| json!(s)),
        Value::Array(a) => json!(format!("[{}; {}]", a.elem_type().name(), a.len())),
        Value::Bool(b) => json!(b),
        Value::F32(_) | Value::F64(_) => json!(v.as_f64()),
        _ => v.as_i64().map_or(Json::Null, |i| json!(i)),
    }
}

fn report(g: &Gguf<'_>, name: &str) -> Json {
    let config = ModelConfig::from_gguf(g);
    let hparams = match &config {
        Ok(c) => json!({
            "architecture": c.arch.name(),
            "layers": c.layers,
            "embedding_len": c.embedding_len,
            "heads": c.heads,
            "kv_heads": c.kv_heads,
            "head_dim": c.head_dim,
            "ff_len": c.ff_len,
            "vocab_len": c.vocab_len,
            "context_len": c.context_len,
            "rope_base": c.rope_base,
            "rope_dims": c.rope_dims,
            "rope_style": format!("{:?}", c.rope_style).to_lowercase(),
            "rms_eps": c.rms_eps.to_string().parse::<f64>().unwrap_or(f64::from(c.rms_eps)),
            "tied_output": c.tied_output,
            "qkv_bias": c.qkv_bias,
            "qk_norm": c.qk_norm,
            "post_norms": c.post_norms,
            "ffn_activation": format!("{:?}", c.ffn_activation).to_lowercase(),
            "attention_scale": c.attention_scale,
            "rope_factors": c.rope_factors.map(|f| f.tensor_name()),
            "rope_attn_factor": c.rope_attn_factor,
            "fused_qkv": c.fused_qkv,
            "fused_gate_up": c.fused_gate_up,
            "embedding_scale": c.embedding_scale,
            "sliding_window": c.sliding_window.map(|w| json!({
                "window": w.window,
                "global_every": w.global_every,
                "local_layers": (0..c.layers).filter(|&l| c.layer_window(l).is_some()).count(),
                "local_rope_base": w.local_rope_base,
            })),
            "kv_bytes_per_token_f16": airs_engine::KvShape {
                layers: c.layers,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            }
            .bytes_per_token(airs_engine::KvType::F16),
        }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    let str_of = |k: &str| g.get(k).and_then(|v| v.as_str().map(str::to_owned));
    let int_of = |k: &str| g.get(k).and_then(|v| v.as_i64());
    let tokenizer = json!({
        "model": str_of("tokenizer.ggml.model"),
        "pre": str_of("tokenizer.ggml.pre"),
        "tokens": g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(|a| a.len()),
        "merges": g.get("tokenizer.ggml.merges").and_then(|v| v.as_array()).map(|a| a.len()),
        "bos_id": int_of("tokenizer.ggml.bos_token_id"),
        "eos_id": int_of("tokenizer.ggml.eos_token_id"),
        "add_bos": g.get("tokenizer.ggml.add_bos_token").and_then(|v| v.as_bool()),
        "chat_template": g.get("tokenizer.chat_template").is_some(),
    });

    let mut by_type: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ty.name().to_owned()).or_default();
        e.0 += 1;
        e.1 += t.bytes;
    }
    let map = LayerMap::new(g);
    let layers: Vec<Json> = map
        .layers
        .iter()
        .map(|l| {
            json!({
                "layer": l.index,
                "tensors": l.tensors.len(),
                "bytes": l.bytes,
                "start": l.byte_range.start,
                "end": l.byte_range.end,
            })
        })
        .collect();
    let other: Vec<Json> = map
        .other
        .iter()
        .map(|&i| {
            let t = &g.tensors()[i];
            json!({ "name": t.name, "type": t.ty.name(), "dims": t.dims, "bytes": t.bytes, "offset": t.offset })
        })
        .collect();
    let data_bytes: u64 = g.tensors().iter().map(|t| t.bytes).sum();
    let params: u64 = g.tensors().iter().map(|t| t.elements()).sum();
    let file_len = g.image().len() as u64;
    json!({
        "file": name,
        "version": g.version(),
        "file_bytes": file_len,
        "alignment": g.alignment(),
        "data_offset": g.data_offset(),
        "tensor_data_bytes": data_bytes,
        "padding_bytes": file_len - g.data_offset() - data_bytes,
        "parameters": params,
        "metadata_entries": g.metadata().len(),
        "hyperparameters": hparams,
        "tokenizer": tokenizer,
        "tensors": g.tensors().len(),
        "tensors_by_type": by_type.iter().map(|(k, (n, b))| json!({ "type": k, "count": n, "bytes": b })).collect::<Vec<_>>(),
        "layers": layers,
        "non_layer_tensors": other,
        "metadata": g.metadata().iter()
            .filter(|(k, _)| !k.starts_with("tokenizer.ggml.") && *k != "tokenizer.chat_template")
            .map(|(k, v)| (k.to_string(), meta_json(v)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

fn print_text(r: &Json) {
    let mib = |b: &Json| b.as_u64().unwrap_or(0) as f64 / (1024.0 * 1024.0);
    println!("file            {}", r["file"].as_str().unwrap_or(""));
    println!(
        "format          GGUF v{}, {} bytes ({:.2} MiB), alignment {}, data at byte {}",
        r["version"],
        r["file_bytes"],
        mib(&r["file_bytes"]),
        r["alignment"],
        r["data_offset"]
    );
    println!(
        "tensors         {} ({} parameters, {:.2} MiB of data, {} bytes of padding)",
        r["tensors"],
        r["parameters"],
        mib(&r["tensor_data_bytes"]),
        r["padding_bytes"]
    );
    let h = &r["hyperparameters"];
    if let Some(e) = h.get("error") {
        println!("hyperparameters unavailable: {}", e.as_str().unwrap_or(""));
    } else {
        println!(
            "architecture    {}: {} layers, n_embd {}, {} heads ({} KV heads, head dim {}), n_ff {}",
            h["architecture"].as_str().unwrap_or(""),
            h["layers"],
            h["embedding_len"],
            h["heads"],
            h["kv_heads"],
            h["head_dim"],
            h["ff_len"]
        );
        println!(
            "                vocab {}, context {}, rope {} base {} dims {}, rms eps {}, output {}, qkv bias {}",
            h["vocab_len"],
            h["context_len"],
            h["rope_style"].as_str().unwrap_or(""),
            h["rope_base"],
            h["rope_dims"],
            h["rms_eps"],
            if h["tied_output"].as_bool() == Some(true) {
                "tied"
            } else {
                "untied"
            },
            h["qkv_bias"]
        );
        if let Some(w) = h["sliding_window"].as_object() {
            println!(
                "                sliding window {} on {} of {} layers, local rope base {}",
                w["window"], w["local_layers"], h["layers"], w["local_rope_base"],
            );
        }
        println!(
            "                ffn {}, q/k norm {}, post norms {}, attention scale {}, rope factors {}",
            h["ffn_activation"].as_str().unwrap_or(""),
            h["qk_norm"],
            h["post_norms"],
            h["attention_scale"],
            h["rope_factors"].as_str().unwrap_or("none"),
        );
        println!(
            "kv cache        {} bytes per token at f16{}",
            h["kv_bytes_per_token_f16"],
            if h["sliding_window"].is_object() {
                " (every layer keeps the whole context: the paged cache does not free blocks \
                 that fall out of the local layers' window)"
            } else {
                ""
            }
        );
    }
    let t = &r["tokenizer"];
    println!(
        "tokenizer       {} (pre {}), {} tokens, {} merges, bos {}, eos {}, add_bos {}, chat template {}",
        t["model"].as_str().unwrap_or("none"),
        t["pre"].as_str().unwrap_or("default"),
        t["tokens"],
        t["merges"],
        t["bos_id"],
        t["eos_id"],
        t["add_bos"],
        t["chat_template"]
    );
    println!("by type");
    for e in r["tensors_by_type"].as_array().into_iter().flatten() {
        println!(
            "  {:<8} {:>5} tensors {:>12} bytes ({:.2} MiB)",
            e["type"].as_str().unwrap_or(""),
            e["count"],
            e["bytes"],
            mib(&e["bytes"])
        );
    }
    println!("by layer");
    for l in r["layers"].as_array().into_iter().flatten() {
        println!(
            "  blk.{:<4} {:>3} tensors {:>12} bytes  [{}, {})",
            l["layer"].to_string(),
            l["tensors"].to_string(),
            l["bytes"].to_string(),
            l["start"],
            l["end"]
        );
    }
    println!("outside layers");
    for t in r["non_layer_tensors"].as_array().into_iter().flatten() {
        println!(
            "  {:<24} {:<6} {:>12} bytes  {}  at {}",
            t["name"].as_str().unwrap_or(""),
            t["type"].as_str().unwrap_or(""),
            t["bytes"],
            t["dims"],
            t["offset"]
        );
    }
}
