//! JSON Schemas compiled for constrained generation (OpenAI's `response_format:
//! {"type": "json_schema", ...}`): the subset that a left-to-right generator can hold text to
//! exactly, compiled into a graph of [`Node`]s that [`crate::schema_syntax`] walks byte by
//! byte. A schema outside the subset is refused with a [`SchemaError`] naming the keyword — a
//! constraint that is not enforced is never accepted silently.
//!
//! The subset (OpenAI's structured-outputs subset, which is what clients send):
//! - `type`: `object`, `array`, `string`, `number`, `integer`, `boolean`, `null`, or a list
//!   of them;
//! - objects: `properties` (generated in the order the schema lists them, as OpenAI and
//!   llama.cpp generate them; a property not in `required` may be left out), `required`,
//!   `additionalProperties: false` (the default here: only the listed properties); an object
//!   without `properties` is any object;
//! - arrays: `items` (any value without it), `minItems`, `maxItems`;
//! - `enum` and `const` (the values' compact JSON text, exactly);
//! - `anyOf` and `oneOf`, when the alternatives start with different bytes (a string and null,
//!   an object and an array, ...), which also makes them exclusive, as `oneOf` asks;
//! - `$ref` to `#/$defs/NAME` or `#/definitions/NAME` of the root schema, recursion included;
//! - `true` or `{}` (any value); annotations (`title`, `description`, `default`, `examples`,
//!   `$schema`, `$id`, `$comment`, `deprecated`, `readOnly`, `writeOnly`) are ignored.
//!
//! Refused: string, number and array validation beyond that (`pattern`, `format`,
//! `minLength`, `minimum`, `multipleOf`, `uniqueItems`, ...), `allOf`, `not`, conditionals,
//! `additionalProperties` other than `false` beside `properties`, `patternProperties`, remote
//! references, and more than 64 properties in one object. The root must be an object (as
//! OpenAI requires), so that the text is complete exactly when it closes.
//!
//! The schema is parsed into [`SchemaValue`], which keeps the order of object members
//! (`serde_json::Value` sorts them).
//!
//! Cost: compiling visits each schema once (bounded by the request body's size and
//! [`MAX_NODES`]); the first-byte sets take as many passes over the nodes as the longest chain
//! of references (at most [`MAX_NESTING`]). The graph holds each property's key as its JSON
//! text and each literal's text.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Most properties of one object schema (a candidate set of keys is a 64-bit mask).
pub const MAX_PROPERTIES: usize = 64;
/// Most nodes a schema compiles to.
pub const MAX_NODES: usize = 4096;
/// Most schemas nested in one another, references followed.
pub const MAX_NESTING: usize = 128;
/// Most values of one `enum`, and most bytes of one literal's or key's JSON text.
pub const MAX_LITERALS: usize = 4096;
pub const MAX_LITERAL_BYTES: usize = 4096;

/// A JSON value that keeps the order of object members.
#[derive(Clone, Debug, PartialEq)]
pub enum SchemaValue {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<SchemaValue>),
    Object(Vec<(String, SchemaValue)>),
}

impl SchemaValue {
    fn get(&self, key: &str) -> Option<&SchemaValue> {
        match self {
            SchemaValue::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The compact JSON text of the value (object members in order).
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out);
        out
    }

    fn write_json(&self, out: &mut String) {
        match self {
            SchemaValue::Null => out.push_str("null"),
            SchemaValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            SchemaValue::Number(n) => out.push_str(&n.to_string()),
            SchemaValue::String(s) => {
                out.push_str(&serde_json::to_string(s).expect("a string serializes"))
            }
            SchemaValue::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write_json(out);
                }
                out.push(']');
            }
            SchemaValue::Object(members) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).expect("a string serializes"));
                    out.push(':');
                    v.write_json(out);
                }
                out.push('}');
            }
        }
    }
}

