//! A streaming JSON syntax checker over bytes: it takes generated text one byte at a time and
//! says whether the bytes so far can still begin a JSON object (RFC 8259), and when they are
//! one. It is what constrains generation to JSON ([`crate::constraint`]): a token is allowed
//! when the checker accepts all its bytes.
//!
//! What it accepts: one object at the top level (OpenAI's `json_object` response format),
//! or one value of any kind ([`JsonSyntax::value`]); inside it any JSON values, with strings that are valid UTF-8
//! (no unescaped control characters, no `\u` escape of a surrogate half, which `serde_json`
//! and most parsers refuse when it stands alone) and numbers as the grammar writes them.
//! Bounds that keep a constrained model from running away, which JSON of the kind a client
//! asks for never meets: nesting at most [`MAX_DEPTH`] deep, and whitespace between tokens
//! either one space or one newline and at most [`MAX_INDENT`] spaces or tabs of indentation (a
//! small model left free to emit whitespace emits it forever; llama.cpp's JSON grammar bounds
//! it the same way). The object starts at the first byte, and nothing may follow it: the
//! generation ends there.
//!
//! Design: a pushdown automaton whose stack is a bit per open container (object or array) in
//! one `u64`, so the whole state is `Copy` (16 bytes) and checking a candidate token is copying
//! the state and feeding it the token's bytes, with no allocation — as llama.cpp's grammar
//! sampler does for its GBNF JSON grammar, without the general grammar machinery.
//!
//! Cost: O(1) per byte.

/// Most nesting of objects and arrays (the top-level object counts).
pub const MAX_DEPTH: u8 = 64;
/// Most spaces and tabs after the newline of a run of whitespace between tokens.
pub const MAX_INDENT: u8 = 32;

/// What the checker expects next.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Expect {
    /// The top-level object's `{`.
    Top,
    /// The top-level value's first byte ([`JsonSyntax::value`]).
    TopValue,
    /// A value (after `:` or an array's `,`).
    Value,
    /// A value or `]` (after `[`).
    ValueOrClose,
    /// A key or `}` (after `{`).
    KeyOrClose,
    /// A key (after an object's `,`).
    Key,
    /// The `:` after a key.
    Colon,
    /// `,` or the open container's close, after a value.
    CommaOrClose,
    /// Inside a string (a key's when `key`).
    Str { key: bool, part: StrPart },
    /// Inside a number.
    Number(Number),
    /// Inside `true`, `false` or `null`, with the bytes matched so far.
    Literal(Word, u8),
    /// The top-level object is complete; nothing may follow.
    Done,
}

/// A literal word.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Word {
    True,
    False,
    Null,
}

impl Word {
    fn bytes(self) -> &'static [u8] {
        match self {
            Word::True => b"true",
            Word::False => b"false",
            Word::Null => b"null",
        }
    }
}

/// Where inside a string.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum StrPart {
    Plain,
    /// After a backslash.
    Escape,
    /// After `\u` and `digits` hex digits; `surrogate` when the first was `d` or `D`, so
    /// the second must be `0`-`7` (no surrogate halves).
    Hex {
        digits: u8,
        surrogate: bool,
    },
    /// Inside a multi-byte UTF-8 character: continuation bytes still to come, and the range
    /// the next one must fall in (RFC 3629's table: no overlong forms, no surrogates).
    Utf8 {
        left: u8,
        lo: u8,
        hi: u8,
    },
}

/// Where inside a number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Number {
    /// Whether the number may end here.
    fn complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::ExpDigits
        )
    }

    /// The state after `byte`, if it continues the number.
    fn next(self, byte: u8) -> Option<Number> {
        let digit = byte.is_ascii_digit();
        Some(match (self, byte) {
            (Number::Minus, b'0') => Number::Zero,
            (Number::Minus, _) if digit => Number::Int,
            (Number::Int, _) if digit => Number::Int,
            (Number::Zero | Number::Int, b'.') => Number::Dot,
            (Number::Dot | Number::Frac, _) if digit => Number::Frac,
            (Number::Zero | Number::Int | Number::Frac, b'e' | b'E') => Number::Exp,
            (Number::Exp, b'+' | b'-') => Number::ExpSign,
            (Number::Exp | Number::ExpSign | Number::ExpDigits, _) if digit => Number::ExpDigits,
            _ => return None,
        })
    }
}

