//! JSON documents for `-J` and the encryption canary: serde_json values (object fields keep
//! their order), written by serde_json's pretty printer and read back by its parser.
//!
//! The bytes stay what this tool always wrote, which `plot.py`, `compare_ompi.sh` and the
//! stored results under `results/` hold: two-space indents, `"key": value`, floats in Rust's
//! shortest round-trip decimal form (`1500`, `0.0000001`: no exponent, no `.0`), non-finite
//! floats as `null`, control characters other than `\n`, `\r` and `\t` as `\u00XX`, and a
//! final newline.

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter, PrettyFormatter};

pub use serde_json::Value as Json;

/// An object with `fields` in this order.
pub fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// A string value.
pub fn str(s: impl Into<String>) -> Json {
    Json::String(s.into())
}

/// The document as written to a file.
pub fn render(doc: &Json) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Style(PrettyFormatter::new()));
    // Writing into a Vec cannot fail, and a Value always serializes (keys are strings).
    if doc.serialize(&mut ser).is_err() {
        return "null\n".into();
    }
    let mut text = String::from_utf8_lossy(&out).into_owned();
    text.push('\n');
    text
}

/// Parses one JSON document.
pub fn parse(text: &str) -> Result<Json, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
}

/// serde_json's pretty printer with the bench's number and escape forms (see the module docs).
struct Style(PrettyFormatter<'static>);

impl Formatter for Style {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        write!(w, "{value}")
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        write!(w, "{value}")
    }
    fn write_char_escape<W: ?Sized + io::Write>(&mut self, w: &mut W, escape: CharEscape) -> io::Result<()> {
        match escape {
            CharEscape::Backspace => w.write_all(b"\\u0008"),
            CharEscape::FormFeed => w.write_all(b"\\u000c"),
            other => self.0.write_char_escape(w, other),
        }
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let j = obj(vec![
            ("a", Json::from(1)),
            ("b", str("x\"y\n")),
            ("c", Json::Array(vec![Json::Null, Json::from(0.5), Json::Bool(true)])),
            ("d", Json::from(f64::NAN)),
        ]);
        assert_eq!(
            render(&j),
            "{\n  \"a\": 1,\n  \"b\": \"x\\\"y\\n\",\n  \"c\": [\n    null,\n    0.5,\n    true\n  ],\n  \"d\": null\n}\n"
        );
    }

    #[test]
    fn numbers_and_escapes_as_before() {
        let j = Json::Array(vec![
            Json::from(1500.0),
            Json::from(1e-7),
            Json::from(-3),
            Json::from(u64::MAX),
            str("\u{8}\u{c}\u{1}\t/é"),
            obj(vec![]),
            Json::Array(vec![]),
        ]);
        assert_eq!(
            render(&j),
            "[\n  1500,\n  0.0000001,\n  -3,\n  18446744073709551615,\n  \"\\u0008\\u000c\\u0001\\t/é\",\n  {},\n  []\n]\n"
        );
    }

    #[test]
    fn parses_what_it_renders() {
        let j = obj(vec![
            ("a", Json::from(-3)),
            ("b", str("x\"y\n\u{1}é")),
            ("c", Json::Array(vec![Json::Null, Json::from(0.5), Json::Bool(true), Json::from(1e-7)])),
            ("d", obj(vec![])),
            ("e", Json::Array(vec![])),
        ]);
        let back = parse(&render(&j)).unwrap();
        assert_eq!(render(&back), render(&j));
        assert_eq!(back.get("a").and_then(Json::as_i64), Some(-3));
        assert_eq!(back.get("b").and_then(Json::as_str), Some("x\"y\n\u{1}é"));
        assert_eq!(back.get("c").and_then(Json::as_array).map(|a| a.len()), Some(4));
        assert!(back.get("missing").is_none());
    }

    #[test]
    fn stored_results_render_byte_for_byte() {
        // Documents the hand-written writer produced before serde_json took over.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/results/tls-canary-2026-12-02/");
        for name in ["2core-openssl-3.0.19.json", "16core-h100host-rounds5-openssl-3.6.3.json"] {
            let text = std::fs::read_to_string(format!("{dir}{name}")).unwrap();
            let again = render(&parse(&text).unwrap());
            for (i, (a, b)) in again.lines().zip(text.lines()).enumerate() {
                assert_eq!(a, b, "{name}: line {}", i + 1);
            }
            assert_eq!(again, text, "{name}");
        }
    }

    #[test]
    fn parses_compact_library_reports() {
        let j = parse(r#"{"n":{"count":2,"security":[{"encrypted":true}]},"x":1.5e3,"s":"\ud83d\ude00\/"}"#).unwrap();
        assert_eq!(j.get("n").and_then(|n| n.get("count")).and_then(Json::as_i64), Some(2));
        assert_eq!(j.get("x").and_then(Json::as_f64), Some(1500.0));
        assert_eq!(j.get("s").and_then(Json::as_str), Some("\u{1f600}/"));
    }

    #[test]
    fn rejects_malformed_documents() {
        for bad in ["", "{", "[1,]", "{\"a\" 1}", "tru", "\"abc", "1 2", "{\"a\":\"\\ud800\"}", "[01x]"] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
