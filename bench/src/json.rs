//! A minimal JSON writer for `-J`, and reading documents back (through serde_json) for the
//! encryption canary: its phases' results and the library's encryption reports.

use std::fmt::Write;

#[derive(Clone, Debug)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Int(i64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn obj(fields: Vec<(&str, Json)>) -> Json {
        Json::Obj(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |out: &mut String, d: usize| {
            out.push('\n');
            for _ in 0..d {
                out.push_str("  ");
            }
        };
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Json::Num(x) => {
                if x.is_finite() {
                    let _ = write!(out, "{x}");
                } else {
                    out.push_str("null");
                }
            }
            Json::Str(s) => escape(out, s),
            Json::Arr(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, it) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    pad(out, depth + 1);
                    it.write(out, depth + 1);
                }
                pad(out, depth);
                out.push(']');
            }
            Json::Obj(fields) => {
                if fields.is_empty() {
                    out.push_str("{}");
                    return;
                }
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    pad(out, depth + 1);
                    escape(out, k);
                    out.push_str(": ");
                    v.write(out, depth + 1);
                }
                pad(out, depth);
                out.push('}');
            }
        }
    }
}

/// Accessors for reading documents back (None when the value has another shape).
impl Json {
    /// A field of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Json::Num(x) => Some(x),
            Json::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Json::Int(i) => Some(i),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Json::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_arr(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(items) => Some(items),
            _ => None,
        }
    }

    /// Parses one JSON document (serde_json; object fields keep their order). Integers that
    /// fit an i64 become `Int`, other numbers `Num`.
    pub fn parse(text: &str) -> Result<Json, String> {
        serde_json::from_str::<serde_json::Value>(text).map(Json::from).map_err(|e| format!("invalid JSON: {e}"))
    }
}

impl From<serde_json::Value> for Json {
    fn from(value: serde_json::Value) -> Json {
        use serde_json::Value;
        match value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Json::Int(i),
                None => n.as_f64().map_or(Json::Null, Json::Num),
            },
            Value::String(s) => Json::Str(s),
            Value::Array(items) => Json::Arr(items.into_iter().map(Json::from).collect()),
            Value::Object(fields) => Json::Obj(fields.into_iter().map(|(k, v)| (k, Json::from(v))).collect()),
        }
    }
}

fn escape(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let j = Json::obj(vec![
            ("a", Json::Int(1)),
            ("b", Json::str("x\"y\n")),
            ("c", Json::Arr(vec![Json::Null, Json::Num(0.5), Json::Bool(true)])),
            ("d", Json::Num(f64::NAN)),
        ]);
        assert_eq!(
            j.render(),
            "{\n  \"a\": 1,\n  \"b\": \"x\\\"y\\n\",\n  \"c\": [\n    null,\n    0.5,\n    true\n  ],\n  \"d\": null\n}\n"
        );
    }

    #[test]
    fn parses_what_it_renders() {
        let j = Json::obj(vec![
            ("a", Json::Int(-3)),
            ("b", Json::str("x\"y\n\u{1}é")),
            ("c", Json::Arr(vec![Json::Null, Json::Num(0.5), Json::Bool(true), Json::Num(1e-7)])),
            ("d", Json::obj(vec![])),
            ("e", Json::Arr(vec![])),
        ]);
        let back = Json::parse(&j.render()).unwrap();
        assert_eq!(back.render(), j.render());
        assert_eq!(back.get("a").and_then(Json::as_i64), Some(-3));
        assert_eq!(back.get("b").and_then(Json::as_str), Some("x\"y\n\u{1}é"));
        assert_eq!(back.get("c").and_then(Json::as_arr).map(|a| a.len()), Some(4));
        assert!(back.get("missing").is_none());
    }

    #[test]
    fn parses_compact_library_reports() {
        let j =
            Json::parse(r#"{"n":{"count":2,"security":[{"encrypted":true}]},"x":1.5e3,"s":"\ud83d\ude00\/"}"#).unwrap();
        assert_eq!(j.get("n").and_then(|n| n.get("count")).and_then(Json::as_i64), Some(2));
        assert_eq!(j.get("x").and_then(Json::as_f64), Some(1500.0));
        assert_eq!(j.get("s").and_then(Json::as_str), Some("\u{1f600}/"));
    }

    #[test]
    fn rejects_malformed_documents() {
        for bad in ["", "{", "[1,]", "{\"a\" 1}", "tru", "\"abc", "1 2", "{\"a\":\"\\ud800\"}", "[01x]"] {
            assert!(Json::parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
