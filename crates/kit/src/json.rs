//! Conversions between `google.protobuf.Struct`/`Value` and `serde_json`.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

/// A protobuf `Struct` as a JSON object.
pub fn struct_to_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

/// What a person typed as an answer: JSON when it parses, else the text
/// (trimmed) as a string — `3` is a number, `yes please` a string.
pub fn json_or_text(text: &str) -> serde_json::Value {
    let text = text.trim();
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
}

/// A protobuf `Value` as JSON.
pub fn value_to_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            // Integral numbers come back as integers so `1` is not rendered `1.0`.
            if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 {
                serde_json::Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number)
            }
        }
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

/// JSON as a protobuf `Value`.
pub fn json_to_value(j: &serde_json::Value) -> Value {
    let kind = match j {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_to_struct(j).unwrap_or_default()),
    };
    Value { kind: Some(kind) }
}

/// A JSON object as a protobuf `Struct`; `None` when `j` is not an object.
pub fn json_to_struct(j: &serde_json::Value) -> Option<Struct> {
    match j {
        serde_json::Value::Object(m) => Some(Struct {
            fields: m
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_json_when_it_parses_and_text_otherwise() {
        assert_eq!(json_or_text(" 3 "), serde_json::json!(3));
        assert_eq!(
            json_or_text(r#"{"size": 2}"#),
            serde_json::json!({"size": 2})
        );
        assert_eq!(
            json_or_text(" yes please\n"),
            serde_json::json!("yes please")
        );
    }

    #[test]
    fn json_round_trips_through_struct() {
        let j = serde_json::json!({
            "type": "object",
            "properties": {"query": {"type": "string"}, "n": {"type": "integer", "maximum": 10}},
            "required": ["query"],
            "x": null, "f": 0.5, "b": true
        });
        let s = json_to_struct(&j).unwrap();
        assert_eq!(struct_to_json(&s), j);
        assert!(json_to_struct(&serde_json::json!([1])).is_none());
    }
}
