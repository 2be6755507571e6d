//! The JSON a script prints for `describe`.

use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct ScriptInfo {
    pub slug: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub args: Vec<ScriptArg>,
    #[serde(
        rename = "empty-result",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub empty_result: Option<EmptyResult>,
    /// The media type of what `run` prints (`image/png`): its stdout
    /// reaches the model as that medium, not as text.
    #[serde(
        rename = "output-media-type",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub output_media_type: Option<String>,
}

#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct ScriptArg {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_type: Option<String>,
    pub arity: Arity,
    pub mode: Mode,
}

impl ScriptArg {
    /// The JSON-schema type the model is shown.
    pub fn json_type(&self) -> &'static str {
        match self.type_.as_str() {
            "number" | "float" | "double" => "number",
            "integer" | "int" => "integer",
            "boolean" | "bool" => "boolean",
            _ => "string",
        }
    }
}

/// `single`: the argument is required; `optional`: it may be left out.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Arity {
    Single,
    Optional,
}

/// How an argument reaches the script.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The value alone, in argv.
    Positional,
    /// `--name value`.
    Dashdashspace,
    /// `--name=value`.
    Dashdashequal,
    /// A line on stdin.
    Stdin,
    /// Environment variable `NAME` (upper-cased, `-` as `_`); never in argv.
    Env,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Positional => "positional",
            Mode::Dashdashspace => "dashdashspace",
            Mode::Dashdashequal => "dashdashequal",
            Mode::Stdin => "stdin",
            Mode::Env => "env",
        }
    }
}

/// What the model gets when a script prints nothing.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(tag = "tag", content = "contents")]
pub enum EmptyResult {
    DoNothing,
    AddMessage(String),
}

/// The environment variable an `env`-mode argument becomes.
pub fn env_var_name(arg: &str) -> String {
    arg.chars()
        .map(|c| match c {
            '-' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_description() {
        let info: ScriptInfo = serde_json::from_str(
            r#"{"slug":"t","description":"d","args":[
                {"name":"repo-token","description":"","type":"string","backing_type":"string","arity":"single","mode":"env"},
                {"name":"n","type":"int","arity":"optional","mode":"dashdashequal","tier":"basic"}],
              "empty-result":{"tag":"AddMessage","contents":"nothing"}}"#,
        )
        .unwrap();
        assert_eq!(info.args[0].mode, Mode::Env);
        assert_eq!(info.args[1].arity, Arity::Optional);
        assert_eq!(info.args[1].json_type(), "integer");
        assert_eq!(
            info.empty_result,
            Some(EmptyResult::AddMessage("nothing".into()))
        );
        assert_eq!(env_var_name("repo-token"), "REPO_TOKEN");
        let chart: ScriptInfo =
            serde_json::from_str(r#"{"slug":"chart","args":[],"output-media-type":"image/png"}"#)
                .unwrap();
        assert_eq!(chart.output_media_type.as_deref(), Some("image/png"));
        assert_eq!(info.output_media_type, None);
        let bad: Result<ScriptInfo, _> = serde_json::from_str(
            r#"{"slug":"t","args":[{"name":"x","type":"string","arity":"single","mode":"shout"}]}"#,
        );
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("unknown variant `shout`"));
    }
}