impl<'de> Deserialize<'de> for SchemaValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SchemaValue, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SchemaValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<SchemaValue, E> {
                Ok(SchemaValue::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<SchemaValue, E> {
                Ok(SchemaValue::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<SchemaValue, E> {
                Ok(SchemaValue::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<SchemaValue, E> {
                Ok(SchemaValue::Number(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<SchemaValue, E> {
                serde_json::Number::from_f64(n)
                    .map(SchemaValue::Number)
                    .ok_or_else(|| E::custom("a number that is not finite"))
            }
            fn visit_str<E>(self, s: &str) -> Result<SchemaValue, E> {
                Ok(SchemaValue::String(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<SchemaValue, E> {
                Ok(SchemaValue::String(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SchemaValue, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element()? {
                    items.push(v);
                }
                Ok(SchemaValue::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SchemaValue, A::Error> {
                let mut members: Vec<(String, SchemaValue)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, SchemaValue>()? {
                    // A repeated key: the last one counts, as in serde_json.
                    members.retain(|(old, _)| *old != k);
                    members.push((k, v));
                }
                Ok(SchemaValue::Object(members))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A node of a compiled schema, by its index.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NodeId(pub u32);

/// What a value must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// Any JSON value.
    Any,
    /// Any JSON object.
    AnyObject,
    /// An object of these properties, in this order.
    Object(Vec<Property>),
    Array {
        items: NodeId,
        min_items: u32,
        max_items: u32,
    },
    String,
    Number,
    Integer,
    Boolean,
    Null,
    /// One of these compact JSON texts, sorted (so texts sharing a prefix are adjacent).
    Literals(Vec<Vec<u8>>),
    /// One of these, told apart by their first byte.
    AnyOf(Vec<NodeId>),
    /// A property's value chosen by the text an earlier literal property of the same object
    /// took: arm `i` for the literal set's `i`-th (sorted) text. No JSON Schema keyword says
    /// this; [`Schema::tagged`] builds it (a function call's arguments chosen by its name).
    ByTag(Vec<NodeId>),
    /// A `$ref` not resolved yet (only while compiling).
    Pending,
}

/// A property of an object node.
#[derive(Clone, Debug, PartialEq)]
pub struct Property {
    /// The key as JSON text, quotes included.
    pub key: Vec<u8>,
    pub value: NodeId,
    pub required: bool,
}

/// Why a schema cannot constrain generation.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message} (at {path})")]
pub struct SchemaError {
    /// Where in the schema (a JSON pointer).
    pub path: String,
    pub message: String,
}

/// A compiled schema (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    nodes: Vec<Node>,
    /// Per node, the bytes a value of it may start with (a 256-bit set).
    first: Vec<[u64; 4]>,
    root: NodeId,
}

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
];

impl Schema {
    /// Compile `schema` (see the module documentation for what is accepted).
    pub fn compile(schema: &SchemaValue) -> Result<Schema, SchemaError> {
        let mut c = Compiler {
            root: schema,
            nodes: Vec::new(),
            refs: HashMap::new(),
            depth: 0,
        };
        let root = c.node(schema, "#")?;
        let mut s = Schema {
            first: vec![[0; 4]; c.nodes.len()],
            nodes: c.nodes,
            root,
        };
        // Through references to what they name (a cycle of them names nothing).
        let mut named = root;
        for _ in 0..s.nodes.len() {
            match s.node(named) {
                Node::AnyOf(alts) if alts.len() == 1 => named = alts[0],
                _ => break,
            }
        }
        if !matches!(s.node(named), Node::Object(_) | Node::AnyObject) {
            return Err(SchemaError {
                path: "#".into(),
                message: "the root schema must be an object (\"type\": \"object\")".into(),
            });
        }
        s.first_bytes()?;
        Ok(s)
    }

    /// An object of two required properties: `tag_key`, one of the arms' names (strings), and
    /// `value_key`, a value of the schema of the arm so named. Each arm's schema is compiled
    /// as a root of its own (its `$ref`s resolve in its own `$defs`); it may be any value's
    /// schema, not only an object's.
    pub fn tagged(
        tag_key: &str,
        value_key: &str,
        arms: &[(&str, &SchemaValue)],
    ) -> Result<Schema, SchemaError> {
        if arms.is_empty() || arms.len() > MAX_LITERALS {
            return Err(err("#", format!("1 to {MAX_LITERALS} arms")));
        }
        let mut arms: Vec<(Vec<u8>, &SchemaValue)> = arms
            .iter()
            .map(|(name, schema)| {
                (
                    SchemaValue::String((*name).to_owned())
                        .to_json()
                        .into_bytes(),
                    *schema,
                )
            })
            .collect();
        arms.sort_by(|a, b| a.0.cmp(&b.0));
        if arms.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(err("#", "two arms of one name".into()));
        }
        let mut nodes = Vec::new();
        let mut arm_ids = Vec::with_capacity(arms.len());
        for (i, (_, schema)) in arms.iter().enumerate() {
            let mut c = Compiler {
                root: schema,
                nodes: std::mem::take(&mut nodes),
                refs: HashMap::new(),
                depth: 1,
            };
            arm_ids.push(c.node(schema, &format!("#/arms/{i}"))?);
            nodes = c.nodes;
        }
        let mut c = Compiler {
            root: arms[0].1,
            nodes,
            refs: HashMap::new(),
            depth: 0,
        };
        let texts = arms.into_iter().map(|(text, _)| text).collect();
        let tag = c.literals(texts, "#")?;
        let value = c.push(Node::ByTag(arm_ids), "#")?;
        let key = |k: &str| {
            serde_json::to_string(k)
                .expect("a string serializes")
                .into_bytes()
        };
        let root = c.push(
            Node::Object(vec![
                Property {
                    key: key(tag_key),
                    value: tag,
                    required: true,
                },
                Property {
                    key: key(value_key),
                    value,
                    required: true,
                },
            ]),
            "#",
        )?;
        let mut s = Schema {
            first: vec![[0; 4]; c.nodes.len()],
            nodes: c.nodes,
            root,
        };
        s.first_bytes()?;
        Ok(s)
    }

    /// The root node.
    pub fn root(&self) -> NodeId {
        self.root
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    /// Whether a value of `id` may start with `byte`.
    pub fn may_start(&self, id: NodeId, byte: u8) -> bool {
        self.first[id.0 as usize][usize::from(byte >> 6)] & (1 << (byte & 63)) != 0
    }

    /// Fill `first` (to a fixed point: references may be recursive) and check that the
    /// alternatives of every `anyOf` start differently.
    fn first_bytes(&mut self) -> Result<(), SchemaError> {
        let set = |bytes: &[u8]| {
            let mut s = [0u64; 4];
            for &b in bytes {
                s[usize::from(b >> 6)] |= 1 << (b & 63);
            }
            s
        };
        let value_start = set(b"{[\"-0123456789tfn");
        loop {
            let mut changed = false;
            for i in 0..self.nodes.len() {
                let new = match &self.nodes[i] {
                    Node::Any => value_start,
                    Node::AnyObject | Node::Object(_) => set(b"{"),
                    Node::Array { .. } => set(b"["),
                    Node::String => set(b"\""),
                    Node::Number | Node::Integer => set(b"-0123456789"),
                    Node::Boolean => set(b"tf"),
                    Node::Null => set(b"n"),
                    Node::Literals(texts) => set(&texts
                        .iter()
                        .filter_map(|t| t.first().copied())
                        .collect::<Vec<_>>()),
                    Node::AnyOf(alts) | Node::ByTag(alts) => alts.iter().fold([0; 4], |acc, a| {
                        let f = self.first[a.0 as usize];
                        std::array::from_fn(|w| acc[w] | f[w])
                    }),
                    Node::Pending => [0; 4],
                };
                if new != self.first[i] {
                    self.first[i] = new;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for node in &self.nodes {
            if let Node::AnyOf(alts) = node {
                let mut seen = [0u64; 4];
                for a in alts {
                    let f = self.first[a.0 as usize];
                    if (0..4).any(|w| seen[w] & f[w] != 0) {
                        return Err(SchemaError {
                            path: "anyOf".into(),
                            message: "anyOf/oneOf alternatives must start differently (a \
                                      string and null, an object and an array, ...); these \
                                      overlap"
                                .into(),
                        });
                    }
                    for w in 0..4 {
                        seen[w] |= f[w];
                    }
                }
            }
        }
        Ok(())
    }
}

struct Compiler<'a> {
    root: &'a SchemaValue,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
    /// Schemas being compiled, nested (references included).
    depth: usize,
}

impl<'a> Compiler<'a> {
    fn push(&mut self, node: Node, path: &str) -> Result<NodeId, SchemaError> {
        if self.nodes.len() == MAX_NODES {
            return Err(err(path, format!("more than {MAX_NODES} schema nodes")));
        }
        self.nodes.push(node);
        Ok(NodeId(self.nodes.len() as u32 - 1))
    }

    fn literals(&mut self, texts: Vec<Vec<u8>>, path: &str) -> Result<NodeId, SchemaError> {
        if texts.len() > MAX_LITERALS || texts.iter().any(|t| t.len() > MAX_LITERAL_BYTES) {
            return Err(err(
                path,
                format!(
                    "at most {MAX_LITERALS} enum values of at most {MAX_LITERAL_BYTES} bytes each"
                ),
            ));
        }
        self.push(Node::Literals(texts), path)
    }

    /// Compile `v`, at most [`MAX_NESTING`] schemas deep: a chain of references is not bounded
    /// by the JSON parser's nesting limit, and each link is a recursive call.
    fn node(&mut self, v: &'a SchemaValue, path: &str) -> Result<NodeId, SchemaError> {
        if self.depth == MAX_NESTING {
            return Err(err(
                path,
                format!("schemas nested more than {MAX_NESTING} deep (references included)"),
            ));
        }
        self.depth += 1;
        let id = self.node_within_depth(v, path);
        self.depth -= 1;
        id
    }

    fn node_within_depth(&mut self, v: &'a SchemaValue, path: &str) -> Result<NodeId, SchemaError> {
        let members = match v {
            SchemaValue::Bool(true) => return self.push(Node::Any, path),
            SchemaValue::Object(m) => m,
            _ => return Err(err(path, "a schema must be an object or true".into())),
        };
        if let Some(r) = v.get("$ref") {
            check_keywords(members, &["$ref", "$defs", "definitions"], path)?;
            return self.reference(r, path);
        }
        let literals = match (v.get("const"), v.get("enum")) {
            (Some(_), Some(_)) => return Err(err(path, "both const and enum".into())),
            (Some(c), None) => Some(vec![c]),
            (None, Some(SchemaValue::Array(values))) => Some(values.iter().collect()),
            (None, Some(_)) => return Err(err(path, "enum must be an array".into())),
            (None, None) => None,
        };
        if let Some(values) = literals {
            check_keywords(members, &["const", "enum", "type"], path)?;
            // A `type` beside them keeps the values of that type.
            let types = type_names(v, path)?;
            let mut texts: Vec<Vec<u8>> = values
                .into_iter()
                .filter(|x| {
                    types
                        .as_ref()
                        .is_none_or(|t| t.iter().any(|t| has_type(x, t)))
                })
                .map(|x| x.to_json().into_bytes())
                .collect();
            if texts.is_empty() {
                return Err(err(
                    path,
                    "no enum or const value (of the schema's type)".into(),
                ));
            }
            texts.sort();
            texts.dedup();
            return self.literals(texts, path);
        }
        if v.get("anyOf").is_some() && v.get("oneOf").is_some() {
            return Err(err(path, "both anyOf and oneOf".into()));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = v.get(key) {
                let SchemaValue::Array(alts) = alts else {
                    return Err(err(path, format!("{key} must be an array")));
                };
                if alts.is_empty() {
                    return Err(err(path, format!("{key} must not be empty")));
                }
                check_keywords(members, &[key, "$defs", "definitions"], path)?;
                let ids = alts
                    .iter()
                    .enumerate()
                    .map(|(i, a)| self.node(a, &format!("{path}/{key}/{i}")))
                    .collect::<Result<Vec<_>, _>>()?;
                return self.push(Node::AnyOf(ids), path);
            }
        }
        let Some(types) = type_names(v, path)? else {
            // No type: an object if it lists properties, else any value.
            if v.get("properties").is_some() {
                return self.typed("object", v, members, path);
            }
            check_keywords(members, &["$defs", "definitions"], path)?;
            return self.push(Node::Any, path);
        };
        if types.is_empty() {
            return Err(err(path, "type must name at least one type".into()));
        }
        let mut ids = Vec::new();
        for t in &types {
            ids.push(self.typed(t, v, members, path)?);
        }
        match ids.as_slice() {
            [one] => Ok(*one),
            _ => self.push(Node::AnyOf(ids), path),
        }
    }

    fn typed(
        &mut self,
        t: &str,
        v: &'a SchemaValue,
        members: &'a [(String, SchemaValue)],
        path: &str,
    ) -> Result<NodeId, SchemaError> {
        let node = match t {
            "object" => {
                check_keywords(
                    members,
                    &[
                        "type",
                        "properties",
                        "required",
                        "additionalProperties",
                        "$defs",
                        "definitions",
                    ],
                    path,
                )?;
                match v.get("additionalProperties") {
                    None | Some(SchemaValue::Bool(false)) => {}
                    Some(_) if v.get("properties").is_none() => {}
                    Some(_) => {
                        return Err(err(
                            path,
                            "additionalProperties other than false beside properties is not \
                             supported"
                                .into(),
                        ));
                    }
                }
                let Some(props) = v.get("properties") else {
                    return self.push(Node::AnyObject, path);
                };
                let SchemaValue::Object(props) = props else {
                    return Err(err(path, "properties must be an object".into()));
                };
                if props.len() > MAX_PROPERTIES {
                    return Err(err(
                        path,
                        format!("more than {MAX_PROPERTIES} properties in one object"),
                    ));
                }
                let required: Vec<&str> = match v.get("required") {
                    None => Vec::new(),
                    Some(SchemaValue::Array(r)) => r
                        .iter()
                        .map(|x| match x {
                            SchemaValue::String(s) => Ok(s.as_str()),
                            _ => Err(err(path, "required must list property names".into())),
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => return Err(err(path, "required must be an array".into())),
                };
                if let Some(missing) = required
                    .iter()
                    .find(|r| !props.iter().any(|(k, _)| k == *r))
                {
                    return Err(err(
                        path,
                        format!("required property {missing:?} is not in properties"),
                    ));
                }
                if let Some((k, _)) = props.iter().find(|(k, _)| k.len() > MAX_LITERAL_BYTES) {
                    return Err(err(path, format!("a property name of {} bytes", k.len())));
                }
                let at = self.push(Node::Pending, path)?;
                let mut out = Vec::new();
                for (k, pv) in props {
                    let value = self.node(pv, &format!("{path}/properties/{k}"))?;
                    out.push(Property {
                        key: serde_json::to_string(k)
                            .expect("a string serializes")
                            .into_bytes(),
                        value,
                        required: required.contains(&k.as_str()),
                    });
                }
                self.nodes[at.0 as usize] = Node::Object(out);
                return Ok(at);
            }
            "array" => {
                check_keywords(members, &["type", "items", "minItems", "maxItems"], path)?;
                let count = |key: &str, default: u32| match v.get(key) {
                    None => Ok(default),
                    Some(SchemaValue::Number(n)) => n
                        .as_u64()
                        .map(|n| n.min(u64::from(u32::MAX)) as u32)
                        .ok_or_else(|| err(path, format!("{key} must be a whole number"))),
                    Some(_) => Err(err(path, format!("{key} must be a whole number"))),
                };
                let (min_items, max_items) = (count("minItems", 0)?, count("maxItems", u32::MAX)?);
                if min_items > max_items {
                    return Err(err(path, "minItems is above maxItems".into()));
                }
                let at = self.push(Node::Pending, path)?;
                let items = match v.get("items") {
                    None => self.push(Node::Any, path)?,
                    Some(i) => self.node(i, &format!("{path}/items"))?,
                };
                self.nodes[at.0 as usize] = Node::Array {
                    items,
                    min_items,
                    max_items,
                };
                return Ok(at);
            }
            "string" => Node::String,
            "number" => Node::Number,
            "integer" => Node::Integer,
            "boolean" => Node::Boolean,
            "null" => Node::Null,
            other => return Err(err(path, format!("unknown type {other:?}"))),
        };
        check_keywords(members, &["type"], path)?;
        self.push(node, path)
    }

    fn reference(&mut self, r: &SchemaValue, path: &str) -> Result<NodeId, SchemaError> {
        let SchemaValue::String(r) = r else {
            return Err(err(path, "$ref must be a string".into()));
        };
        if let Some(&id) = self.refs.get(r.as_str()) {
            return Ok(id);
        }
        let target = ["#/$defs/", "#/definitions/"].iter().find_map(|prefix| {
            let name = r.strip_prefix(prefix)?;
            self.root.get(&prefix[2..prefix.len() - 1])?.get(name)
        });
        let Some(target) = target else {
            return Err(err(
                path,
                format!("$ref {r:?} is not #/$defs/NAME or #/definitions/NAME of this schema"),
            ));
        };
        // A placeholder first, so a recursive reference finds it; filled with what the
        // target compiles to (a node of its own, so the references all point here).
        let at = self.push(Node::Pending, path)?;
        self.refs.insert(r.clone(), at);
        let id = self.node(target, r)?;
        self.nodes[at.0 as usize] = match &self.nodes[id.0 as usize] {
            Node::Pending => return Err(err(path, format!("$ref {r:?} refers only to itself"))),
            _ => Node::AnyOf(vec![id]),
        };
        Ok(at)
    }
}

/// The names in `type` (a string or a list of strings), if it is there.
fn type_names<'v>(v: &'v SchemaValue, path: &str) -> Result<Option<Vec<&'v str>>, SchemaError> {
    let bad = || err(path, "type must be a string or strings".into());
    match v.get("type") {
        None => Ok(None),
        Some(SchemaValue::String(t)) => Ok(Some(vec![t.as_str()])),
        Some(SchemaValue::Array(ts)) => ts
            .iter()
            .map(|t| match t {
                SchemaValue::String(t) => Ok(t.as_str()),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// Whether `value` is of JSON Schema type `name`.
fn has_type(value: &SchemaValue, name: &str) -> bool {
    match (name, value) {
        ("null", SchemaValue::Null)
        | ("boolean", SchemaValue::Bool(_))
        | ("number", SchemaValue::Number(_))
        | ("string", SchemaValue::String(_))
        | ("array", SchemaValue::Array(_))
        | ("object", SchemaValue::Object(_)) => true,
        ("integer", SchemaValue::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

fn err(path: &str, message: String) -> SchemaError {
    SchemaError {
        path: path.to_owned(),
        message,
    }
}

/// Refuse keywords a generator would not enforce: everything but `allowed` and annotations.
fn check_keywords(
    members: &[(String, SchemaValue)],
    allowed: &[&str],
    path: &str,
) -> Result<(), SchemaError> {
    for (k, _) in members {
        if !allowed.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
            return Err(err(
                path,
                format!("the keyword {k:?} is not supported here (not enforced)"),
            ));
        }
    }
    Ok(())
}
