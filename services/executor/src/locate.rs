//! Where a field of a job document stands: the line and column of every
//! key and list item, by the field paths violations use
//! (`tasks[1].depends_on`), so an error points at the text a person wrote.
//! JSON is YAML, so one YAML event walk serves both.

use std::collections::{BTreeMap, HashMap};

use serde_saphyr::granit_parser::{Event, Parser};
use switchyard_core::Violations;

/// Most parser events read: positions are a courtesy, never a cost a huge
/// document can inflate.
const MAX_EVENTS: usize = 200_000;

/// Line and column (both from 1) of each field path in a document.
#[derive(Debug, Default)]
pub struct Positions(HashMap<String, (usize, usize)>);

enum Frame {
    /// A mapping: its path and the key whose value comes next.
    Map { path: String, key: Option<String> },
    /// A sequence: its path and the index of the next item.
    Seq { path: String, next: usize },
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl Positions {
    /// Reads `text` (JSON or YAML); a document that does not parse has
    /// positions up to the point where it stops.
    pub fn of(text: &str) -> Positions {
        let mut at = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        for event in Parser::new_from_str(text).take(MAX_EVENTS) {
            let Ok((event, span)) = event else { break };
            let pos = (span.start.line(), span.start.col() + 1);
            let opens = matches!(event, Event::MappingStart(..) | Event::SequenceStart(..));
            let is_node = opens || matches!(event, Event::Scalar(..) | Event::Alias(..));
            if matches!(event, Event::MappingEnd | Event::SequenceEnd) {
                stack.pop();
                if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                    *key = None;
                }
                continue;
            }
            if !is_node {
                continue;
            }
            // The path of this node, or (a mapping key) the key's path.
            let path = match stack.last_mut() {
                None => String::new(),
                Some(Frame::Map { path, key }) => match key.take() {
                    None => {
                        if let Event::Scalar(k, ..) = &event {
                            let p = join(path, k);
                            at.entry(p).or_insert(pos);
                            *key = Some(k.to_string());
                        }
                        continue;
                    }
                    Some(k) => join(path, &k),
                },
                Some(Frame::Seq { path, next }) => {
                    let p = format!("{path}[{next}]");
                    *next += 1;
                    at.entry(p.clone()).or_insert(pos);
                    p
                }
            };
            match event {
                Event::MappingStart(..) => stack.push(Frame::Map { path, key: None }),
                Event::SequenceStart(..) => stack.push(Frame::Seq { path, next: 0 }),
                _ => {}
            }
        }
        Positions(at)
    }

    /// Where `field` is, or the nearest enclosing field that the document
    /// has (a missing field is reported at the object that lacks it).
    pub fn find(&self, field: &str) -> Option<(usize, usize)> {
        let mut f = field;
        loop {
            if let Some(p) = self.0.get(f) {
                return Some(*p);
            }
            let cut = f.rfind(['.', '['])?;
            f = &f[..cut];
            if f.is_empty() {
                return None;
            }
        }
    }

    /// `line L, column C` of each violation's field that the document has,
    /// by field path.
    pub fn of_fields(&self, violations: &Violations) -> BTreeMap<String, String> {
        violations
            .0
            .iter()
            .filter_map(|v| {
                let (line, col) = self.find(&v.field)?;
                Some((v.field.clone(), format!("line {line}, column {col}")))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_keys_and_items_have_their_lines_and_columns() {
        let yaml = "plan_id: p\ntasks:\n  - id: a\n    depends_onn: [b]\n  - id: b\n    agent: {capability: x}\n";
        let p = Positions::of(yaml);
        assert_eq!(p.find("plan_id"), Some((1, 1)));
        assert_eq!(p.find("tasks[0].depends_onn"), Some((4, 5)));
        assert_eq!(p.find("tasks[1]"), Some((5, 5)));
        assert_eq!(p.find("tasks[1].agent.capability"), Some((6, 13)));
        // A field the document lacks: where its object is.
        assert_eq!(p.find("tasks[1].timeout_secs"), Some((5, 5)));
        assert_eq!(p.find("nothing"), None);
    }

    #[test]
    fn json_positions_too() {
        let json =
            "{\n  \"plan_id\": \"p\",\n  \"tasks\": [\n    {\"id\": \"a\", \"agnet\": {}}\n  ]\n}";
        let p = Positions::of(json);
        assert_eq!(p.find("tasks[0].agnet"), Some((4, 17)));
        assert_eq!(p.find("plan_id"), Some((2, 3)));
    }

    #[test]
    fn a_broken_document_keeps_what_came_before() {
        let p = Positions::of("plan_id: p\ntasks: [\n");
        assert_eq!(p.find("plan_id"), Some((1, 1)));
    }
}