/// The checker's state (see the module documentation). `Copy` (16 bytes): a candidate is
/// checked on a copy.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct JsonSyntax {
    expect: Expect,
    /// Bit `i`: whether open container `i` (from the outside) is an object.
    objects: u64,
    /// Open containers.
    depth: u8,
    /// The current run of whitespace between tokens.
    space: Whitespace,
}

/// A run of whitespace between JSON tokens, as the checkers bound it: `" "`, or `"\n"` and at
/// most [`MAX_INDENT`] spaces or tabs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Whitespace {
    /// Bytes so far, and whether the first was a newline.
    bytes: u8,
    newline: bool,
}

impl Whitespace {
    /// Whether `byte` is whitespace between tokens (then [`Whitespace::push`] it).
    pub(crate) fn is_space(byte: u8) -> bool {
        matches!(byte, b' ' | b'\t' | b'\n')
    }

    /// Take one more whitespace byte; false past the bound.
    pub(crate) fn push(&mut self, byte: u8) -> bool {
        let ok = match self.bytes {
            0 => byte != b'\t',
            _ => self.newline && byte != b'\n' && self.bytes <= MAX_INDENT,
        };
        if ok {
            self.newline |= self.bytes == 0 && byte == b'\n';
            self.bytes += 1;
        }
        ok
    }
}

const _: () = assert!(std::mem::size_of::<JsonSyntax>() == 16);

impl Default for JsonSyntax {
    fn default() -> JsonSyntax {
        JsonSyntax::new()
    }
}

impl JsonSyntax {
    /// A checker before the first byte.
    pub fn new() -> JsonSyntax {
        JsonSyntax {
            expect: Expect::Top,
            objects: 0,
            depth: 0,
            space: Whitespace::default(),
        }
    }

    /// A checker of one JSON value of any kind (not only an object), from its first byte: what
    /// a JSON schema's untyped parts accept ([`crate::schema_syntax`]).
    pub fn value() -> JsonSyntax {
        JsonSyntax {
            expect: Expect::TopValue,
            ..JsonSyntax::new()
        }
    }

    /// Whether the bytes so far are one whole JSON object (or value, for
    /// [`JsonSyntax::value`]).
    pub fn is_complete(&self) -> bool {
        self.expect == Expect::Done
    }

    /// Whether the value may end here: complete, or a top-level number that a following byte
    /// would end (a number's end is the first byte after it).
    pub fn can_end(&self) -> bool {
        match self.expect {
            Expect::Done => true,
            Expect::Number(n) => self.depth == 0 && n.complete(),
            _ => false,
        }
    }

    /// Whether a number is being read (for an integer-only schema, which refuses its `.`
    /// and exponent).
    pub fn in_number(&self) -> bool {
        matches!(self.expect, Expect::Number(_))
    }

    /// Whether the text is inside a string with no escape or character pending: then any
    /// whole UTF-8 characters but `"`, `\` and control characters continue it and leave this
    /// state as it is.
    pub fn in_plain_string(&self) -> bool {
        matches!(
            self.expect,
            Expect::Str {
                part: StrPart::Plain,
                ..
            }
        )
    }

    /// The state after `bytes`, or `None` if some byte of them cannot continue the text.
    pub fn after(mut self, bytes: &[u8]) -> Option<JsonSyntax> {
        for &b in bytes {
            if !self.push(b) {
                return None;
            }
        }
        Some(self)
    }

    /// Feed one byte; false when it cannot continue the text (the state is then unspecified:
    /// check on a copy, as [`JsonSyntax::after`] does).
    pub fn push(&mut self, byte: u8) -> bool {
        match self.expect {
            Expect::Str { key, part } => self.string(key, part, byte),
            Expect::Number(n) => match n.next(byte) {
                Some(next) => {
                    self.expect = Expect::Number(next);
                    true
                }
                // The number ends; the byte then belongs to what follows it.
                None if n.complete() => {
                    self.value_done();
                    self.push(byte)
                }
                None => false,
            },
            Expect::Literal(word, matched) => {
                if word.bytes()[usize::from(matched)] != byte {
                    return false;
                }
                if usize::from(matched) + 1 == word.bytes().len() {
                    self.value_done();
                } else {
                    self.expect = Expect::Literal(word, matched + 1);
                }
                true
            }
            Expect::Done => false,
            Expect::Top | Expect::TopValue => self.token(self.expect, byte),
            _ if Whitespace::is_space(byte) => self.space.push(byte),
            expect => {
                self.space = Whitespace::default();
                self.token(expect, byte)
            }
        }
    }

