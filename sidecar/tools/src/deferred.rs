//! Deferred tools: given by their schema only, run by the client. The
//! model sees them like any other tool; a call never runs here, it waits
//! (pending) until the client posts the result.

use async_trait::async_trait;

use super::{ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport};
use bindery_spec::DeferredTool as Decl;

/// A deferred tool's `parameters` that give no arguments; names the tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool `{0}`: `parameters.properties` must be an object")]
pub struct PropertiesNotAnObject(pub String);

pub struct DeferredTool {
    spec: ToolSpec,
}

impl DeferredTool {
    /// The tool as declared; `Err` says what is wrong with its schema.
    pub fn new(decl: &Decl) -> Result<Self, PropertiesNotAnObject> {
        let schema = &decl.parameters;
        let properties = match schema.get("properties") {
            None => serde_json::Map::new(),
            Some(serde_json::Value::Object(p)) => p.clone(),
            Some(_) => return Err(PropertiesNotAnObject(decl.name.clone())),
        };
        let required: Vec<&str> = schema
            .get("required")
            .and_then(|r| r.as_array())
            .map(|r| r.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let args = properties
            .into_iter()
            .map(|(name, prop)| ArgSpec {
                description: prop
                    .get("description")
                    .and_then(|d| d.as_str())
                    .unwrap_or("")
                    .to_string(),
                required: required.contains(&name.as_str()),
                name,
                schema: prop,
                transport: Transport::Json,
            })
            .collect();
        Ok(DeferredTool {
            spec: ToolSpec {
                name: decl.name.clone(),
                local_name: decl.name.clone(),
                description: decl.description.clone(),
                args,
                writes: true,
            },
        })
    }
}

#[async_trait]
impl Tool for DeferredTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
        // The run stops before a deferred call; reaching here is a bug.
        Err(ToolError::Failed(
            "this tool is run by the client, not by the agent's server".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decl(parameters: serde_json::Value) -> Decl {
        Decl {
            name: "get_location".into(),
            description: String::new(),
            parameters,
        }
    }

    #[test]
    fn properties_give_the_arguments_and_anything_else_is_refused() {
        let t = DeferredTool::new(&decl(json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"]
        })))
        .unwrap();
        assert_eq!(t.spec().args.len(), 1);
        assert!(t.spec().args[0].required);
        assert!(DeferredTool::new(&decl(json!({"type": "object"}))).is_ok());
        let err = DeferredTool::new(&decl(json!({"properties": ["city"]})))
            .err()
            .unwrap();
        assert_eq!(err, PropertiesNotAnObject("get_location".into()));
        assert_eq!(
            err.to_string(),
            "tool `get_location`: `parameters.properties` must be an object"
        );
    }
}
