//! Input validation that produces field violations (`google.rpc.BadRequest`)
//! rather than a single opaque message, so a client can point at the field.

use std::fmt;

/// One invalid field: its path (`agent.capabilities[1].name`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Dotted path of the field in the request.
    pub field: String,
    /// What is wrong, in lowercase, without a trailing period.
    pub description: String,
}

impl fmt::Display for FieldViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.description)
    }
}

/// Longest field path a violation keeps.
pub const MAX_FIELD: usize = 200;
/// Longest description a violation keeps.
pub const MAX_DESCRIPTION: usize = 300;

/// `text` if it has at most `max` characters; else its head and tail
/// around a note of how much was cut, so that both the quoted value's start
/// and the rule after it (`… must match ^[a-z]…`) stay readable.
pub fn clamp(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let tail = max / 4;
    let head = max.saturating_sub(tail);
    let cut = n - head - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start}…[{cut} characters cut]…{end}")
}

/// The candidate closest to `word` by edit distance, when close enough to
/// be a likely typo (`depends_onn` → `depends_on`, `agnet` → `agent`).
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over characters, transpositions counting one.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Two rows back, for transpositions (`agnet` is one step from `agent`).
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let sub = prev[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            row[j] = sub.min(prev[j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut prev, row);
    }
    prev[b.len()]
}

/// Collects every violation of a request, so one round trip reports them all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Violations(pub Vec<FieldViolation>);

impl Violations {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a violation. Field and description are bounded
    /// ([`clamp`]): a description quotes what the client sent, and a
    /// 10,000-character id must not come back whole (nor overflow a
    /// client's metadata limit).
    pub fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation {
            field: clamp(&field.into(), MAX_FIELD),
            description: clamp(&description.into(), MAX_DESCRIPTION),
        });
    }

    /// Records `err` against `field` when `check` failed.
    pub fn check(&mut self, field: impl Into<String>, check: Result<(), String>) {
        if let Err(description) = check {
            self.add(field, description);
        }
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok(())` when empty, else the violations.
    pub fn into_result(self) -> Result<(), Violations> {
        if self.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

fn ident(s: &str, max_len: usize, what: &str, pattern: &str) -> Result<(), String> {
    let mut chars = s.chars();
    let ok = matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && s.len() <= max_len;
    if ok {
        Ok(())
    } else if s.is_empty() {
        Err(format!("{what} is required"))
    } else {
        Err(format!("{what} {s:?} must match {pattern}"))
    }
}

/// A queue name (OJS): lowercase letters, digits, `.`, `-` and `_`,
/// starting with a letter or digit, 1–255 characters.
pub fn queue(s: &str) -> Result<(), String> {
    let ok_start = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok_rest = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_'));
    if s.len() <= 255 && ok_start && ok_rest {
        Ok(())
    } else {
        Err(format!(
            "queue {:?} is not a queue name: lowercase letters, digits, '.', '-' and '_', starting with a letter or digit, at most 255 characters",
            clamp(s, 64)
        ))
    }
}

/// A job type (OJS): dot-separated segments of lowercase letters, digits
/// and `_`, each starting with a letter, at most 255 characters
/// (`email.send`, `report.generate_v2`).
pub fn job_type(s: &str) -> Result<(), String> {
    let segment_ok = |seg: &str| {
        seg.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && seg
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    };
    if !s.is_empty() && s.len() <= 255 && s.split('.').all(segment_ok) {
        Ok(())
    } else {
        Err(format!(
            "type {:?} is not a job type: dot-separated segments of lowercase letters, digits, '_' and '-', each starting with a letter (e.g. \"email.send\")",
            clamp(s, 64)
        ))
    }
}

/// Agent ids: `^[a-z][a-z0-9_]{0,57}$`, so that seed 003's tool name
/// `agent_<id>` (6 more characters) is itself a valid tool name.
pub fn agent_id(s: &str) -> Result<(), String> {
    ident(s, 58, "agent id", "^[a-z][a-z0-9_]{0,57}$")
}

/// Tool names: `^[a-z][a-z0-9_]{0,63}$` (seed 000's tool names, OpenAI-compatible).
pub fn tool_name(s: &str) -> Result<(), String> {
    ident(s, 64, "tool name", "^[a-z][a-z0-9_]{0,63}$")
}

/// The tool name an agent is offered under (seed ADR 003 `agent_<id>`); an
/// id that already starts with `agent_` (declarative agents register so)
/// is used as it is.
pub fn agent_tool_name(agent_id: &str) -> String {
    if agent_id.starts_with("agent_") {
        agent_id.to_owned()
    } else {
        format!("agent_{agent_id}")
    }
}

/// The tool an orchestrator calls to hand a conversation to agent
/// `agent_id` (handoff mode): `handoff_<id>`, with `-` and `.` as `_` so it
/// is a valid tool name.
pub fn handoff_tool_name(agent_id: &str) -> String {
    format!("handoff_{}", agent_id.replace(['-', '.'], "_"))
}

/// Capability names: dot-separated segments, each `[a-z][a-z0-9_]*`, at most 128
/// characters in all (`pdf_text_extraction`, `nlp.analysis`).
pub fn capability(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("capability is required".into());
    }
    let ok = s.len() <= 128
        && s.split('.').all(|seg| {
            let mut c = seg.chars();
            matches!(c.next(), Some('a'..='z'))
                && c.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "capability {s:?} must be dot-separated lowercase segments matching [a-z][a-z0-9_]* (at most 128 characters)"
        ))
    }
}

/// The capability and its ancestors, most specific first:
/// `a.b.c` → `a.b.c`, `a.b`, `a`.
pub fn capability_lineage(s: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(s);
    std::iter::from_fn(move || {
        let cur = next?;
        next = cur.rfind('.').map(|i| &cur[..i]);
        Some(cur)
    })
}

/// Whether `capability` is `prefix` or under it (`built.translator` is
/// under `built`; `built` is not under `built.translator`).
pub fn capability_under(capability: &str, prefix: &str) -> bool {
    capability_lineage(capability).any(|l| l == prefix)
}

/// An endpoint agents are called on: an `http://` or `https://` URL with a host.
pub fn endpoint(s: &str) -> Result<(), String> {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"));
    match rest {
        _ if s.is_empty() => Err("endpoint is required".into()),
        Some(r) if !r.is_empty() && !r.starts_with('/') && !r.contains(char::is_whitespace) => {
            Ok(())
        }
        _ => Err(format!(
            "endpoint {s:?} must be an http:// or https:// URL with a host"
        )),
    }
}

/// A character a key may hold: `[A-Za-z0-9._:/@-]`.
pub fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '@' | '-')
}