    /// A structural byte or the first byte of a value, in state `expect` (not inside a
    /// string, number or literal).
    fn token(&mut self, expect: Expect, byte: u8) -> bool {
        let in_object = self.depth > 0 && self.objects & (1 << (self.depth - 1)) != 0;
        let value = matches!(
            expect,
            Expect::Value | Expect::ValueOrClose | Expect::TopValue
        );
        match byte {
            b'{' if value || expect == Expect::Top => self.open(true, Expect::KeyOrClose),
            b'[' if value => self.open(false, Expect::ValueOrClose),
            b'"' if value => self.begin(Expect::Str {
                key: false,
                part: StrPart::Plain,
            }),
            b'"' if matches!(expect, Expect::KeyOrClose | Expect::Key) => self.begin(Expect::Str {
                key: true,
                part: StrPart::Plain,
            }),
            b'-' if value => self.begin(Expect::Number(Number::Minus)),
            b'0' if value => self.begin(Expect::Number(Number::Zero)),
            b'1'..=b'9' if value => self.begin(Expect::Number(Number::Int)),
            b't' if value => self.begin(Expect::Literal(Word::True, 1)),
            b'f' if value => self.begin(Expect::Literal(Word::False, 1)),
            b'n' if value => self.begin(Expect::Literal(Word::Null, 1)),
            b':' if expect == Expect::Colon => self.begin(Expect::Value),
            b',' if expect == Expect::CommaOrClose => self.begin(if in_object {
                Expect::Key
            } else {
                Expect::Value
            }),
            b'}' if in_object && matches!(expect, Expect::KeyOrClose | Expect::CommaOrClose) => {
                self.close()
            }
            b']' if !in_object
                && self.depth > 0
                && matches!(expect, Expect::ValueOrClose | Expect::CommaOrClose) =>
            {
                self.close()
            }
            _ => false,
        }
    }

    fn begin(&mut self, expect: Expect) -> bool {
        self.expect = expect;
        true
    }

    fn open(&mut self, object: bool, expect: Expect) -> bool {
        if self.depth == MAX_DEPTH {
            return false;
        }
        if object {
            self.objects |= 1 << self.depth;
        } else {
            self.objects &= !(1 << self.depth);
        }
        self.depth += 1;
        self.begin(expect)
    }

    fn close(&mut self) -> bool {
        self.depth -= 1;
        self.value_done();
        true
    }

    /// A value just ended: the top-level object is done, or its container goes on.
    fn value_done(&mut self) {
        self.expect = if self.depth == 0 {
            Expect::Done
        } else {
            Expect::CommaOrClose
        };
    }

