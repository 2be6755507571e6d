//! What an MCP server says, in Bindery's terms (pure: no I/O): a listed
//! tool becomes a [`ToolSpec`], a call's result becomes the text the model
//! reads. Both work on the protocol's JSON, whatever SDK carried it.

use serde_json::{Map, Value};

use super::ToolSpecError;
use crate::openapi::sanitize_name;
use crate::{ArgSpec, ToolError, ToolSpec, Transport};
use bindery_params::scrub::Scrubber;

/// How deep local `$ref`s are inlined into argument schemas; past it, `{}`.
const MAX_REF_DEPTH: usize = 8;

/// The model-visible name of tool `tool` of server `server`, cut to the
/// 64 characters a model accepts (a clash is reported like any other).
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("mcp_{server}_{}", sanitize_name(tool))
        .chars()
        .take(64)
        .collect()
}

/// One listed tool (`{"name", "description", "inputSchema", …}`) as a
/// [`ToolSpec`]; `Err` says why it is skipped.
pub fn tool_spec(server: &str, tool: &Value) -> Result<ToolSpec, ToolSpecError> {
    let local = tool
        .get("name")
        .and_then(Value::as_str)
        .ok_or(ToolSpecError::NoName)?;
    if sanitize_name(local).is_empty() {
        return Err(ToolSpecError::NoLetterOrDigit {
            name: local.to_string(),
        });
    }
    let description = ["description", "title"]
        .iter()
        .find_map(|k| {
            tool.get(*k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .unwrap_or(local)
        .to_string();
    let schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
    let properties = schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let args = properties
        .into_iter()
        .flatten()
        .map(|(name, prop)| {
            let prop = inline_refs(&schema, prop, 0);
            ArgSpec {
                name: name.clone(),
                description: prop
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                required: required.contains(&name.as_str()),
                schema: prop,
                transport: Transport::Json,
            }
        })
        .collect();
    Ok(ToolSpec {
        name: tool_name(server, local),
        local_name: local.to_string(),
        description,
        args,
        writes: !read_only(tool),
    })
}

/// Whether the server annotates the tool `readOnlyHint: true` (MCP's
/// default is that a tool may write).
fn read_only(tool: &Value) -> bool {
    tool.pointer("/annotations/readOnlyHint")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `value` with `{"$ref": "#/…"}` replaced by what it points to in `root`
/// (the argument schemas are shown to the model one by one, without the
/// root's `$defs`).
fn inline_refs(root: &Value, value: &Value, depth: usize) -> Value {
    match value {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                if depth >= MAX_REF_DEPTH {
                    return Value::Object(Map::new());
                }
                if let Some(target) = r.strip_prefix('#').and_then(|p| root.pointer(p)) {
                    return inline_refs(root, target, depth + 1);
                }
            }
            Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), inline_refs(root, v, depth)))
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| inline_refs(root, v, depth)).collect())
        }
        other => other.clone(),
    }
}

/// A `tools/call` result as the model gets it: its text (see
/// [`result_text`]), then its images, each as media when its `data` is
/// base64 of at most `max` bytes (together) and its `mimeType` a media
/// type; an image that is not stays named in the text only.
pub fn result_output(
    result: &Value,
    max: usize,
    scrubber: &Scrubber,
) -> Result<crate::ToolOutput, ToolError> {
    use crate::{OutputPart, ToolOutput};
    use base64::Engine as _;
    let text = result_text(result, max, scrubber)?;
    let mut media = Vec::new();
    let mut room = max;
    for c in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("image"))
    {
        let mime = c.get("mimeType").and_then(Value::as_str).unwrap_or("");
        let data = c.get("data").and_then(Value::as_str).unwrap_or("");
        // Base64 is 4 characters for 3 bytes: a longer text is too big.
        if !bindery_llm::content::is_media_type(mime) || data.len() / 4 * 3 > room {
            continue;
        }
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data) else {
            continue;
        };
        room -= bytes.len().min(room);
        media.push(OutputPart::Media(bindery_llm::Media {
            mime: mime.to_string(),
            bytes,
        }));
    }
    if media.is_empty() {
        return Ok(ToolOutput::Text(text));
    }
    media.insert(0, OutputPart::Text(text));
    Ok(ToolOutput::Mixed(media))
}

