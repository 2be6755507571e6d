//! Process values: what the operator supplies when the sidecar starts
//! (`--set`, `--set-json`, `--pin`, `--pin-json`, `--params-file`, and the
//! `BINDERY_PARAM_<NAME>` / `BINDERY_PIN_<NAME>` environment variables).

use std::collections::BTreeMap;
use std::path::Path;

use super::resolve::Origin;
use super::value::Supplied;

/// Environment variable prefix that sets a parameter.
pub const ENV_SET_PREFIX: &str = bindery_spec::checks::PARAM_ENV_PREFIXES[0];
/// Environment variable prefix that pins a parameter.
pub const ENV_PIN_PREFIX: &str = bindery_spec::checks::PARAM_ENV_PREFIXES[1];

/// Why an operator-supplied value was refused: the flag, variable or file
/// and the parameter's name, never the value.
#[derive(Debug, thiserror::Error)]
pub enum ProcessValueError {
    #[error("parameter `{name}` is given twice ({first} and {second}): give it once")]
    Twice {
        name: String,
        first: Origin,
        second: Origin,
    },
    /// `given` is the argument up to any `=`.
    #[error("{flag} takes NAME=VALUE, got `{given}`")]
    NotNameValue { flag: &'static str, given: String },
    #[error("{flag} {name}=…: the value is not valid JSON ({source})")]
    NotJson {
        flag: &'static str,
        name: String,
        source: crate::shape::ShapeError,
    },
    #[error("cannot read --params-file {path}: {source}")]
    FileUnreadable {
        path: String,
        source: std::io::Error,
    },
    // Its place and what was expected, never the file's text (serde's
    // own messages quote values).
    #[error("--params-file {path} is not a JSON/YAML object: {source}")]
    FileNotYaml {
        path: String,
        source: crate::shape::ShapeError,
    },
    #[error("--params-file {0} must hold an object of parameter names to values")]
    FileNotObject(String),
    #[error("--params-file {path}: `{name}.pinned` must be true or false")]
    PinnedNotBoolean { path: String, name: String },
}

/// One operator-supplied value.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessValue {
    pub value: Supplied,
    pub pinned: bool,
    pub origin: Origin,
}

/// Every process value, by parameter name. A name may be given once.
#[derive(Clone, Debug, Default)]
pub struct ProcessValues(BTreeMap<String, ProcessValue>);

impl ProcessValues {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: String, value: ProcessValue) -> Result<(), ProcessValueError> {
        if let Some(prev) = self.0.get(&name) {
            return Err(ProcessValueError::Twice {
                first: prev.origin.clone(),
                second: value.origin,
                name,
            });
        }
        self.0.insert(name, value);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&ProcessValue> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &ProcessValue)> {
        self.0.iter()
    }

    /// `--set NAME=VALUE` (string) or `--set-json NAME=JSON`; the same for `--pin`.
    pub fn add_flag(&mut self, flag: &'static str, arg: &str) -> Result<(), ProcessValueError> {
        let (name, raw) = arg
            .split_once('=')
            .ok_or_else(|| ProcessValueError::NotNameValue {
                flag,
                given: name_only(arg).to_string(),
            })?;
        let json = flag.ends_with("-json");
        let value = if json {
            serde_json::from_str(raw).map_err(|e| ProcessValueError::NotJson {
                flag,
                name: name.to_string(),
                source: crate::shape::ShapeError::json(&e),
            })?
        } else {
            serde_json::Value::String(raw.to_string())
        };
        self.insert(
            name.to_string(),
            ProcessValue {
                value: Supplied(value),
                pinned: flag.starts_with("--pin"),
                origin: Origin::Flag(flag),
            },
        )
    }

    /// `BINDERY_PARAM_<NAME>` sets and `BINDERY_PIN_<NAME>` pins the
    /// parameter `<name>` (lower-cased), as a string.
    pub fn add_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ProcessValueError> {
        for (var, raw) in vars {
            let (pinned, rest) = if let Some(rest) = var.strip_prefix(ENV_PIN_PREFIX) {
                (true, rest)
            } else if let Some(rest) = var.strip_prefix(ENV_SET_PREFIX) {
                (false, rest)
            } else {
                continue;
            };
            self.insert(
                rest.to_ascii_lowercase(),
                ProcessValue {
                    value: Supplied(serde_json::Value::String(raw)),
                    pinned,
                    origin: Origin::Env(var.clone()),
                },
            )?;
        }
        Ok(())
    }

    /// A JSON or YAML object: `{"name": value}` or `{"name": {"value": …,
    /// "pinned": true}}` (an object whose only keys are `value` and
    /// `pinned` is read as the second form).
    pub fn add_params_file(&mut self, path: &Path) -> Result<(), ProcessValueError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| ProcessValueError::FileUnreadable {
                path: shown.clone(),
                source,
            })?;
        let doc: serde_json::Value =
            serde_yaml::from_str(&text).map_err(|e| ProcessValueError::FileNotYaml {
                path: shown.clone(),
                source: crate::shape::ShapeError::yaml(&e),
            })?;
        let serde_json::Value::Object(map) = doc else {
            return Err(ProcessValueError::FileNotObject(shown));
        };
        for (name, entry) in map {
            let (value, pinned) = match entry {
                serde_json::Value::Object(ref o)
                    if o.contains_key("value")
                        && o.keys().all(|k| k == "value" || k == "pinned") =>
                {
                    let pinned = match o.get("pinned") {
                        None => false,
                        Some(serde_json::Value::Bool(b)) => *b,
                        Some(_) => {
                            return Err(ProcessValueError::PinnedNotBoolean { path: shown, name })
                        }
                    };
                    (o["value"].clone(), pinned)
                }
                other => (other, false),
            };
            self.insert(
                name,
                ProcessValue {
                    value: Supplied(value),
                    pinned,
                    origin: Origin::ParamsFile(shown.clone()),
                },
            )?;
        }
        Ok(())
    }
}

