//! Tool parameters mirrored into HTTP headers (MCP 2026-07-28, SEP-2243).
//! A tool's input schema may mark a top-level property
//! `"x-mcp-header": "Region"`; a client then sends the argument's value as
//! `Mcp-Param-Region` beside the body, so that gateways and load balancers
//! can route on it without reading JSON. A declaration must name a header
//! (visible token characters, unique within the tool whatever the case) on
//! a string, integer or boolean property; a tool with any bad declaration is not
//! used at all ([`header_params`] says why), never called with headers
//! that would not say what its body says.

use base64::Engine;
use serde_json::{Map, Value};

/// One mirrored parameter: the argument's property and the header's name
/// (after `Mcp-Param-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderParam {
    /// The property of the arguments.
    pub property: String,
    /// The header's name, without its `Mcp-Param-` prefix.
    pub header: String,
}

/// The header parameters `schema` declares, or why the tool may not be
/// used.
pub fn header_params(schema: &Value) -> Result<Vec<HeaderParam>, String> {
    let mut out: Vec<HeaderParam> = Vec::new();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(out);
    };
    for (property, p) in props {
        let Some(declared) = p.get("x-mcp-header") else {
            continue;
        };
        let bad = |why: &str| format!("parameter {property:?}: its x-mcp-header {why}");
        let header = declared.as_str().ok_or_else(|| bad("is not a string"))?;
        if header.is_empty() {
            return Err(bad("is empty"));
        }
        if !header.bytes().all(is_token) {
            return Err(bad(&format!(
                "{header:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)"
            )));
        }
        let primitive = match p.get("type") {
            Some(Value::String(t)) => PRIMITIVE.contains(&t.as_str()),
            _ => false,
        };
        if !primitive {
            return Err(bad(&format!(
                "{header:?} is on a parameter that is not a string, integer or boolean"
            )));
        }
        if let Some(other) = out.iter().find(|o| o.header.eq_ignore_ascii_case(header)) {
            return Err(bad(&format!(
                "{header:?} is also declared by {:?} (header names ignore case)",
                other.property
            )));
        }
        out.push(HeaderParam {
            property: property.clone(),
            header: header.to_owned(),
        });
    }
    Ok(out)
}

/// Types a header can carry: not `number`, whose text forms differ from
/// one language to the next (`1e21`, `0.1` rounded), so a header and a body
/// could disagree.
const PRIMITIVE: [&str; 3] = ["string", "integer", "boolean"];

/// RFC 9110 `tchar`.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The `Mcp-Param-*` headers of a call with `args`: each declared
/// parameter that has a value (a null or missing one sends nothing).
pub(crate) fn param_headers(
    params: &[HeaderParam],
    args: &Map<String, Value>,
) -> Vec<(String, String)> {
    params
        .iter()
        .filter_map(|p| {
            let value = match args.get(&p.property)? {
                Value::String(s) => encode(s),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            Some((format!("Mcp-Param-{}", p.header), value))
        })
        .collect()
}

/// A string as a header value: as it is when it is visible ASCII without
/// surrounding whitespace, else `=?base64?…?=` of its UTF-8.
fn encode(s: &str) -> String {
    let plain = s.bytes().all(|b| (0x20..=0x7e).contains(&b)) && s.trim() == s;
    if plain {
        s.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(s)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(props: Value) -> Value {
        json!({"type": "object", "properties": props})
    }

    #[test]
    fn declared_parameters_are_mirrored_encoded_and_null_ones_left_out() {
        let s = schema(json!({
            "region": {"type": "string", "x-mcp-header": "Region"},
            "priority": {"type": "integer", "x-mcp-header": "Priority"},
            "verbose": {"type": "boolean", "x-mcp-header": "Verbose"},
            "name": {"type": "string", "x-mcp-header": "Name"},
            "query": {"type": "string"}
        }));
        let params = header_params(&s).unwrap();
        let args = json!({"region": "us west 1", "priority": 42, "verbose": null,
            "name": " Hello, 世界", "query": "SELECT 1"});
        let mut got = param_headers(&params, args.as_object().unwrap());
        got.sort();
        assert_eq!(
            got,
            [
                (
                    "Mcp-Param-Name".to_owned(),
                    "=?base64?IEhlbGxvLCDkuJbnlYw=?=".to_owned()
                ),
                ("Mcp-Param-Priority".to_owned(), "42".to_owned()),
                ("Mcp-Param-Region".to_owned(), "us west 1".to_owned()),
            ]
        );
        assert_eq!(encode("a\tb"), "=?base64?YQli?=");
        assert_eq!(encode(""), "");
    }

    #[test]
    fn a_bad_declaration_makes_the_tool_unusable_and_says_why() {
        for (props, why) in [
            (
                json!({"a": {"type": "string", "x-mcp-header": ""}}),
                "is empty",
            ),
            (
                json!({"a": {"type": "object", "x-mcp-header": "A"}}),
                "not a string, integer",
            ),
            (
                json!({"a": {"type": "null", "x-mcp-header": "A"}}),
                "not a string, integer",
            ),
            (
                json!({"a": {"type": "number", "x-mcp-header": "A"}}),
                "not a string, integer",
            ),
            (json!({"a": {"x-mcp-header": "A"}}), "not a string, integer"),
            (
                json!({"a": {"type": "string", "x-mcp-header": "Bad Name"}}),
                "not a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": "Bad:Name"}}),
                "not a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": "Nämé"}}),
                "not a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": 7}}),
                "not a string",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": "Region"},
                       "b": {"type": "string", "x-mcp-header": "region"}}),
                "also declared",
            ),
        ] {
            let e = header_params(&schema(props.clone())).unwrap_err();
            assert!(e.contains(why), "{props}: {e}");
        }
        assert_eq!(header_params(&json!({"type": "object"})), Ok(vec![]));
    }
}
