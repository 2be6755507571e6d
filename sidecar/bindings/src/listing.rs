//! What a toolbox says of its tools never carries a secret. An MCP server
//! given a token in its `env`, or an OpenAPI server that echoes the key
//! it was fetched with, writes the listing the model, the metrics, the
//! store and `GET /v1/agents` read. So every listing passes here as it
//! loads or changes: a secret in a description or a schema's text becomes
//! its marker, and a tool whose name or argument names hold one is left
//! out (a name cannot be scrubbed without breaking the calls that use it).

use std::sync::Arc;

use async_trait::async_trait;

use bindery_params::scrub::{folded, holds_folded};
use bindery_params::SecretString;
use bindery_tools::{ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec};

use crate::BoundTool;

/// Why a tool is left out. A name is shown scrubbed (which secret, never
/// its value), or not at all when it holds a value in another form.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ListingRefused {
    #[error(
        "{shown}: its name holds a secret value; the tool is left out (its server must not put a credential in a tool's name)"
    )]
    Name { shown: Shown },
    #[error(
        "tool `{tool}`, {shown}: its name holds a secret value; the tool is left out (its server must not put a credential in an argument's name)"
    )]
    Argument { tool: String, shown: Shown },
    #[error(
        "tool `{tool}`: its description or schema spells a secret value in another form (its letters and digits, with other case or separators); the tool is left out"
    )]
    Text { tool: String },
}

/// A name that holds a secret, as an error may show it.
#[derive(Debug, PartialEq)]
pub enum Shown {
    /// The name with its values as their markers.
    Scrubbed { what: &'static str, name: String },
    /// The name holds a value in a form no marker replaces.
    Hidden { what: &'static str },
}

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shown::Scrubbed { what, name } => write!(f, "{what} `{name}`"),
            Shown::Hidden { what } => write!(f, "a {what} (its name is not shown)"),
        }
    }
}

/// What a listing is checked against: a scrubber of every value it must
/// not show, and those values folded (see [`bindery_params::scrub::fold`]) for names.
pub struct Guard<'a> {
    scrub: &'a dyn Fn(&str) -> String,
    folded: Vec<SecretString>,
    /// Also every live value, folded.
    live: bool,
}

impl<'a> Guard<'a> {
    pub fn new<'s>(
        scrub: &'a dyn Fn(&str) -> String,
        secrets: impl IntoIterator<Item = &'s SecretString>,
    ) -> Self {
        let folded = secrets.into_iter().filter_map(folded).collect();
        Guard {
            scrub,
            folded,
            live: false,
        }
    }

    /// The same guard, which also finds every live value folded in a name
    /// (a changed listing, which may hold any session's value).
    pub fn with_live(self) -> Self {
        Guard { live: true, ..self }
    }

    /// How a name that holds a value, as it is or folded, is shown;
    /// `None`: it holds none.
    fn holds(&self, what: &'static str, name: &str) -> Option<Shown> {
        let scrubbed = (self.scrub)(name);
        if scrubbed != name {
            return Some(Shown::Scrubbed {
                what,
                name: scrubbed,
            });
        }
        self.holds_folded(name).then_some(Shown::Hidden { what })
    }

    /// Whether `text` holds a value folded (see [`bindery_params::scrub::fold`]).
    fn holds_folded(&self, text: &str) -> bool {
        holds_folded(text, &self.folded) || (self.live && bindery_params::live::holds_folded(text))
    }

    /// `tool` as its listing may be shown: unchanged when no value is
    /// found in it, else with the values in its texts replaced by their
    /// markers (the calls still go to the same tool).
    pub fn check(&self, tool: BoundTool) -> Result<BoundTool, ListingRefused> {
        let scrub = self.scrub;
        let spec = tool.spec();
        if let Some(shown) = self.holds("tool", &spec.name) {
            return Err(ListingRefused::Name { shown });
        }
        if let Some(shown) = spec
            .args
            .iter()
            .find_map(|a| self.holds("argument", &a.name))
        {
            return Err(ListingRefused::Argument {
                tool: spec.name.clone(),
                shown,
            });
        }
        let listed = ToolSpec {
            name: spec.name.clone(),
            local_name: scrub(&spec.local_name),
            description: scrub(&spec.description),
            args: spec
                .args
                .iter()
                .map(|a| ArgSpec {
                    name: a.name.clone(),
                    description: scrub(&a.description),
                    required: a.required,
                    schema: scrub_json(&a.schema, scrub),
                    transport: a.transport,
                })
                .collect(),
            writes: spec.writes,
        };
        // A value in another spelling (`SESS_CANARY`, `s-e-s-s…`, a nested
        // property named after it) cannot be replaced by a marker: the
        // tool is left out.
        if self.spells_a_value(&listed) {
            return Err(ListingRefused::Text {
                tool: spec.name.clone(),
            });
        }
        if &listed == spec {
            return Ok(tool);
        }
        Ok(tool.relisted(listed))
    }
}