/// The part of `NAME=VALUE` before any `=`, so an error never echoes a value.
fn name_only(arg: &str) -> &str {
    arg.split('=').next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flags_env_and_files() {
        let mut pv = ProcessValues::new();
        pv.add_flag("--set", "tenant=acme=corp").unwrap();
        pv.add_flag("--set-json", "max=10").unwrap();
        pv.add_flag("--pin-json", "cfg={\"a\":1}").unwrap();
        pv.add_env([
            ("BINDERY_PIN_REGION".to_string(), "eu".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ])
        .unwrap();
        assert_eq!(
            pv.get("tenant").unwrap().value,
            Supplied(json!("acme=corp"))
        );
        assert_eq!(pv.get("max").unwrap().value, Supplied(json!(10)));
        assert!(pv.get("cfg").unwrap().pinned);
        let region = pv.get("region").unwrap();
        assert!(region.pinned);
        assert_eq!(region.origin, Origin::Env("BINDERY_PIN_REGION".into()));

        let err = pv.add_flag("--pin", "tenant=x").unwrap_err();
        assert!(matches!(err, ProcessValueError::Twice { .. }), "{err:?}");
        let err = err.to_string();
        assert!(
            err.contains("`tenant` is given twice (--set and --pin)"),
            "{err}"
        );
        let err = pv.add_flag("--set", "novalue").unwrap_err();
        assert!(
            matches!(err, ProcessValueError::NotNameValue { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("NAME=VALUE"), "{err}");
        let err = pv.add_flag("--set-json", "x={bad").unwrap_err();
        assert!(matches!(err, ProcessValueError::NotJson { .. }), "{err:?}");
        assert!(err.to_string().contains("not valid JSON"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.json");
        std::fs::write(
            &f,
            r#"{"a": "x", "b": {"value": 3, "pinned": true}, "c": {"value": 1, "other": 2}}"#,
        )
        .unwrap();
        let mut pv = ProcessValues::new();
        pv.add_params_file(&f).unwrap();
        assert_eq!(pv.get("a").unwrap().value, Supplied(json!("x")));
        assert!(pv.get("b").unwrap().pinned);
        assert_eq!(pv.get("b").unwrap().value, Supplied(json!(3)));
        assert_eq!(
            pv.get("c").unwrap().value,
            Supplied(json!({"value": 1, "other": 2}))
        );
    }
}
