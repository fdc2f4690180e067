//! A streaming checker of text against a compiled JSON schema ([`crate::json_schema`]): fed
//! generated text one byte at a time, it says whether the bytes can still begin a value the
//! schema accepts, and when they are one. [`crate::constraint`] draws only tokens it accepts,
//! as it does for plain JSON objects with [`JsonSyntax`].
//!
//! Design: a pushdown automaton over the schema's graph. Objects with listed properties, arrays
//! and literal sets (`enum`, `const`) are frames of its own stack; every other value (strings,
//! numbers, booleans, null, untyped or property-less parts) is a [`JsonSyntax`] in value mode
//! inside one frame. Whitespace between tokens follows [`JsonSyntax`]'s rule (one space, or one
//! newline and at most [`crate::json_syntax::MAX_INDENT`] spaces or tabs). Object keys are
//! matched as literal texts, every candidate at once (a property that is not required may be
//! skipped) in a 64-bit mask; a value's first byte picks the `anyOf` alternative (they start
//! differently, checked when compiling).
//!
//! The state is `Copy` and holds no reference to the schema (each call takes it), so checking
//! a candidate token copies [`SchemaSyntax`] (400 bytes) and allocates nothing. Nesting deeper
//! than [`MAX_FRAMES`] frames (a recursive schema) is refused.
//!
//! Cost: O(1) per byte; a key byte O(candidate properties), a literal byte O(log literals).

use crate::json_schema::{Node, NodeId, Schema};
use crate::json_syntax::{JsonSyntax, Whitespace};

/// Most frames on the stack: nested objects, arrays, and the value being read.
pub const MAX_FRAMES: usize = 16;

/// A 64-bit candidate mask as [`ObjectAt::InKey`] holds it.
fn halves(mask: u64) -> [u32; 2] {
    [mask as u32, (mask >> 32) as u32]
}

/// An object frame's tag before any literal value closed in it.
const NO_TAG: u16 = u16::MAX;

/// Where inside an object with listed properties.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ObjectAt {
    /// After `{` (`comma` false: `}` may close it) or after `,`: a key.
    Key { comma: bool },
    /// Inside a key: the properties whose key still matches the `matched` bytes read.
    /// (The mask is split in two halves so that the enum aligns to 4 bytes, not 8, and an
    /// object frame stays 24 bytes.)
    InKey { candidates: [u32; 2], matched: u16 },
    /// After a key: the `:`.
    Colon,
    /// After the `:`: the value.
    Value,
    /// After a value: `,` or `}`.
    Next,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Frame {
    /// A value of the node comes next (the root, before its first byte).
    Start(NodeId),
    /// An object node: the property after the last key read, where in it, and which text the
    /// last literal value in it took ([`NO_TAG`] before one), for a [`Node::ByTag`] after it.
    Object {
        node: NodeId,
        next: u16,
        at: ObjectAt,
        tag: u16,
    },
    /// An array node: values begun so far; `open` after `[` or `,`.
    Array {
        node: NodeId,
        count: u32,
        open: bool,
    },
    /// A literal set: the range of its sorted texts that start with the `matched` bytes read.
    Literal {
        node: NodeId,
        lo: u16,
        hi: u16,
        matched: u16,
    },
    /// A value read by [`JsonSyntax`]; `integer` refuses a fraction and an exponent.
    Value { syntax: JsonSyntax, integer: bool },
}

/// The checker's state (see the module documentation).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SchemaSyntax {
    frames: [Frame; MAX_FRAMES],
    len: u8,
    /// The root value is complete.
    done: bool,
    /// The current run of whitespace between tokens.
    space: Whitespace,
}

const _: () = assert!(std::mem::size_of::<SchemaSyntax>() <= 400);