    fn string(&mut self, key: bool, part: StrPart, byte: u8) -> bool {
        let utf8 = |left, lo, hi| StrPart::Utf8 { left, lo, hi };
        let part = match part {
            StrPart::Plain => match byte {
                b'"' => {
                    if key {
                        self.expect = Expect::Colon;
                    } else {
                        self.value_done();
                    }
                    return true;
                }
                b'\\' => StrPart::Escape,
                0x20..=0x7F => StrPart::Plain,
                // A UTF-8 lead byte: continuation bytes to come, the range of the first (RFC
                // 3629's table: no overlong forms, no surrogates, nothing past U+10FFFF).
                0xC2..=0xDF => utf8(1, 0x80, 0xBF),
                0xE0 => utf8(2, 0xA0, 0xBF),
                0xE1..=0xEC | 0xEE..=0xEF => utf8(2, 0x80, 0xBF),
                0xED => utf8(2, 0x80, 0x9F),
                0xF0 => utf8(3, 0x90, 0xBF),
                0xF1..=0xF3 => utf8(3, 0x80, 0xBF),
                0xF4 => utf8(3, 0x80, 0x8F),
                // Control characters, stray continuation bytes, overlong leads, > U+10FFFF.
                _ => return false,
            },
            StrPart::Utf8 { left, lo, hi } => {
                if !(lo..=hi).contains(&byte) {
                    return false;
                }
                if left == 1 {
                    StrPart::Plain
                } else {
                    utf8(left - 1, 0x80, 0xBF)
                }
            }
            StrPart::Escape => match byte {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => StrPart::Plain,
                b'u' => StrPart::Hex {
                    digits: 0,
                    surrogate: false,
                },
                _ => return false,
            },
            StrPart::Hex { digits, surrogate } => {
                let ok = if surrogate {
                    (b'0'..=b'7').contains(&byte)
                } else {
                    byte.is_ascii_hexdigit()
                };
                if !ok {
                    return false;
                }
                if digits == 3 {
                    StrPart::Plain
                } else {
                    StrPart::Hex {
                        digits: digits + 1,
                        surrogate: digits == 0 && matches!(byte, b'd' | b'D'),
                    }
                }
            }
        };
        self.expect = Expect::Str { key, part };
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// The prefixes a random walk through what a checker accepts reaches, and the checker's
    /// state after each: at every step one of the `alphabet` bytes that `after` accepts, picked
    /// by the next of `choices`; the walk stops where none is accepted.
    pub(crate) fn random_walk<S: Copy>(
        start: S,
        alphabet: &[u8],
        choices: &[u8],
        after: impl Fn(S, u8) -> Option<S>,
    ) -> Vec<(Vec<u8>, S)> {
        let (mut state, mut text, mut out) = (start, Vec::new(), Vec::new());
        for &choice in choices {
            let next: Vec<(u8, S)> = alphabet
                .iter()
                .filter_map(|&b| after(state, b).map(|s| (b, s)))
                .collect();
            let Some(&(byte, s)) = next.get(usize::from(choice) % next.len().max(1)) else {
                break;
            };
            text.push(byte);
            state = s;
            out.push((text.clone(), state));
        }
        out
    }

    fn complete(text: &str) -> bool {
        JsonSyntax::new()
            .after(text.as_bytes())
            .is_some_and(|s| s.is_complete())
    }

    fn viable(text: &[u8]) -> bool {
        JsonSyntax::new().after(text).is_some()
    }

    #[test]
    fn objects_with_every_kind_of_value_are_complete_exactly_at_their_end() {
        let doc = r#"{"a": [1, -0.5e+3, 0, 12E-1, true, false, null, "x\"\\\/\b\f\n\r\tA\u00e9\uD7FF"],
"b": {"c": {}, "d": [[], [{}]]}, "é": "日本🦙", "": ""}"#;
        let s = JsonSyntax::new().after(doc.as_bytes()).expect("valid");
        assert!(s.is_complete());
        for end in 0..doc.len() - 1 {
            let p = JsonSyntax::new().after(&doc.as_bytes()[..end]);
            assert!(p.is_some_and(|p| !p.is_complete()), "prefix {end}");
        }
        assert!(serde_json::from_str::<Value>(doc).is_ok());
    }