impl Guard<'_> {
    /// Whether any text of `spec` (its descriptions, its schemas' strings
    /// and keys) holds a value folded.
    fn spells_a_value(&self, spec: &ToolSpec) -> bool {
        fn strings<'v>(v: &'v serde_json::Value, out: &mut Vec<&'v str>) {
            match v {
                serde_json::Value::String(s) => out.push(s),
                serde_json::Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
                serde_json::Value::Object(map) => map.iter().for_each(|(k, v)| {
                    out.push(k);
                    strings(v, out);
                }),
                _ => {}
            }
        }
        let mut texts = vec![spec.description.as_str(), spec.local_name.as_str()];
        for a in &spec.args {
            texts.push(&a.description);
            strings(&a.schema, &mut texts);
        }
        texts.iter().any(|t| self.holds_folded(t))
    }
}

/// Every string of `v` scrubbed, keys included (a schema's property names
/// and enum values are text the model reads too).
fn scrub_json(v: &serde_json::Value, scrub: &dyn Fn(&str) -> String) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(scrub(s)),
        Value::Array(items) => Value::Array(items.iter().map(|i| scrub_json(i, scrub)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (scrub(k), scrub_json(v, scrub)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A tool shown by another listing than its own: calls go to `inner`.
pub(crate) struct Relisted {
    pub(crate) spec: ToolSpec,
    pub(crate) inner: Arc<dyn Tool>,
}

#[async_trait]
impl Tool for Relisted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn secrets(&self) -> Vec<(String, SecretString)> {
        self.inner.secrets()
    }
    fn receives_session(&self) -> bool {
        self.inner.receives_session()
    }
    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        self.inner.call(args, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_params::scrub::Scrubber;
    use bindery_tools::Transport;
    use serde_json::json;

    const CANARY: &str = "CANARY-4f1b9e";

    struct Fake(ToolSpec);

    #[async_trait]
    impl Tool for Fake {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, _: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text("called"))
        }
    }

    fn tool(name: &str, description: &str, arg: &str, schema: serde_json::Value) -> BoundTool {
        BoundTool::new(Arc::new(Fake(ToolSpec {
            name: name.into(),
            local_name: name.into(),
            description: description.into(),
            args: vec![ArgSpec {
                name: arg.into(),
                description: format!("about {arg}"),
                required: true,
                schema,
                transport: Transport::Json,
            }],
            writes: false,
        })))
    }

    fn scrubber() -> Scrubber {
        let mut s = Scrubber::default();
        s.add("api_token", &SecretString::new(CANARY));
        s
    }

    fn run(t: BoundTool) -> Result<BoundTool, ListingRefused> {
        let s = scrubber();
        let scrub = |x: &str| s.scrub(x);
        Guard::new(&scrub, [&SecretString::new(CANARY)]).check(t)
    }

    #[test]
    fn a_clean_listing_is_the_same_tool() {
        let t = tool("lookup", "Look up.", "q", json!({"type": "string"}));
        let out = run(t.clone()).unwrap();
        assert!(Arc::ptr_eq(&out.inner, &t.inner));
    }

    #[test]
    fn a_secret_in_a_description_or_schema_becomes_its_marker() {
        let t = tool(
            "lookup",
            &format!("Look up (auth {CANARY})."),
            "q",
            json!({"type": "string", "description": format!("token {CANARY}"),
                   "enum": [CANARY], "properties": {CANARY: {"type": "string"}}}),
        );
        let out = run(t).unwrap();
        let shown = serde_json::to_string(&out.spec().args[0].schema).unwrap();
        assert!(!shown.contains(CANARY), "{shown}");
        assert!(shown.contains("<secret:api_token>"), "{shown}");
        assert_eq!(out.spec().description, "Look up (auth <secret:api_token>).");
        assert!(!format!("{:?}", out.spec()).contains(CANARY));
    }

    #[test]
    fn a_secret_in_a_name_leaves_the_tool_out_without_showing_it() {
        let e = run(tool(&format!("t_{CANARY}"), "x", "q", json!({})))
            .err()
            .unwrap();
        assert!(matches!(e, ListingRefused::Name { .. }));
        assert!(!e.to_string().contains(CANARY), "{e}");
        assert!(e.to_string().contains("<secret:api_token>"), "{e}");
        let e = run(tool("t", "x", CANARY, json!({}))).err().unwrap();
        assert!(matches!(e, ListingRefused::Argument { .. }));
        assert!(!e.to_string().contains(CANARY), "{e}");
    }

    #[test]
    fn a_name_made_of_a_value_with_other_separators_is_refused_too() {
        // CANARY-4f1b9e as a name may hold it: `canary_4f1b9e`.
        let name = CANARY.replace('-', "_").to_lowercase();
        let e = run(tool(&format!("t_{name}"), "x", "q", json!({})))
            .err()
            .unwrap();
        assert!(matches!(e, ListingRefused::Name { .. }));
        assert!(!e.to_string().to_lowercase().contains(&name), "{e}");
        assert!(
            e.to_string().starts_with("a tool (its name is not shown)"),
            "{e}"
        );
        // A short value is no name's business: `id` is not refused.
        let s = Scrubber::default();
        let scrub = |x: &str| s.scrub(x);
        let guard = Guard::new(&scrub, [&SecretString::new("i-d")]);
        assert!(guard.check(tool("id", "x", "q", json!({}))).is_ok());
    }

    #[tokio::test]
    async fn a_relisted_tool_still_calls_its_own() {
        let t = tool("lookup", CANARY, "q", json!({}));
        let out = run(t).unwrap();
        let ctx = CallContext::default();
        let got = out.inner.call(CallArgs::default(), &ctx).await.unwrap();
        assert_eq!(got, ToolOutput::text("called"));
    }

    /// A value spelled otherwise in a text, a nested property's name or a
    /// fullwidth name cannot be a marker: the tool is left out.
    #[test]
    fn a_value_spelled_otherwise_anywhere_leaves_the_tool_out() {
        let spaced = CANARY.chars().map(|c| format!("{c}-")).collect::<String>();
        let fullwidth: String = CANARY
            .chars()
            .map(|c| match c {
                'A'..='Z' | 'a'..='z' | '0'..='9' => char::from_u32(c as u32 + 0xFEE0).unwrap(),
                c => c,
            })
            .collect();
        let nested =
            json!({"type": "object", "properties": {CANARY.replace('-', "_"): {"type": "string"}}});
        for t in [
            tool("a", &format!("Look up {spaced}"), "q", json!({})),
            tool("b", "x", "q", nested),
            tool(
                "c",
                "x",
                "q",
                json!({"enum": [CANARY.to_lowercase().replace('-', "")]}),
            ),
        ] {
            let e = run(t).err().unwrap();
            assert!(matches!(e, ListingRefused::Text { .. }), "{e}");
            assert!(!e.to_string().contains("4f1b9e"), "{e}");
        }
        let e = run(tool("d", "x", &fullwidth, json!({}))).err().unwrap();
        assert!(matches!(e, ListingRefused::Argument { .. }), "{e}");
    }
}