impl SchemaSyntax {
    /// A checker before the first byte of a value of `schema`.
    pub fn new(schema: &Schema) -> SchemaSyntax {
        let mut frames = [Frame::Start(schema.root()); MAX_FRAMES];
        frames[0] = Frame::Start(schema.root());
        SchemaSyntax {
            frames,
            len: 1,
            done: false,
            space: Whitespace::default(),
        }
    }

    /// Whether the bytes so far are one whole value of the schema.
    pub fn is_complete(&self) -> bool {
        self.done
    }

    /// Whether the text is inside a string value with no escape or character pending
    /// ([`JsonSyntax::in_plain_string`]; a key is matched as a literal, not read as a string).
    pub fn in_plain_string(&self) -> bool {
        matches!(self.top(), Some(Frame::Value { syntax, .. }) if syntax.in_plain_string())
    }

    /// The state after `bytes`, or `None` if some byte of them cannot continue the text.
    pub fn after(mut self, schema: &Schema, bytes: &[u8]) -> Option<SchemaSyntax> {
        for &b in bytes {
            if !self.push(schema, b) {
                return None;
            }
        }
        Some(self)
    }

    fn top(&self) -> Option<Frame> {
        (self.len > 0).then(|| self.frames[usize::from(self.len) - 1])
    }

    fn set_top(&mut self, frame: Frame) {
        self.frames[usize::from(self.len) - 1] = frame;
    }

    fn open(&mut self, frame: Frame) -> bool {
        if usize::from(self.len) == MAX_FRAMES {
            return false;
        }
        self.frames[usize::from(self.len)] = frame;
        self.len += 1;
        true
    }

    /// The top frame's value is complete: drop it (its parent already expects what follows).
    fn close(&mut self) {
        self.len -= 1;
        self.done = self.len == 0;
    }

    /// A literal value is complete with its `index`-th text: drop it, and tell an object
    /// holding it which text it was.
    fn close_literal(&mut self, index: usize) {
        self.close();
        if let Some(Frame::Object { node, next, at, .. }) = self.top() {
            self.set_top(Frame::Object {
                node,
                next,
                at,
                tag: index as u16,
            });
        }
    }

    /// Feed one byte; false when it cannot continue the text (the state is then unspecified:
    /// check on a copy, as [`SchemaSyntax::after`] does).
    pub fn push(&mut self, schema: &Schema, byte: u8) -> bool {
        let Some(top) = self.top() else {
            return false;
        };
        match top {
            Frame::Start(node) => {
                self.len -= 1;
                self.begin(schema, node, byte, 0)
            }
            Frame::Value { syntax, integer } => {
                let mut next = syntax;
                let refused = integer && syntax.in_number() && matches!(byte, b'.' | b'e' | b'E');
                if !refused && next.push(byte) {
                    if next.is_complete() {
                        self.close();
                    } else {
                        self.set_top(Frame::Value {
                            syntax: next,
                            integer,
                        });
                    }
                    true
                } else if syntax.can_end() {
                    // A number ends at the first byte after it, which belongs to the parent.
                    self.close();
                    !self.done && self.push(schema, byte)
                } else {
                    false
                }
            }
            Frame::Literal {
                node,
                lo,
                hi,
                matched,
            } => {
                let Node::Literals(texts) = schema.node(node) else {
                    unreachable!("a literal frame's node is a literal set")
                };
                let at = usize::from(matched);
                let range = usize::from(lo)..usize::from(hi);
                // The range shares its first `at` bytes and is sorted: a text of exactly `at`
                // bytes first, then by byte `at`. Two binary searches find the texts that
                // continue with `byte` (a hostile enum of thousands of texts costs a mask
                // O(log texts) per byte, not a scan).
                let texts_here = &texts[range.clone()];
                let below = |t: &Vec<u8>| t.len() <= at || t[at] < byte;
                let through = |t: &Vec<u8>| t.len() <= at || t[at] <= byte;
                let (first, end) = (
                    range.start + texts_here.partition_point(below),
                    range.start + texts_here.partition_point(through),
                );
                match (first < end).then_some((first, end)) {
                    Some((lo, hi)) => {
                        if hi - lo == 1 && texts[lo].len() == at + 1 {
                            self.close_literal(lo);
                        } else {
                            self.set_top(Frame::Literal {
                                node,
                                lo: lo as u16,
                                hi: hi as u16,
                                matched: matched + 1,
                            });
                        }
                        true
                    }
                    // A text that is whole here ends (a shorter text sorts first).
                    None if texts[range.start].len() == at => {
                        self.close_literal(range.start);
                        !self.done && self.push(schema, byte)
                    }
                    None => false,
                }
            }
            Frame::Array { node, count, open } => {
                let Node::Array {
                    items,
                    min_items,
                    max_items,
                } = *schema.node(node)
                else {
                    unreachable!("an array frame's node is an array")
                };
                if Whitespace::is_space(byte) {
                    return self.space.push(byte);
                }
                self.space = Whitespace::default();
                match (open, byte) {
                    (true, b']') if count == 0 && min_items == 0 => {
                        self.close();
                        true
                    }
                    (true, _) if count < max_items => {
                        self.set_top(Frame::Array {
                            node,
                            count: count + 1,
                            open: false,
                        });
                        self.begin(schema, items, byte, 0)
                    }
                    (false, b',') if count < max_items => {
                        self.set_top(Frame::Array {
                            node,
                            count,
                            open: true,
                        });
                        true
                    }
                    (false, b']') if count >= min_items => {
                        self.close();
                        true
                    }
                    _ => false,
                }
            }
            Frame::Object {
                node,
                next,
                at,
                tag,
            } => self.object(schema, node, next, at, tag, byte),
        }
    }

