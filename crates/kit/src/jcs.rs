//! The JSON Canonicalization Scheme (RFC 8785): the one byte form of a JSON
//! value that signatures cover — object keys sorted by their UTF-16 code
//! units, strings with only the escapes JSON requires (as ECMAScript's
//! `JSON.stringify`), numbers as ECMAScript prints them, no whitespace.
//! Receipts and A2A Agent Card signatures use it.

use serde_json::Value;

/// The deepest a value may nest: deeper is refused rather than recursed
/// into (what is signed can come from anyone).
pub const MAX_DEPTH: usize = 128;

/// `v` in canonical form; `Err` when it nests deeper than [`MAX_DEPTH`].
///
/// Integers print as written at any size; RFC 8785 gives those beyond 2^53
/// no interoperable form, so a signer outside Switchyard may disagree on
/// them (nothing signed here holds one).
pub fn canonical(v: &Value) -> Result<String, String> {
    let mut out = String::new();
    write(v, &mut out, 1)?;
    Ok(out)
}

fn write(v: &Value, out: &mut String, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH && (v.is_object() || v.is_array()) {
        return Err(format!("the value nests deeper than {MAX_DEPTH} levels"));
    }
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write(&m[k], out, depth + 1)?;
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, out, depth + 1)?;
            }
            out.push(']');
        }
        Value::Number(n) if n.is_f64() => out.push_str(&es_double(n.as_f64().unwrap_or(0.0))),
        // Strings as serde_json escapes them: `"` and `\`, the short forms
        // \b \f \n \r \t, other controls as lower-case \u00XX, the rest as
        // is — ECMAScript's JSON.stringify, which RFC 8785 follows.
        other => out.push_str(&other.to_string()),
    }
    Ok(())
}

/// ECMA-262 Number::toString for a finite double (RFC 8785 §3.2.2.3): the
/// shortest digits that round-trip, plain from 1e-6 to 1e21, exponential
/// outside.
fn es_double(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits: "d.ddde±n".
    let e = format!("{:e}", x.abs());
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i64;
    let n = exp.parse::<i64>().unwrap_or(0) + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let exp = if e >= 0 {
            format!("e+{e}")
        } else {
            format!("e-{}", -e)
        };
        if k == 1 {
            format!("{digits}{exp}")
        } else {
            format!("{}.{}{exp}", &digits[..1], &digits[1..])
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn keys_sort_by_utf16_and_whitespace_goes() {
        let a = json!({"b": [1, {"z": true, "a": null}], "a": "x\ny", "\u{20ac}": 1, "\r": 2,
                       "\u{1f600}": 3, "\u{fb33}": 4});
        // RFC 8785's order: "\r" < "a" < "b" < "€" < 😀 (a surrogate pair) < "דּ".
        assert_eq!(
            canonical(&a).unwrap(),
            "{\"\\r\":2,\"a\":\"x\\ny\",\"b\":[1,{\"a\":null,\"z\":true}],\"€\":1,\"\u{1f600}\":3,\"\u{fb33}\":4}"
        );
    }

    #[test]
    fn numbers_print_as_ecmascript_does() {
        // RFC 8785 Appendix B's samples.
        for (x, want) in [
            (1e21, "1e+21"),
            (1e-7, "1e-7"),
            (333333333.3333333, "333333333.3333333"),
            (1e20, "100000000000000000000"),
            (0.000001, "0.000001"),
            (-5e-324, "-5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (4.5, "4.5"),
            (0.002, "0.002"),
            (-0.0, "0"),
        ] {
            assert_eq!(es_double(x), want, "{x}");
        }
        assert_eq!(canonical(&json!([1, -2, 4.5])).unwrap(), "[1,-2,4.5]");
    }

    #[test]
    fn a_value_nested_past_the_limit_has_no_canonical_form() {
        let mut v = json!("x");
        for _ in 0..200 {
            v = json!([v]);
        }
        assert!(canonical(&v).unwrap_err().contains("deeper"));
    }
}
