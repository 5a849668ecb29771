//! `${...}` templates in task inputs (seed 002 §3.1):
//! `${parent.input.<path>}` reads the job's input, `${<task_id>.output.<path>}`
//! a finished task's output. Paths are dot-separated object keys or array
//! indices. A string that is exactly one template takes the referenced value
//! with its JSON type; templates inside longer strings are interpolated
//! (strings as they are, other values as compact JSON).

use serde_json::Value;

/// What a template refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ref {
    /// `parent.input.<path>`.
    ParentInput(Vec<String>),
    /// `<task>.output.<path>`.
    TaskOutput {
        /// Task id.
        task: String,
        /// Path inside its output (may be empty: the whole output).
        path: Vec<String>,
    },
}

impl Ref {
    fn parse(expr: &str) -> Result<Ref, String> {
        let parts: Vec<&str> = expr.trim().split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!("template ${{{expr}}} has an empty path segment"));
        }
        match parts.as_slice() {
            ["parent", "input", rest @ ..] if !rest.is_empty() => Ok(Ref::ParentInput(
                rest.iter().map(|s| s.to_string()).collect(),
            )),
            [task, "output", rest @ ..] if *task != "parent" => Ok(Ref::TaskOutput {
                task: task.to_string(),
                path: rest.iter().map(|s| s.to_string()).collect(),
            }),
            _ => Err(format!(
                "template ${{{expr}}} must be ${{parent.input.<field>}} or ${{<task_id>.output.<field>}}"
            )),
        }
    }
}

/// Splits a string into literal text and template references.
fn pieces(s: &str) -> Result<Vec<Result<&str, Ref>>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        if start > 0 {
            out.push(Ok(&rest[..start]));
        }
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated template in {s:?}"))?;
        out.push(Err(Ref::parse(&after[..end])?));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Ok(rest));
    }
    Ok(out)
}

/// Every template in `value` (recursively), with the JSON path where it sits
/// (`input.text`), or the first syntax error with its path.
pub fn refs(value: &Value, at: &str) -> Result<Vec<(String, Ref)>, (String, String)> {
    let mut out = Vec::new();
    walk(value, at, &mut out)?;
    Ok(out)
}

fn walk(value: &Value, at: &str, out: &mut Vec<(String, Ref)>) -> Result<(), (String, String)> {
    match value {
        Value::String(s) => {
            for p in pieces(s).map_err(|e| (at.to_owned(), e))? {
                if let Err(r) = p {
                    out.push((at.to_owned(), r));
                }
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                walk(v, &format!("{at}[{i}]"), out)?;
            }
        }
        Value::Object(m) => {
            for (k, v) in m {
                walk(v, &format!("{at}.{k}"), out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Follows `path` inside `root`.
pub fn lookup<'a>(root: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(root, |v, seg| match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

/// Resolves every template in `value`. `source` returns the job input (for
/// `None`) or a task's output; a missing value is an error naming it.
pub fn resolve<'a>(
    value: &Value,
    source: &impl Fn(Option<&str>) -> Option<&'a Value>,
) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => {
            let parts = pieces(s)?;
            let get = |r: &Ref| -> Result<Value, String> {
                let (root, path, name) = match r {
                    Ref::ParentInput(p) => {
                        (source(None), p, format!("parent.input.{}", p.join(".")))
                    }
                    Ref::TaskOutput { task, path } => {
                        let name = if path.is_empty() {
                            format!("{task}.output")
                        } else {
                            format!("{task}.output.{}", path.join("."))
                        };
                        (source(Some(task)), path, name)
                    }
                };
                root.and_then(|root| lookup(root, path))
                    .cloned()
                    .ok_or_else(|| format!("${{{name}}} has no value"))
            };
            match parts.as_slice() {
                [Err(r)] => get(r)?,
                _ => {
                    let mut text = String::new();
                    for p in &parts {
                        match p {
                            Ok(lit) => text.push_str(lit),
                            Err(r) => match get(r)? {
                                Value::String(s) => text.push_str(&s),
                                other => text.push_str(&other.to_string()),
                            },
                        }
                    }
                    Value::String(text)
                }
            }
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| resolve(v, source))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), resolve(v, source)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn seed_002_templates_parse_with_their_paths() {
        let input = json!({"paper_pdf_url": "${parent.input.paper_pdf_url}",
                           "text": "${subtask_1.output.raw_text}"});
        let mut r = refs(&input, "input").unwrap();
        r.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            r[0],
            (
                "input.paper_pdf_url".into(),
                Ref::ParentInput(vec!["paper_pdf_url".into()])
            )
        );
        assert_eq!(
            r[1],
            (
                "input.text".into(),
                Ref::TaskOutput {
                    task: "subtask_1".into(),
                    path: vec!["raw_text".into()]
                }
            )
        );
    }

    #[test]
    fn bad_templates_are_refused_with_where_they_are() {
        assert_eq!(
            refs(&json!({"a": ["x", "${oops"]}), "input").unwrap_err(),
            (
                "input.a[1]".into(),
                "unterminated template in \"${oops\"".into()
            )
        );
        let e = refs(&json!("${subtask_1.result}"), "input").unwrap_err().1;
        assert!(e.contains("must be ${parent.input.<field>}"), "{e}");
        assert!(refs(&json!("${parent.input}"), "i").is_err());
        assert!(refs(&json!("${a..b}"), "i").is_err());
    }

    #[test]
    fn whole_templates_keep_their_type_and_inner_ones_interpolate() {
        let job = json!({"max_pages": 50, "name": "paper"});
        let out1 = json!({"raw_text": "hello", "list": [1, 2]});
        let source = |t: Option<&str>| match t {
            None => Some(&job),
            Some("subtask_1") => Some(&out1),
            _ => None,
        };
        let got = resolve(
            &json!({"pages": "${parent.input.max_pages}",
                    "title": "${parent.input.name}: ${subtask_1.output.raw_text} ${subtask_1.output.list}",
                    "first": "${subtask_1.output.list.0}",
                    "n": 3}),
            &source,
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"pages": 50, "title": "paper: hello [1,2]", "first": 1, "n": 3})
        );
        assert_eq!(
            resolve(&json!("${subtask_9.output.x}"), &source).unwrap_err(),
            "${subtask_9.output.x} has no value"
        );
    }
}
