//! `airs tokenize`: the token ids and pieces of a text under a model's tokenizer.

use airs_runtime::ModelBytes;
use airs_tokenizer::{EncodeOptions, TokenId};
use serde_json::json;

pub fn run(
    model: &ModelBytes,
    text: &str,
    no_bos: bool,
    no_special: bool,
    as_json: bool,
) -> anyhow::Result<()> {
    let tok = model.tokenizer()?;
    let options = EncodeOptions {
        add_bos: tok.add_bos() && !no_bos,
        parse_special: !no_special,
    };
    let ids = tok.encode(text, options);
    let piece = |id: TokenId| tok.token_piece(id).unwrap_or("").to_owned();
    if as_json {
        let report = json!({
            "model": model.name,
            "text": text,
            "ids": ids.iter().map(|&i| u32::from(i)).collect::<Vec<_>>(),
            "pieces": ids.iter().map(|&i| piece(i)).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for id in &ids {
            println!("{:>8}  {:?}", id.0, piece(*id));
        }
        eprintln!("{} tokens", ids.len());
    }
    Ok(())
}