    fn object(
        &mut self,
        schema: &Schema,
        node: NodeId,
        next: u16,
        at: ObjectAt,
        tag: u16,
        byte: u8,
    ) -> bool {
        let Node::Object(props) = schema.node(node) else {
            unreachable!("an object frame's node is an object")
        };
        let next_at = usize::from(next);
        if let ObjectAt::InKey {
            candidates,
            matched,
        } = at
        {
            let candidates = u64::from(candidates[0]) | u64::from(candidates[1]) << 32;
            let mut left = 0u64;
            let mut whole = None;
            for (i, p) in props.iter().enumerate() {
                if candidates & (1 << i) != 0 && p.key.get(usize::from(matched)) == Some(&byte) {
                    left |= 1 << i;
                    if p.key.len() == usize::from(matched) + 1 {
                        whole = Some(i);
                    }
                }
            }
            let (next, at) = match whole {
                // Keys are quoted texts, so a whole one is the only candidate left.
                Some(i) => (i as u16 + 1, ObjectAt::Colon),
                None if left != 0 => (
                    next,
                    ObjectAt::InKey {
                        candidates: halves(left),
                        matched: matched + 1,
                    },
                ),
                None => return false,
            };
            self.set_top(Frame::Object {
                node,
                next,
                at,
                tag,
            });
            return true;
        }
        if Whitespace::is_space(byte) {
            return self.space.push(byte);
        }
        self.space = Whitespace::default();
        let rest_optional = props[next_at..].iter().all(|p| !p.required);
        let at = match (at, byte) {
            (ObjectAt::Key { .. }, b'"') => {
                // The next property, or any later one up to the first that is required.
                let last = props[next_at..]
                    .iter()
                    .position(|p| p.required)
                    .map_or(props.len(), |r| next_at + r + 1);
                let candidates = (next_at..last).fold(0u64, |m, i| m | 1 << i);
                if candidates == 0 {
                    return false;
                }
                ObjectAt::InKey {
                    candidates: halves(candidates),
                    matched: 1,
                }
            }
            (ObjectAt::Key { comma: false } | ObjectAt::Next, b'}') if rest_optional => {
                self.close();
                return true;
            }
            (ObjectAt::Colon, b':') => ObjectAt::Value,
            (ObjectAt::Value, _) => {
                self.set_top(Frame::Object {
                    node,
                    next,
                    at: ObjectAt::Next,
                    tag,
                });
                return self.begin(schema, props[next_at - 1].value, byte, 0);
            }
            (ObjectAt::Next, b',') if next_at < props.len() => ObjectAt::Key { comma: true },
            _ => return false,
        };
        self.set_top(Frame::Object {
            node,
            next,
            at,
            tag,
        });
        true
    }