/// A call's result (`{"content": [...], "structuredContent"?, "isError"?}`)
/// as text: text parts joined by newlines, other kinds named in brackets,
/// the structured content when there is no other; cut at `max` bytes.
/// `Err` ([`ToolError::Failed`], the server's own words) when the server
/// flagged the result as an error.
pub fn result_text(result: &Value, max: usize, scrubber: &Scrubber) -> Result<String, ToolError> {
    let mut parts: Vec<String> = Vec::new();
    for c in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
        parts.push(match field("type") {
            "text" => field("text").to_string(),
            "image" => format!("[image {}]", field("mimeType")),
            "audio" => format!("[audio {}]", field("mimeType")),
            "resource_link" => format!("[resource link {} {}]", field("name"), field("uri")),
            "resource" => match c.pointer("/resource/text").and_then(Value::as_str) {
                Some(t) => t.to_string(),
                None => format!(
                    "[resource {}]",
                    c.pointer("/resource/uri")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ),
            },
            other => format!("[{other} content]"),
        });
    }
    if parts.is_empty() {
        if let Some(s) = result.get("structuredContent").filter(|s| !s.is_null()) {
            parts.push(s.to_string());
        }
    }
    // Scrubbed before it is cut: a secret that starts before the limit is
    // replaced whole, none of it left at the cut.
    let (mut text, cut) = scrubber.scrub_cut(&parts.join("\n"), max);
    if cut {
        text.push_str(&format!("\n[result cut at {max} bytes]"));
    }
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        Err(ToolError::Failed(if text.is_empty() {
            "the tool failed without saying why".to_string()
        } else {
            text
        }))
    } else {
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An MCP tool's image reaches the model as an image, after the
    /// text; one that is not base64, has no media type or is past the
    /// limit stays named in the text only.
    #[test]
    fn an_image_in_a_result_is_media() {
        use crate::{OutputPart, ToolOutput};
        let r = json!({"content": [
            {"type": "text", "text": "the chart"},
            {"type": "image", "mimeType": "image/png", "data": "iVBORw=="},
            {"type": "image", "mimeType": "image/png", "data": "not base64!"},
            {"type": "image", "mimeType": "png", "data": "iVBORw=="}]});
        let out = result_output(&r, 1000, &Scrubber::default()).unwrap();
        assert_eq!(
            out,
            ToolOutput::Mixed(vec![
                OutputPart::Text(
                    "the chart\n[image image/png]\n[image image/png]\n[image png]".into()
                ),
                OutputPart::Media(bindery_llm::Media {
                    mime: "image/png".into(),
                    bytes: vec![0x89, b'P', b'N', b'G'],
                }),
            ])
        );
        let small = result_output(&r, 2, &Scrubber::default()).unwrap();
        assert!(matches!(small, ToolOutput::Text(_)), "{small:?}");
        let text = json!({"content": [{"type": "text", "text": "hi"}]});
        assert_eq!(
            result_output(&text, 10, &Scrubber::default()).unwrap(),
            ToolOutput::text("hi")
        );
    }

    #[test]
    fn a_listed_tool_becomes_a_spec() {
        let spec = tool_spec(
            "billing",
            &json!({
                "name": "get invoice",
                "title": "Get",
                "description": "One invoice",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "Invoice id"},
                        "tenant": {"$ref": "#/$defs/Tenant"}
                    },
                    "required": ["id"],
                    "$defs": {"Tenant": {"type": "string", "description": "Whose"}}
                }
            }),
        )
        .unwrap();
        assert_eq!(spec.name, "mcp_billing_get_invoice");
        // Not annotated read-only: it may write (`confirm: writes` asks).
        assert!(spec.writes);
        let read_only = json!({"name": "get", "annotations": {"readOnlyHint": true}});
        assert!(!tool_spec("billing", &read_only).unwrap().writes);
        let said_no = json!({"name": "put", "annotations": {"readOnlyHint": false}});
        assert!(tool_spec("billing", &said_no).unwrap().writes);
        assert_eq!(tool_name("s", &"x".repeat(80)).len(), 64);
        assert_eq!(spec.local_name, "get invoice");
        assert_eq!(spec.description, "One invoice");
        assert_eq!(spec.args.len(), 2);
        let id = spec.arg("id").unwrap();
        assert!(id.required);
        assert_eq!(id.description, "Invoice id");
        let tenant = spec.arg("tenant").unwrap();
        assert!(!tenant.required);
        assert_eq!(
            tenant.schema,
            json!({"type": "string", "description": "Whose"})
        );
    }

    #[test]
    fn tools_without_arguments_or_a_usable_name() {
        let spec = tool_spec(
            "e",
            &json!({"name": "get-env", "inputSchema": {"type": "object"}}),
        )
        .unwrap();
        assert!(spec.args.is_empty());
        assert_eq!(spec.description, "get-env");
        assert!(tool_spec("e", &json!({"name": "??"})).is_err());
    }

    #[test]
    fn results_read_as_text() {
        let r = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "body"}},
            {"type": "resource_link", "uri": "file:///b", "name": "b"}
        ]});
        assert_eq!(
            result_text(&r, 1000, &Scrubber::default()).unwrap(),
            "one\n[image image/png]\nbody\n[resource link b file:///b]"
        );
        let structured = json!({"content": [], "structuredContent": {"sum": 3}});
        assert_eq!(
            result_text(&structured, 1000, &Scrubber::default()).unwrap(),
            r#"{"sum":3}"#
        );
        let failed =
            json!({"content": [{"type": "text", "text": "no such invoice"}], "isError": true});
        assert_eq!(
            result_text(&failed, 1000, &Scrubber::default()).unwrap_err(),
            ToolError::Failed("no such invoice".into())
        );
        let long = json!({"content": [{"type": "text", "text": "é".repeat(10)}]});
        assert_eq!(
            result_text(&long, 5, &Scrubber::default()).unwrap(),
            "éé\n[result cut at 5 bytes]"
        );
    }

    #[test]
    fn a_result_cut_inside_a_secret_keeps_none_of_it() {
        let mut s = Scrubber::default();
        s.add("token", &bindery_params::SecretString::new("s3cr3t-token"));
        for at in 1.."s3cr3t-token".len() {
            let text = format!("{}s3cr3t-token and more", "x".repeat(10 - at.min(10)));
            let r = json!({"content": [{"type": "text", "text": text}]});
            let got = result_text(&r, 10, &s).unwrap();
            assert!(got.starts_with("x") || at >= 10, "{got}");
            assert!(
                got.contains("<secret:token>\n[result cut at 10 bytes]"),
                "{at}: {got}"
            );
            assert!(!got.contains("s3c"), "{got}");
        }
    }
}