/// A character a key may start with: a letter, digit or `@`.
pub fn key_start(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '@'
}

/// Keys chosen by clients (budget and run ids, idempotency keys, worker ids):
/// 1–128 characters of `[A-Za-z0-9._:/@-]`, starting with a letter, digit or `@`
/// (`org/acme`, `job:0193…`, `@you`).
pub fn key(s: &str, what: &str) -> Result<(), String> {
    let ok = s.len() <= 128 && {
        let mut chars = s.chars();
        chars.next().is_some_and(key_start) && chars.all(key_char)
    };
    required_or(s, ok, what, "1-128 characters of [A-Za-z0-9._:/@-]")
}

/// `Ok` when `ok`; else "required" for an empty `s`, or the rule it breaks
/// (`must be RULE, starting with a letter, digit or @`).
fn required_or(s: &str, ok: bool, what: &str, rule: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else if s.is_empty() {
        Err(format!("{what} is required"))
    } else {
        Err(format!(
            "{what} {:?} must be {rule}, starting with a letter, digit or @",
            clamp(s, 64)
        ))
    }
}

/// Ids a client chooses for objects that may name a place — a job id is
/// also its scratch directory's name, an AITP `task_id` becomes a job id:
/// 1–128 characters of `[A-Za-z0-9._:@-]`, starting with a letter, digit or
/// `@`, never containing `..`. Unlike [`key`] there is no `/`, so such an
/// id is always one plain path segment and never a traversal. The one
/// charset every door applies (it runs inside the job validation they share).
pub fn object_id(s: &str, what: &str) -> Result<(), String> {
    let ok = key(s, what).is_ok() && !s.contains('/') && !s.contains("..");
    required_or(
        s,
        ok,
        what,
        "1-128 characters of [A-Za-z0-9._:@-] without '..'",
    )
}

/// An [`object_id`] that may be left empty (the server then makes one).
pub fn optional_object_id(s: &str, what: &str) -> Result<(), String> {
    if s.is_empty() {
        Ok(())
    } else {
        object_id(s, what)
    }
}

/// Page size of a list request: 0 asks for the default (100), anything
/// above 1000 is cut to 1000.
pub fn page_size(requested: u32) -> usize {
    match requested as usize {
        0 => 100,
        n => n.min(1000),
    }
}

/// A key that may be left empty (optional ids and idempotency keys).
pub fn optional_key(s: &str, what: &str) -> Result<(), String> {
    if s.is_empty() { Ok(()) } else { key(s, what) }
}

