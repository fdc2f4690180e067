//! The `tojson` filter as Hugging Face's chat templates know it: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, which
//! `transformers` registers as the template environment's `tojson`.
//!
//! minijinja's own `tojson` writes compact JSON (`{"a":1}`) and escapes `<`, `>`, `&` and `'`
//! for HTML. A model whose template writes its tool signatures with `tojson` (Qwen2.5's
//! `tool | tojson`) was trained on Python's form, `{"a": 1}` with `<` as it is, so the prompt
//! airs renders must be that text byte for byte: the separators (`", "` and `": "`, or `","`
//! and `": "` with an indent), members in their given order (minijinja keeps it with its
//! `preserve_order` feature), floats as Python's `repr` (`1.0`, `1e-05`, `1e+16`), and only
//! `"`, `\`, and control characters escaped (non-ASCII too with `ensure_ascii=True`).
//!
//! Cost: one pass over the value; the output is built in one `String`.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Python's `json.dumps` options that templates pass.
struct Options {
    /// Spaces per level, or none: everything on one line.
    indent: Option<usize>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// The filter: `value | tojson`, `value | tojson(indent=2)`, `tojson(value, 4)`,
/// `tojson(separators=(",", ":"), sort_keys=true, ensure_ascii=true)`.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_i64() {
            Some(n) if (0..=64).contains(&n) => Some(n as usize),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be a whole number of spaces from 0 to 64",
                ));
            }
        },
    };
    let (default_item, default_key) = if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .filter(|p: &Vec<String>| p.len() == 2)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            (parts[0].clone(), parts[1].clone())
        }
        _ => (default_item.to_owned(), default_key.to_owned()),
    };
    let options = Options {
        indent,
        item_separator,
        key_separator,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(value, &options, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// `value` as Python's `json.dumps` with default options (one line, `", "` and `": "`).
pub fn dumps(value: &Value) -> String {
    let options = Options {
        indent: None,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        sort_keys: false,
        ensure_ascii: false,
    };
    let mut out = String::new();
    // Values built from JSON (all airs renders this way) always serialize.
    let _ = write_value(value, &options, 0, &mut out);
    out
}

fn newline(options: &Options, level: usize, out: &mut String) {
    if let Some(indent) = options.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', indent * level));
    }
}

fn write_value(
    value: &Value,
    options: &Options,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value.as_i64() {
            Some(i) if value.is_integer() => out.push_str(&i.to_string()),
            _ if value.is_integer() => out.push_str(&value.to_string()),
            _ => out.push_str(&python_float(f64::try_from(value.clone())?)),
        },
        ValueKind::String => write_string(value.as_str().unwrap_or(""), options, out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if options.sort_keys {
                keys.sort_by_key(|a| a.to_string());
            }
            write_container(&keys, ['{', '}'], options, level, out, |key, out| {
                let key_text = match key.as_str() {
                    Some(s) => s.to_owned(),
                    None if key.is_none() => "null".into(),
                    None => key.to_string(),
                };
                write_string(&key_text, options, out);
                out.push_str(&options.key_separator);
                write_value(&value.get_item(key)?, options, level + 1, out)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(&items, ['[', ']'], options, level, out, |item, out| {
                write_value(item, options, level + 1, out)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} is not JSON serializable", value.kind()),
            ));
        }
    }
    Ok(())
}

/// `[a, b]` or `{"k": v}`: the items between `open` and `close`, separated, one a line with
/// an indent; `[]` or `{}` when there are none.
fn write_container(
    items: &[Value],
    [open, close]: [char; 2],
    options: &Options,
    level: usize,
    out: &mut String,
    mut write_item: impl FnMut(&Value, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(options, level + 1, out);
        write_item(item, out)?;
    }
    newline(options, level, out);
    out.push(close);
    Ok(())
}

fn write_string(text: &str, options: &Options, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (options.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr`: the shortest text that reads back, in positional notation for
/// exponents from -4 to 15 (with `.0` when whole) and scientific otherwise (`1e-05`,
/// `1.5e+16`); `NaN`, `Infinity` and `-Infinity` as `json.dumps` writes them.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("Rust's {:e} writes an exponent");
    let exponent: i32 = exponent.parse().expect("an exponent is a number");
    if x != 0.0 && !(-4..16).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let positional = format!("{x}");
    if positional.contains('.') {
        positional
    } else {
        format!("{positional}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, json: &str) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let value: Value = serde_json::from_str(json).unwrap();
        env.render_str(template, minijinja::context! { x => value })
            .unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        // Each expected text is Python 3's json.dumps(json.loads(input), ensure_ascii=False)
        // with the options named in the template.
        let x =
            r#"{"b": [1, 2.5, true, null], "a": {"<tag>": "é\n\"q\"\u0001"}, "e": {}, "l": []}"#;
        assert_eq!(
            render("{{ x | tojson }}", x),
            r#"{"b": [1, 2.5, true, null], "a": {"<tag>": "é\n\"q\"\u0001"}, "e": {}, "l": []}"#
        );
        assert_eq!(
            render(
                "{{ x | tojson(indent=2) }}",
                r#"{"a": [1, {"b": null}], "c": []}"#
            ),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": []\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(separators=(',', ':'), sort_keys=true, ensure_ascii=true) }}",
                r#"{"z": "é😀", "a": 1}"#
            ),
            r#"{"a":1,"z":"\u00e9\ud83d\ude00"}"#
        );
        assert_eq!(
            render("{{ x | tojson }}", r#""it's <b> & co""#),
            r#""it's <b> & co""#
        );
    }

    #[test]
    fn floats_are_written_as_python_reprs_them() {
        for (x, python) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (0.0, "0.0"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(python_float(x), python, "{x}");
        }
    }
}