    /// Begin a value of `node` with its first byte.
    fn begin(&mut self, schema: &Schema, node: NodeId, byte: u8, hops: u32) -> bool {
        if !schema.may_start(node, byte) || hops > 64 {
            return false;
        }
        let value = |integer| Frame::Value {
            syntax: JsonSyntax::value(),
            integer,
        };
        match schema.node(node) {
            Node::AnyOf(alts) => match alts.iter().find(|a| schema.may_start(**a, byte)) {
                Some(&alt) => self.begin(schema, alt, byte, hops + 1),
                None => false,
            },
            Node::Object(_) => self.open(Frame::Object {
                node,
                next: 0,
                at: ObjectAt::Key { comma: false },
                tag: NO_TAG,
            }),
            Node::ByTag(arms) => match self.top() {
                Some(Frame::Object { tag, .. }) if tag != NO_TAG => {
                    match arms.get(usize::from(tag)) {
                        Some(&arm) => self.begin(schema, arm, byte, hops + 1),
                        None => false,
                    }
                }
                _ => false,
            },
            Node::Array { .. } => self.open(Frame::Array {
                node,
                count: 0,
                open: true,
            }),
            Node::Literals(texts) => {
                self.open(Frame::Literal {
                    node,
                    lo: 0,
                    hi: texts.len() as u16,
                    matched: 0,
                }) && self.push(schema, byte)
            }
            Node::AnyObject => {
                self.open(Frame::Value {
                    syntax: JsonSyntax::new(),
                    integer: false,
                }) && self.push(schema, byte)
            }
            Node::Integer => self.open(value(true)) && self.push(schema, byte),
            Node::Any | Node::String | Node::Number | Node::Boolean | Node::Null => {
                self.open(value(false)) && self.push(schema, byte)
            }
            Node::Pending => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_schema::{SchemaError, SchemaValue};
    use crate::json_syntax::tests::random_walk;
    use proptest::prelude::*;
    use serde_json::Value;

    fn schema(json: &str) -> Result<Schema, SchemaError> {
        Schema::compile(&serde_json::from_str::<SchemaValue>(json).unwrap())
    }

    /// Properties named in alphabetical order, so that serde_json (which sorts object keys)
    /// writes them in the schema's order.
    const PET: &str = r##"{
        "type": "object",
        "properties": {
            "a_name": {"type": "string", "description": "ignored"},
            "b_age": {"type": "integer"},
            "c_kind": {"enum": ["cat", "dog", "catfish", 7, null]},
            "d_tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "e_owner": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "f_weight": {"type": ["number", "boolean"]},
            "g_extra": {},
            "h_home": {"$ref": "#/$defs/home"}
        },
        "required": ["a_name", "b_age", "c_kind"],
        "additionalProperties": false,
        "$defs": {"home": {"type": "object", "properties": {
            "city": {"type": "string"}, "next": {"anyOf": [{"$ref": "#/$defs/home"}, {"type": "null"}]}},
            "required": ["city"]}}
    }"##;

    fn complete(s: &Schema, text: &str) -> bool {
        SchemaSyntax::new(s)
            .after(s, text.as_bytes())
            .is_some_and(|x| x.is_complete())
    }

    #[test]
    fn a_tagged_value_follows_the_arm_its_tag_names() {
        let arm = |json: &str| serde_json::from_str::<SchemaValue>(json).unwrap();
        let (point, count, tree) = (
            arm(
                r#"{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}"#,
            ),
            arm(r#"{"type": "integer"}"#),
            // Its own $defs, and a name that is a prefix of another arm's.
            arm(
                r##"{"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties":
                {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}"##,
            ),
        );
        let s = Schema::tagged(
            "kind",
            "value",
            &[("point", &point), ("point_count", &count), ("tree", &tree)],
        )
        .unwrap();
        for (text, ok) in [
            (r#"{"kind":"point","value":{"x":3}}"#, true),
            (r#"{"kind": "point_count", "value": 12}"#, true),
            (r#"{"kind":"tree","value":{"kids":[{"kids":[]},{}]}}"#, true),
            (r#"{"kind":"point","value":12}"#, false),
            (r#"{"kind":"point_count","value":{"x":3}}"#, false),
            (r#"{"kind":"tree","value":{"kids":[{"x":1}]}}"#, false),
            (r#"{"kind":"points","value":{"x":3}}"#, false),
            (r#"{"value":12,"kind":"point_count"}"#, false),
            (r#"{"kind":"point"}"#, false),
        ] {
            assert_eq!(complete(&s, text), ok, "{text}");
        }
        assert!(Schema::tagged("k", "v", &[]).is_err());
        assert!(Schema::tagged("k", "v", &[("a", &count), ("a", &count)]).is_err());
    }

    #[test]
    fn instances_of_the_schema_are_complete_exactly_at_their_end() {
        let s = schema(PET).unwrap();
        for text in [
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat"}"##,
            r##"{"a_name": "Tom", "b_age": -12, "c_kind": "catfish", "d_tags": [], "e_owner": null}"##,
            r##"{"a_name":"","b_age":0,"c_kind":7,"d_tags":["a","b","c"],"e_owner":"Ann","f_weight":1.5e3}"##,
            r##"{"a_name":"x","b_age":1,"c_kind":null,"f_weight":true,"g_extra":{"any":[1,{}]}}"##,
            r##"{"a_name":"x","b_age":1,"c_kind":"dog","h_home":{"city":"Oslo","next":{"city":"Bergen","next":null}}}"##,
            "{\n  \"a_name\": \"Tom\",\n  \"b_age\": 3,\n  \"c_kind\": \"cat\"\n}",
        ] {
            assert!(complete(&s, text), "{text}");
            for end in 0..text.len() - 1 {
                let p = SchemaSyntax::new(&s).after(&s, &text.as_bytes()[..end]);
                assert!(p.is_some_and(|p| !p.is_complete()), "{text} at {end}");
            }
        }
    }

    #[test]
    fn what_the_schema_forbids_is_refused() {
        let s = schema(PET).unwrap();
        for text in [
            r##"{"a_name":"Tom","c_kind":"cat"}"##, // a required one missing
            r##"{"b_age":3,"a_name":"Tom","c_kind":"cat"}"##, // out of order
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat","zz":1}"##, // not a property
            r##"{"a_name":"Tom","b_age":3.5,"c_kind":"cat"}"##, // not an integer
            r##"{"a_name":"Tom","b_age":3e2,"c_kind":"cat"}"##, // nor this
            r##"{"a_name":"Tom","b_age":"3","c_kind":"cat"}"##, // a string
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cow"}"##, // not in the enum
            r##"{"a_name":"Tom","b_age":3,"c_kind":"ca"}"##, // a prefix of one
            r##"{"a_name":"Tom","b_age":3,"c_kind":77}"##, // a longer number
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat","d_tags":["a","b","c","d"]}"##,
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat","d_tags":[1]}"##,
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat","e_owner":5}"##,
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat","f_weight":null}"##,
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat","h_home":{"next":null}}"##,
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat",}"##,
            r##"{"a_name":"Tom","b_age":3,"c_kind":"cat"} "##,
            r##" {"a_name":"Tom","b_age":3,"c_kind":"cat"}"##,
        ] {
            assert!(!complete(&s, text), "{text}");
        }
    }

    #[test]
    fn schemas_outside_the_subset_are_refused_naming_why() {
        for (json, says) in [
            (r##"{"type": "string"}"##, "root"),
            (
                r##"{"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}"##,
                "pattern",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}}"##,
                "minimum",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}"##,
                "format",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}}}"##,
                "start differently",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}}"##,
                "$ref",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"allOf": [{}]}}}"##,
                "allOf",
            ),
            (
                r##"{"type": "object", "properties": {}, "additionalProperties": true}"##,
                "additionalProperties",
            ),
            (
                r##"{"type": "object", "properties": {"a": {}}, "required": ["b"]}"##,
                "\"b\"",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}}"##,
                "minItems",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"type": "decimal"}}}"##,
                "decimal",
            ),
            (
                r##"{"type": "object", "properties": {"a": false}}"##,
                "object or true",
            ),
            (
                r##"{"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}"##,
                "itself",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"enum": ["x"], "pattern": "y"}}}"##,
                "pattern",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"anyOf": [{"type": "null"}], "minimum": 1}}}"##,
                "minimum",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"$ref": "#/$defs/b", "maxLength": 1}}, "$defs": {"b": {}}}"##,
                "maxLength",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"type": "integer", "enum": ["x"]}}}"##,
                "enum",
            ),
            (
                r##"{"type": "object", "properties": {"a": {"type": []}}}"##,
                "at least one",
            ),
        ] {
            let e = schema(json).unwrap_err();
            assert!(e.to_string().contains(says), "{json}: {e}");
        }
        // A chain of references deeper than the compiler recurses (the JSON is shallow).
        let chain: Vec<String> = (0..200)
            .map(|i| {
                format!(
                    r##""a{i}": {{"anyOf": [{{"$ref": "#/$defs/a{}"}}]}}"##,
                    i + 1
                )
            })
            .collect();
        let e = schema(&format!(
            r##"{{"properties": {{"x": {{"$ref": "#/$defs/a0"}}}}, "$defs": {{{}, "a200": {{}}}}}}"##,
            chain.join(",")
        ));
        assert!(e.unwrap_err().to_string().contains("nested more than 128"));
        let many: Vec<String> = (0..65).map(|i| format!(r##""p{i}": {{}}"##)).collect();
        let e = schema(&format!(
            r##"{{"type": "object", "properties": {{{}}}}}"##,
            many.join(",")
        ));
        assert!(e.unwrap_err().to_string().contains("64"));
    }

    #[test]
    fn literal_sets_narrow_by_prefix_and_a_whole_text_ends_where_a_longer_one_could_go_on() {
        let s = schema(r##"{"properties": {"k": {"enum": ["a", "ab", "abc", "b", 1, 12, 123, [1], {"x": null}]}}}"##).unwrap();
        for v in [
            r#""a""#,
            r#""ab""#,
            r#""abc""#,
            r#""b""#,
            "1",
            "12",
            "123",
            "[1]",
            r#"{"x":null}"#,
        ] {
            assert!(complete(&s, &format!(r#"{{"k":{v}}}"#)), "{v}");
            assert!(complete(&s, &format!(r#"{{"k":{v} }}"#)), "{v}");
        }
        for v in [
            r#""abd""#,
            r#""c""#,
            "124",
            "2",
            "1.0",
            "[1 ]",
            r#"{"x": null}"#,
            r#""""#,
        ] {
            assert!(!complete(&s, &format!(r#"{{"k":{v}}}"#)), "{v}");
        }
        // Thousands of texts sharing a long prefix: each byte is two binary searches.
        let many: Vec<String> = (0..4000)
            .map(|i| format!(r#""{}{i:04}""#, "x".repeat(64)))
            .collect();
        let s = schema(&format!(
            r#"{{"properties": {{"k": {{"enum": [{}]}}}}}}"#,
            many.join(",")
        ))
        .unwrap();
        assert!(complete(
            &s,
            &format!(r#"{{"k":"{}3999"}}"#, "x".repeat(64))
        ));
        assert!(!complete(
            &s,
            &format!(r#"{{"k":"{}4000"}}"#, "x".repeat(64))
        ));
    }

    #[test]
    fn a_type_beside_an_enum_keeps_the_values_of_that_type() {
        let s = schema(r##"{"properties": {"a": {"type": "string", "enum": ["x", 1, null]}}}"##)
            .unwrap();
        assert!(complete(&s, r#"{"a":"x"}"#));
        assert!(!complete(&s, r#"{"a":1}"#));
        assert!(!complete(&s, r#"{"a":null}"#));
        // A root that refers to an object is an object.
        let s = schema(r##"{"$ref": "#/$defs/o", "$defs": {"o": {"properties": {"b": {}}}}}"##)
            .unwrap();
        assert!(complete(&s, r#"{"b":[1]}"#));
    }

    #[test]
    fn properties_keep_the_schema_order_and_optional_ones_may_be_skipped() {
        let s = schema(r##"{"properties": {"z": {"type": "integer"}, "a": {"type": "integer"}, "m": {}}, "required": ["m"]}"##).unwrap();
        assert!(complete(&s, r##"{"z":1,"a":2,"m":3}"##));
        assert!(complete(&s, r##"{"a":2,"m":3}"##));
        assert!(complete(&s, r##"{"m":3}"##));
        assert!(!complete(&s, r##"{"a":2,"z":1,"m":3}"##));
        assert!(!complete(&s, r##"{}"##));
        let any = schema(r##"{"type": "object"}"##).unwrap();
        assert!(complete(&any, r##"{"anything": [1, "two"]}"##));
    }

    /// A small validator of the subset, written apart from the automaton: types, required
    /// and listed properties, enum values, item counts.
    fn valid(v: &Value, s: &Value, root: &Value) -> bool {
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next().unwrap();
            return valid(v, &root["$defs"][name], root);
        }
        if let Some(e) = s.get("enum").and_then(Value::as_array) {
            return e.contains(v);
        }
        if let Some(alts) = s.get("anyOf").and_then(Value::as_array) {
            return alts.iter().any(|a| valid(v, a, root));
        }
        let types: Vec<&str> = match s.get("type") {
            None if s.get("properties").is_some() => vec!["object"],
            None => return true,
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(_) => return false,
        };
        types.iter().any(|t| match (*t, v) {
            ("string", Value::String(_)) | ("boolean", Value::Bool(_)) | ("null", Value::Null) => {
                true
            }
            ("number", Value::Number(_)) => true,
            // An integer beyond 64 bits reads as a float with no fraction.
            ("integer", Value::Number(n)) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            ("array", Value::Array(items)) => {
                let max = s
                    .get("maxItems")
                    .and_then(Value::as_u64)
                    .unwrap_or(u64::MAX);
                let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0);
                (min..=max).contains(&(items.len() as u64))
                    && items
                        .iter()
                        .all(|i| s.get("items").is_none_or(|is| valid(i, is, root)))
            }
            ("object", Value::Object(m)) => {
                let Some(props) = s.get("properties").and_then(Value::as_object) else {
                    return true;
                };
                let required = s.get("required").and_then(Value::as_array);
                m.iter()
                    .all(|(k, x)| props.get(k).is_some_and(|p| valid(x, p, root)))
                    && required
                        .is_none_or(|r| r.iter().all(|k| m.contains_key(k.as_str().unwrap())))
            }
            _ => false,
        })
    }

    fn home() -> impl Strategy<Value = Value> {
        let leaf = "\\PC{0,6}".prop_map(|c| serde_json::json!({"city": c, "next": null}));
        leaf.prop_recursive(3, 8, 1, |inner| {
            ("\\PC{0,6}", inner).prop_map(|(c, n)| serde_json::json!({"city": c, "next": n}))
        })
    }

    fn pet() -> impl Strategy<Value = Value> {
        let kind = prop::sample::select(vec![
            serde_json::json!("cat"),
            serde_json::json!("dog"),
            serde_json::json!("catfish"),
            serde_json::json!(7),
            Value::Null,
        ]);
        (
            "\\PC{0,10}",
            any::<i64>(),
            kind,
            prop::option::of(prop::collection::vec("\\PC{0,4}", 0..=3)),
            prop::option::of(prop::option::of("\\PC{0,4}")),
            prop::option::of(prop_oneof![
                (-1e9f64..1e9).prop_map(|f| serde_json::json!(f)),
                any::<bool>().prop_map(Value::Bool)
            ]),
            prop::option::of(prop_oneof![
                Just(serde_json::json!({"x": [1, "y", null]})),
                Just(serde_json::json!(-2.5)),
                Just(Value::Null)
            ]),
            prop::option::of(home()),
        )
            .prop_map(|(name, age, kind, tags, owner, weight, extra, home)| {
                let mut o = serde_json::Map::new();
                o.insert("a_name".into(), name.into());
                o.insert("b_age".into(), age.into());
                o.insert("c_kind".into(), kind);
                if let Some(t) = tags {
                    o.insert("d_tags".into(), t.into());
                }
                if let Some(w) = owner {
                    o.insert("e_owner".into(), w.map_or(Value::Null, Value::String));
                }
                if let Some(w) = weight {
                    o.insert("f_weight".into(), w);
                }
                if let Some(x) = extra {
                    o.insert("g_extra".into(), x);
                }
                if let Some(h) = home {
                    o.insert("h_home".into(), h);
                }
                Value::Object(o)
            })
    }

    proptest! {
        /// Every instance of the schema, compact or pretty (serde_json writes the keys in
        /// the schema's order here), is accepted and complete exactly at its end.
        #[test]
        fn every_instance_is_accepted(value in pet()) {
            let s = schema(PET).unwrap();
            for text in [serde_json::to_string(&value).unwrap(),
                         serde_json::to_string_pretty(&value).unwrap()] {
                prop_assert!(complete(&s, &text), "{}", text);
                let before = SchemaSyntax::new(&s).after(&s, &text.as_bytes()[..text.len() - 1]);
                prop_assert!(before.is_some_and(|b| !b.is_complete()));
            }
        }
    }

    proptest! {
        /// A random walk through what the checker accepts (an alphabet of JSON's bytes and
        /// the schema's letters): every prefix reached is JSON that serde_json reads to its
        /// end, and every text the checker calls complete is an object that the validator
        /// above accepts.
        #[test]
        fn accepted_text_is_valid_for_an_independent_validator(
            choices in prop::collection::vec(any::<u8>(), 0..160),
        ) {
            const ALPHABET: &[u8] =
                b"{}[]:,\" \n\t-.0123456789eEabcdefghiklmnorstuwxyz_\\\x01\xc3\xa9";
            let s = schema(PET).unwrap();
            let root: Value = serde_json::from_str(PET).unwrap();
            let walk = random_walk(SchemaSyntax::new(&s), ALPHABET, &choices, |x, b| x.after(&s, &[b]));
            for (text, state) in walk {
                match serde_json::from_slice::<Value>(&text) {
                    Ok(v) => {
                        prop_assert!(state.is_complete(), "{:?}", String::from_utf8_lossy(&text));
                        prop_assert!(valid(&v, &root, &root), "{}", v);
                    }
                    Err(e) if e.to_string().starts_with("number out of range") => {}
                    Err(e) => {
                        prop_assert!(!state.is_complete());
                        prop_assert!(e.is_eof(), "{:?}: {}", String::from_utf8_lossy(&text), e);
                    }
                }
            }
        }
    }
}