    #[test]
    fn what_json_forbids_is_refused() {
        for bad in [
            "[1]",                  // not an object at the top
            "\"x\"",                // nor a string
            "{\"a\": 1,}",          // trailing comma
            "{a: 1}",               // unquoted key
            "{\"a\" 1}",            // no colon
            "{\"a\": 01}",          // leading zero
            "{\"a\": 1.}",          // no fraction digits
            "{\"a\": .5}",          // no integer part
            "{\"a\": +1}",          // plus sign
            "{\"a\": 1e}",          // no exponent digits
            "{\"a\": tru}",         // a broken literal
            "{\"a\": True}",        // a capitalised one
            "{\"a\": \"x\ny\"}",    // a raw newline in a string
            "{\"a\": \"\\x\"}",     // an unknown escape
            "{\"a\": \"\\u12G4\"}", // a bad hex digit
            "{\"a\": \"\\uD800\"}", // a surrogate half
            "{\"a\": \"\\udc00\"}", // another
            "{\"a\": [1}",          // mismatched close
            "{\"a\": 1]",           // another
            "{} ",                  // anything after the object
            "{}{}",                 // a second object
        ] {
            assert!(!complete(bad), "{bad:?}");
        }
        // Invalid UTF-8 inside strings: stray continuation, overlong, surrogate, > U+10FFFF.
        for bytes in [
            &b"{\"\x80\"}"[..],
            b"{\"\xC0\xAF\"}",
            b"{\"\xE0\x80\xAF\"}",
            b"{\"\xED\xA0\x80\"}",
            b"{\"\xF4\x90\x80\x80\"}",
            b"{\"\xF5\x80\x80\x80\"}",
            b"{\"\xE6\x97\"}",
        ] {
            assert!(
                JsonSyntax::new()
                    .after(bytes)
                    .is_none_or(|s| !s.is_complete()),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn whitespace_between_tokens_is_one_space_or_one_indented_newline() {
        let indent = " ".repeat(usize::from(MAX_INDENT));
        assert!(complete(&format!(
            "{{\n{indent}\"a\": 1,\n\t\"b\" : [ 2 ]\n}}"
        )));
        assert!(!complete(&format!("{{\n{indent} \"a\": 1}}")));
        for bad in [
            "{  \"a\": 1}",
            "{\n\n\"a\": 1}",
            "{ \n\"a\": 1}",
            "{\t\"a\": 1}",
            " {}",
            "\n{}",
        ] {
            assert!(!complete(bad), "{bad:?}");
        }
        // Spaces inside strings are not whitespace between tokens.
        assert!(complete(&format!("{{\"a\": \"{}\"}}", " ".repeat(500))));
    }

    #[test]
    fn nesting_is_bounded() {
        let depth = usize::from(MAX_DEPTH);
        let deep = format!(
            "{{\"a\": {}{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        );
        assert!(complete(&deep));
        let deeper = format!("{{\"a\": {}", "[".repeat(depth));
        assert!(!viable(deeper.as_bytes()));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Every object serde_json writes, compact or pretty, is accepted and complete exactly
        /// at its end.
        #[test]
        fn every_serialized_object_is_accepted(
            fields in prop::collection::btree_map("\\PC{0,8}", json_value(), 0..6),
        ) {
            let value = Value::Object(fields.into_iter().collect());
            for text in [serde_json::to_string(&value).unwrap(),
                         serde_json::to_string_pretty(&value).unwrap()] {
                let s = JsonSyntax::new().after(text.as_bytes());
                prop_assert!(s.is_some_and(|s| s.is_complete()), "{}", text);
                let before = JsonSyntax::new().after(&text.as_bytes()[..text.len() - 1]);
                prop_assert!(before.is_some_and(|s| !s.is_complete()));
            }
        }

        /// A random walk through what the checker accepts: at every step one of the bytes it
        /// accepts next (from an alphabet of JSON's bytes, UTF-8 pieces and a few letters). Every
        /// prefix the walk reaches, serde_json reads to its end without a syntax error, and
        /// parses as an object exactly when the checker calls it complete.
        #[test]
        fn accepted_text_is_json_for_an_independent_parser(
            choices in prop::collection::vec(any::<u8>(), 0..80),
        ) {
            const ALPHABET: &[u8] =
                b"{}[]:,\"\\ \t\n-+.0123456789eEtrufalsnbdDFx/\x7f\x01\xc3\xa9\xe6\x97\xa5\xf0\x9f\xed";
            let walk = random_walk(JsonSyntax::new(), ALPHABET, &choices, |s, b| s.after(&[b]));
            for (text, state) in walk {
                match serde_json::from_slice::<Value>(&text) {
                    Ok(v) => prop_assert!(state.is_complete() && v.is_object(),
                        "{:?}", String::from_utf8_lossy(&text)),
                    // serde_json refuses numbers beyond f64 (`1e400`), which JSON allows.
                    Err(e) if e.to_string().starts_with("number out of range") => {}
                    Err(e) => {
                        prop_assert!(!state.is_complete());
                        prop_assert!(e.is_eof(), "{:?}: {}", String::from_utf8_lossy(&text), e);
                    }
                }
            }
        }

        /// Arbitrary bytes never panic the checker, and what it accepts byte by byte it accepts
        /// at once.
        #[test]
        fn arbitrary_bytes_are_refused_without_panicking(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut state = JsonSyntax::new();
            let mut accepted = 0;
            for &b in &bytes {
                let mut next = state;
                if !next.push(b) {
                    break;
                }
                state = next;
                accepted += 1;
            }
            prop_assert_eq!(JsonSyntax::new().after(&bytes[..accepted]), Some(state));
        }
    }
}
