//! Configuration layering: built-in defaults, then a TOML file, then
//! `SWITCHYARD_*` environment variables (`__` separates levels:
//! `SWITCHYARD_REGISTRY__LEASE_TTL_SECS=30` sets `[registry] lease_ttl_secs`),
//! then command-line flags (applied by the binary on the result).
//!
//! Unknown keys are errors, so a typo never silently falls back to a default.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_core::validate::in_words;
use toml::{Table, Value};

/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "SWITCHYARD_";

/// Configuration errors, naming the file or variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed.
    #[error("config file {path}: {message}")]
    File {
        /// Path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// An environment variable does not fit the configuration.
    #[error("environment variable {var}: {message}")]
    Env {
        /// Variable.
        var: String,
        /// What went wrong.
        message: String,
    },
    /// The merged configuration is invalid.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Loads `T` from its defaults, the optional TOML file and the given
/// environment (pass `std::env::vars()`).
pub fn load<T>(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let mut merged = match Value::try_from(T::default()) {
        Ok(Value::Table(t)) => t,
        Ok(_) => {
            return Err(ConfigError::Invalid(
                "configuration root must be a table".into(),
            ));
        }
        Err(e) => return Err(ConfigError::Invalid(e.to_string())),
    };
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let table: Table = toml::from_str(&text).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        merge(&mut merged, table);
        T::deserialize(Value::Table(merged.clone())).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            message: in_words(&e.to_string()),
        })?;
    }
    let mut vars: Vec<_> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains("__"))
        .collect();
    vars.sort();
    for (var, raw) in vars {
        let path: Vec<String> = var[ENV_PREFIX.len()..]
            .split("__")
            .map(|s| s.to_ascii_lowercase())
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError::Env {
                var,
                message: "empty key segment".into(),
            });
        }
        set_path(&mut merged, &path, &raw).map_err(|message| ConfigError::Env {
            var: var.clone(),
            message,
        })?;
        T::deserialize(Value::Table(merged.clone())).map_err(|e| ConfigError::Env {
            var: var.clone(),
            message: in_words(&e.to_string()),
        })?;
    }
    T::deserialize(Value::Table(merged)).map_err(|e| ConfigError::Invalid(in_words(&e.to_string())))
}

/// Renders a configuration as TOML (for `--dump-config`).
pub fn dump<T: Serialize>(cfg: &T) -> Result<String, ConfigError> {
    toml::to_string_pretty(cfg).map_err(|e| ConfigError::Invalid(e.to_string()))
}

fn merge(base: &mut Table, over: Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Sets `path` to `raw`: kept as a string where the current value is a
/// string, else parsed as a TOML value (number, bool, array) and kept as a
/// string when it does not parse.
fn set_path(table: &mut Table, path: &[String], raw: &str) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty key")?;
    let mut cur = table;
    for seg in parents {
        let entry = cur
            .entry(seg.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        cur = match entry {
            Value::Table(t) => t,
            _ => return Err(format!("{seg} is not a section")),
        };
    }
    let value = match cur.get(last) {
        Some(Value::String(_)) => Value::String(raw.to_owned()),
        _ => toml::from_str::<Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| Value::String(raw.to_owned())),
    };
    cur.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Cfg {
        server: Server,
        registry: Registry,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Server {
        listen: String,
        max: u64,
    }

    impl Default for Server {
        fn default() -> Self {
            Server {
                listen: "127.0.0.1:7600".into(),
                max: 4,
            }
        }
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Registry {
        ttl: u64,
        name: String,
        url: Option<String>,
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn defaults_then_file_then_env() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "[server]\nmax = 8\n[registry]\nttl = 10\n").unwrap();
        let c: Cfg = load(
            Some(&f),
            env(&[
                ("SWITCHYARD_REGISTRY__TTL", "30"),
                ("SWITCHYARD_REGISTRY__NAME", "123"),
                ("SWITCHYARD_REGISTRY__URL", "http://x:1"),
                ("SWITCHYARD_CONFIG", "ignored: no level separator"),
                ("OTHER__X", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:7600");
        assert_eq!(c.server.max, 8);
        assert_eq!(c.registry.ttl, 30);
        assert_eq!(c.registry.name, "123", "string fields keep digits as text");
        assert_eq!(c.registry.url.as_deref(), Some("http://x:1"));
    }

    #[test]
    fn unknown_keys_and_bad_types_are_errors_naming_their_source() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "[server]\nlisten_addr = \"x\"\n").unwrap();
        let e = load::<Cfg>(Some(&f), env(&[])).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("listen_addr"), "{e}");

        let e = load::<Cfg>(None, env(&[("SWITCHYARD_REGISTRY__TTL", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SWITCHYARD_REGISTRY__TTL"), "{e}");

        let e = load::<Cfg>(None, env(&[("SWITCHYARD_NOPE__X", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SWITCHYARD_NOPE__X"), "{e}");

        let e = load::<Cfg>(Some(&dir.path().join("missing.toml")), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }

    #[test]
    fn dump_round_trips() {
        let c = Cfg::default();
        let text = dump(&c).unwrap();
        let back: Cfg = toml::from_str(&text).unwrap();
        assert_eq!(back, c);
    }
}