/// A value in `[lo, hi]`; NaN is rejected.
pub fn in_range(v: f64, lo: f64, hi: f64, what: &str) -> Result<(), String> {
    if v >= lo && v <= hi {
        Ok(())
    } else {
        Err(format!("{what} must be between {lo} and {hi}, got {v}"))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn long_values_are_cut_in_the_middle_and_say_so() {
        let id = "a".repeat(10_000);
        let mut v = Violations::new();
        v.add(
            format!("tasks.{id}"),
            format!("job_id {id:?} must match ^[a-z]"),
        );
        let d = &v.0[0].description;
        assert!(d.chars().count() < MAX_DESCRIPTION + 40, "{}", d.len());
        assert!(d.ends_with("must match ^[a-z]") && d.contains("characters cut]"));
        assert!(v.0[0].field.chars().count() < MAX_FIELD + 40);
        assert_eq!(clamp("short", 10), "short");
    }

    #[test]
    fn typos_suggest_the_field_meant() {
        let fields = ["id", "depends_on", "agent", "command", "timeout_secs"];
        assert_eq!(did_you_mean("depends_onn", fields), Some("depends_on"));
        assert_eq!(did_you_mean("agnet", fields), Some("agent"));
        assert_eq!(did_you_mean("timeout", fields), None);
        assert_eq!(did_you_mean("zzzzzz", fields), None);
    }
    use super::*;

    #[test]
    fn page_sizes_default_and_cap() {
        assert_eq!(
            (page_size(0), page_size(7), page_size(5_000)),
            (100, 7, 1000)
        );
        assert!(optional_key("", "x").is_ok() && optional_key("a b", "x").is_err());
    }

    #[test]
    fn keys_allow_paths_and_colons_but_not_spaces_or_empty() {
        for ok in ["org/acme", "job:0193", "@you", "a", &"k".repeat(128)] {
            assert!(key(ok, "budget id").is_ok(), "{ok}");
        }
        assert_eq!(key("", "budget id").unwrap_err(), "budget id is required");
        for bad in ["-x", "a b", "é", "/x", &"k".repeat(129)] {
            assert!(
                key(bad, "budget id").unwrap_err().contains("must be"),
                "{bad}"
            );
        }
    }

    #[test]
    fn object_ids_are_one_plain_segment_never_a_path() {
        for ok in [
            "job-1",
            "0193a:b",
            "@you",
            "nightly.build_42",
            &"k".repeat(128),
        ] {
            assert!(object_id(ok, "job_id").is_ok(), "{ok}");
        }
        for bad in [
            "a/../../etc",
            "a/b",
            "..",
            "x..y",
            ".",
            "-x",
            "a\0b",
            "a\nb",
            "a b",
            "é",
            &"k".repeat(129),
        ] {
            let e = object_id(bad, "job_id").unwrap_err();
            assert!(e.contains("without '..'"), "{bad:?}: {e}");
        }
        assert_eq!(object_id("", "job_id").unwrap_err(), "job_id is required");
        assert!(optional_object_id("", "job_id").is_ok());
    }

    #[test]
    fn agent_id_accepts_the_pattern_and_its_longest_form() {
        assert!(agent_id("a").is_ok());
        assert!(agent_id("pdf_extractor_2").is_ok());
        let longest = format!("a{}", "b".repeat(57));
        assert!(agent_id(&longest).is_ok());
        // agent_<id> of the longest id is a valid tool name
        assert!(tool_name(&format!("agent_{longest}")).is_ok());
    }

    #[test]
    fn agent_id_rejects_bad_forms_with_the_pattern_in_the_message() {
        for bad in ["", "A", "1abc", "_a", "a-b", "a.b", "ab c", "é"] {
            assert!(agent_id(bad).is_err(), "{bad:?} accepted");
        }
        assert!(agent_id(&format!("a{}", "b".repeat(58))).is_err());
        assert_eq!(agent_id("").unwrap_err(), "agent id is required");
        assert!(
            agent_id("A")
                .unwrap_err()
                .contains("^[a-z][a-z0-9_]{0,57}$")
        );
    }

    #[test]
    fn tool_name_allows_64_characters_not_65() {
        assert!(tool_name(&format!("t{}", "x".repeat(63))).is_ok());
        assert!(tool_name(&format!("t{}", "x".repeat(64))).is_err());
        assert!(tool_name("web_search").is_ok());
        assert!(tool_name("Web").is_err());
    }

    #[test]
    fn capability_allows_dotted_hierarchy_only_between_valid_segments() {
        for ok in [
            "pdf_text_extraction",
            "nlp.analysis",
            "a.b2.c_d",
            "builtin.echo",
        ] {
            assert!(capability(ok).is_ok(), "{ok}");
        }
        for bad in ["", "NLP", ".a", "a.", "a..b", "a.1b", "a-b", "a b"] {
            assert!(capability(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn capability_lineage_walks_from_specific_to_root() {
        let v: Vec<_> = capability_lineage("a.b.c").collect();
        assert_eq!(v, ["a.b.c", "a.b", "a"]);
        assert_eq!(capability_lineage("x").collect::<Vec<_>>(), ["x"]);
        assert!(capability_under("built.translator", "built"));
        assert!(capability_under("built", "built"));
        assert!(!capability_under("built", "built.translator"));
        assert!(!capability_under("builtin.echo", "built"));
    }

    #[test]
    fn endpoint_requires_http_url_with_host() {
        assert!(endpoint("http://127.0.0.1:7700").is_ok());
        assert!(endpoint("https://agents.example.com").is_ok());
        for bad in [
            "",
            "127.0.0.1:80",
            "http://",
            "ftp://x",
            "http:///x",
            "http://a b",
        ] {
            assert!(endpoint(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn in_range_rejects_nan_and_out_of_range() {
        assert!(in_range(0.5, 0.0, 1.0, "p").is_ok());
        assert!(in_range(f64::NAN, 0.0, 1.0, "p").is_err());
        assert_eq!(
            in_range(1.5, 0.0, 1.0, "proficiency").unwrap_err(),
            "proficiency must be between 0 and 1, got 1.5"
        );
    }

    #[test]
    fn violations_collect_and_display_all() {
        let mut v = Violations::new();
        assert!(v.clone().into_result().is_ok());
        v.check("agent.id", agent_id(""));
        v.check("agent.endpoint", endpoint("http://x"));
        v.add("agent.trust_score", "too high");
        assert_eq!(v.0.len(), 2);
        assert_eq!(
            v.to_string(),
            "agent.id: agent id is required; agent.trust_score: too high"
        );
    }
}

/// serde's "invalid type: integer `5`, expected struct NativeCommand" in a
/// user's words ("expected an object (a mapping of fields), got 5"): no
/// Rust type name reaches a person. Any other message is kept.
pub fn in_words(serde_text: &str) -> String {
    if serde_text.contains('\n') {
        // Each line on its own (a message with its place under it).
        return serde_text
            .lines()
            .map(in_words)
            .collect::<Vec<_>>()
            .join("\n");
    }
    let Some((got, want)) = serde_text
        .strip_prefix("invalid type: ")
        .or_else(|| serde_text.strip_prefix("invalid value: "))
        .and_then(|rest| rest.rsplit_once(", expected "))
    else {
        return serde_text.to_owned();
    };
    let want = match want {
        "u8" | "u16" | "u32" | "u64" | "usize" => {
            let max = match want {
                "u8" => u64::from(u8::MAX),
                "u16" => u64::from(u16::MAX),
                "u32" => u64::from(u32::MAX),
                _ => u64::MAX,
            };
            format!("a whole number from 0 to {max}")
        }
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "a list".to_owned(),
        "a map" => "an object (a mapping of fields)".to_owned(),
        w if w.starts_with("struct ") => "an object (a mapping of fields)".to_owned(),
        w if w.starts_with("enum ") => "one of the names this field takes".to_owned(),
        w => w.to_owned(),
    };
    // `integer `5`` → 5, `string "hi"` → the text "hi", `map` → an object.
    let got = match got.split_once(' ') {
        Some(("integer" | "floating" | "boolean", v)) => {
            v.trim_start_matches("point ").trim_matches('`').to_owned()
        }
        Some(("string", v)) => format!("the text {v}"),
        _ => match got {
            "map" => "an object".to_owned(),
            "sequence" => "a list".to_owned(),
            "unit" | "null" => "null".to_owned(),
            g => g.to_owned(),
        },
    };
    format!("expected {want}, got {got}")
}

#[cfg(test)]
mod words_tests {
    use super::in_words;

    #[test]
    fn no_rust_type_name_reaches_a_person() {
        for (serde, said) in [
            (
                "invalid value: integer `-5`, expected u32",
                "expected a whole number from 0 to 4294967295, got -5",
            ),
            (
                "invalid type: integer `5`, expected struct NativeCommand",
                "expected an object (a mapping of fields), got 5",
            ),
            (
                "invalid type: string \"hi\", expected a sequence",
                "expected a list, got the text \"hi\"",
            ),
            (
                "invalid type: map, expected a string",
                "expected a string, got an object",
            ),
            (
                "invalid type: floating point `1.5`, expected i64",
                "expected a whole number, got 1.5",
            ),
            ("missing field `command`", "missing field `command`"),
        ] {
            let words = in_words(serde);
            assert_eq!(words, said);
            assert!(
                !["u32", "i64", "struct ", "NativeCommand"]
                    .iter()
                    .any(|t| words.contains(t)),
                "{words}"
            );
        }
    }
}
