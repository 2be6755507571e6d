//! An agents-exe session, typed as agents-exe's `Session/Types.hs` reads
//! it (its `FromJSON` instances), legacy forms included: a query as a bare
//! string, a tool response as `{"_userToolResponse": v}` or a bare value,
//! a turn without `byteUsage`. Turns stay newest first, as stored.
//! Parsing never panics: a wrong shape is an error naming where it is.

use serde_json::{Map, Value};

#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    /// Newest first, as agents-exe stores them.
    pub turns: Vec<Turn>,
    pub session_id: Option<String>,
    pub forked_from: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub kind: TurnKind,
    /// `byteUsage.stepTokenUsage`: the provider's count for the step.
    pub tokens: Option<TokenUsage>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TurnKind {
    User(UserTurn),
    Llm(LlmTurn),
    /// An async step in progress: its `completedResponses` are in
    /// `user.responses`.
    Partial {
        user: UserTurn,
        pending: Vec<Value>,
    },
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct UserTurn {
    pub system_prompt: String,
    pub tools: Vec<SystemTool>,
    pub query: Option<String>,
    /// `(call object, response)` in the order of the calls.
    pub responses: Vec<(Value, ToolResponse)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LlmTurn {
    pub text: Option<String>,
    pub thinking: Option<String>,
    /// `llmToolCalls`: the raw call objects
    /// (`{"id", "type", "function": {"name", "arguments"}}`).
    pub calls: Vec<Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SystemTool {
    V0(Value),
    V1 {
        name: String,
        llm_name: String,
        description: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum ToolResponse {
    Text(String),
    Json(Value),
    Media(Media),
    Mixed(Vec<Part>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Media {
    pub mime: String,
    /// Characters of `base64Data` (what agents-exe reports as its size).
    pub base64_len: usize,
    pub filename: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Text(String),
    Media(Media),
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct TokenUsage {
    pub prompt: i64,
    pub completion: i64,
    pub total: i64,
    pub cached: Option<i64>,
    pub thinking: Option<i64>,
}

type Obj = Map<String, Value>;

/// Where a document is not an agents-exe session: the place (`turns[2].contents`)
/// and what is wrong there.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error("{at} is not an object")]
    NotObject { at: String },
    #[error("{at} is not a string")]
    NotString { at: String },
    #[error("{at} is not a list")]
    NotList { at: String },
    #[error("it has no \"turns\" list")]
    NoTurns,
    #[error("{at} has no \"tag\"")]
    NoTag { at: String },
    #[error("{at} has tag {tag:?} (agents-exe's are UserTurn, LlmTurn and PartialUserTurn)")]
    UnknownTag { at: String, tag: String },
    #[error("{at} has no \"text\"")]
    NoText { at: String },
    #[error("{at} is neither text nor {{\"text\"}}")]
    NotQuery { at: String },
    #[error("{at} is not a [call, response] pair")]
    NotPair { at: String },
}

fn obj<'a>(v: &'a Value, at: &str) -> Result<&'a Obj, ShapeError> {
    v.as_object()
        .ok_or_else(|| ShapeError::NotObject { at: at.to_string() })
}

/// A key holding a string, or absent/null.
fn opt_str(o: &Obj, key: &str, at: &str) -> Result<Option<String>, ShapeError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ShapeError::NotString {
            at: format!("{at}.{key}"),
        }),
    }
}

/// A key holding a list, or absent (then empty).
fn list<'a>(o: &'a Obj, key: &str, at: &str) -> Result<&'a [Value], ShapeError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(ShapeError::NotList {
            at: format!("{at}.{key}"),
        }),
    }
}

impl Session {
    /// The session in `doc`, or where it is not one.
    pub fn parse(doc: &Value) -> Result<Session, ShapeError> {
        let o = obj(doc, "the session")?;
        let Some(Value::Array(turns)) = o.get("turns") else {
            return Err(ShapeError::NoTurns);
        };
        let turns = turns
            .iter()
            .enumerate()
            .map(|(i, t)| Turn::parse(t, &format!("turns[{i}]")))
            .collect::<Result<_, _>>()?;
        Ok(Session {
            turns,
            session_id: opt_str(o, "sessionId", "the session")?,
            forked_from: opt_str(o, "forkedFromSessionId", "the session")?,
        })
    }
}

impl Turn {
    fn parse(v: &Value, at: &str) -> Result<Turn, ShapeError> {
        let o = obj(v, at)?;
        let tag = o
            .get("tag")
            .and_then(Value::as_str)
            .ok_or_else(|| ShapeError::NoTag { at: at.to_string() })?;
        let c_at = format!("{at}.contents");
        let contents = obj(o.get("contents").unwrap_or(&Value::Null), &c_at)?;
        let kind = match tag {
            // `_v0`: agents-exe's parser of turns older than `byteUsage`.
            "UserTurn" | "UserTurn_v0" => TurnKind::User(UserTurn::parse(
                contents,
                &c_at,
                ["userPrompt", "userTools", "userQuery", "userToolResponses"],
            )?),
            "LlmTurn" | "LlmTurn_v0" => TurnKind::Llm(LlmTurn::parse(contents, &c_at)?),
            "PartialUserTurn" => TurnKind::Partial {
                user: UserTurn::parse(
                    contents,
                    &c_at,
                    ["userPrompt", "userTools", "userQuery", "completedResponses"],
                )?,
                pending: list(contents, "pendingCalls", &c_at)?.to_vec(),
            },
            other => {
                return Err(ShapeError::UnknownTag {
                    at: at.to_string(),
                    tag: other.to_string(),
                })
            }
        };
        let tokens = o
            .get("byteUsage")
            .and_then(|u| u.get("stepTokenUsage"))
            .and_then(TokenUsage::parse);
        Ok(Turn { kind, tokens })
    }
}

impl UserTurn {
    fn parse(o: &Obj, at: &str, keys: [&str; 4]) -> Result<UserTurn, ShapeError> {
        let [prompt, tools, query, responses] = keys;
        let query = match o.get(query) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(q)) => Some(
                opt_str(q, "text", &format!("{at}.{query}"))?.ok_or_else(|| {
                    ShapeError::NoText {
                        at: format!("{at}.{query}"),
                    }
                })?,
            ),
            Some(_) => {
                return Err(ShapeError::NotQuery {
                    at: format!("{at}.{query}"),
                })
            }
        };
        let responses = list(o, responses, at)?
            .iter()
            .enumerate()
            .map(|(i, pair)| match pair.as_array().map(Vec::as_slice) {
                Some([call, response]) => Ok((call.clone(), ToolResponse::parse(response))),
                _ => Err(ShapeError::NotPair {
                    at: format!("{at}.{responses}[{i}]"),
                }),
            })
            .collect::<Result<_, _>>()?;
        Ok(UserTurn {
            system_prompt: opt_str(o, prompt, at)?.unwrap_or_default(),
            tools: list(o, tools, at)?.iter().map(SystemTool::parse).collect(),
            query,
            responses,
        })
    }
}

impl LlmTurn {
    fn parse(o: &Obj, at: &str) -> Result<LlmTurn, ShapeError> {
        let r_at = format!("{at}.llmResponse");
        let response = obj(o.get("llmResponse").unwrap_or(&Value::Null), &r_at)?;
        Ok(LlmTurn {
            text: opt_str(response, "responseText", &r_at)?,
            thinking: opt_str(response, "responseThinking", &r_at)?,
            calls: list(o, "llmToolCalls", at)?.to_vec(),
        })
    }
}

impl SystemTool {
    fn parse(v: &Value) -> SystemTool {
        let tag = v.get("tag").and_then(Value::as_str);
        let c = v.get("contents");
        let field = |k: &str| c.and_then(|c| c.get(k)).and_then(Value::as_str);
        match (tag, field("name"), field("llmName"), field("description")) {
            (Some("V1"), Some(name), Some(llm_name), Some(description)) => SystemTool::V1 {
                name: name.into(),
                llm_name: llm_name.into(),
                description: description.into(),
            },
            (Some("V0"), ..) => SystemTool::V0(c.cloned().unwrap_or(Value::Null)),
            _ => SystemTool::V0(v.clone()),
        }
    }
}

impl Media {
    fn parse(o: &Obj) -> Option<Media> {
        Some(Media {
            mime: o.get("mimeType")?.as_str()?.into(),
            base64_len: o.get("base64Data")?.as_str()?.chars().count(),
            filename: match o.get("filename") {
                None | Some(Value::Null) => None,
                Some(f) => Some(f.as_str()?.into()),
            },
        })
    }
}

impl ToolResponse {
    /// The typed form when it is whole; otherwise agents-exe's legacy
    /// reading: `{"_userToolResponse": v}` is `v`, a string is text, any
    /// other value JSON.
    fn parse(v: &Value) -> ToolResponse {
        if let Some(r) = Self::typed(v) {
            return r;
        }
        match v.get("_userToolResponse").unwrap_or(v) {
            Value::String(s) => ToolResponse::Text(s.clone()),
            other => ToolResponse::Json(other.clone()),
        }
    }

    fn typed(v: &Value) -> Option<ToolResponse> {
        let o = v.as_object()?;
        Some(match o.get("type")?.as_str()? {
            "text" => ToolResponse::Text(o.get("content")?.as_str()?.into()),
            "json" => ToolResponse::Json(o.get("content")?.clone()),
            "media" => ToolResponse::Media(Media::parse(o)?),
            "mixed" => ToolResponse::Mixed(
                o.get("parts")?
                    .as_array()?
                    .iter()
                    .map(|p| {
                        let p = p.as_object()?;
                        match p.get("type")?.as_str()? {
                            "text" => Some(Part::Text(p.get("text")?.as_str()?.into())),
                            "media" => Some(Part::Media(Media::parse(p)?)),
                            _ => None,
                        }
                    })
                    .collect::<Option<_>>()?,
            ),
            _ => return None,
        })
    }
}

impl TokenUsage {
    /// agents-exe's reading of a provider's `usage` (OpenAI's, Claude's
    /// and Kimi's names).
    fn parse(v: &Value) -> Option<TokenUsage> {
        let o = v.as_object()?;
        let int = |k: &str| o.get(k).and_then(Value::as_i64);
        let prompt = int("prompt_tokens").or(int("input_tokens")).unwrap_or(0);
        let completion = int("completion_tokens")
            .or(int("output_tokens"))
            .unwrap_or(0);
        Some(TokenUsage {
            prompt,
            completion,
            total: int("total_tokens").unwrap_or(prompt.saturating_add(completion)),
            cached: int("cached_tokens").or_else(|| {
                o.get("prompt_tokens_details")
                    .and_then(|d| d.get("cached_tokens"))
                    .and_then(Value::as_i64)
            }),
            thinking: int("reasoning_tokens").or(int("thinking_tokens")),
        })
    }
}

/// A call's tool name as agents-exe reads it: `function.name`, else a
/// top-level `name`.
pub fn call_name(call: &Value) -> Option<&str> {
    match call.get("function") {
        Some(Value::Object(f)) => f.get("name").and_then(Value::as_str),
        _ => call.get("name").and_then(Value::as_str),
    }
}

impl Session {
    /// Every LlmTurn's calls, with the turn's place (from 1, newest first)
    /// and the call's place in its turn (from 0): each call once, although
    /// agents-exe stores it three times (here, in the provider's raw
    /// response, and with its response in the next UserTurn).
    pub fn calls(&self) -> impl Iterator<Item = (usize, usize, &Value)> {
        self.turns.iter().enumerate().flat_map(|(t, turn)| {
            match &turn.kind {
                TurnKind::Llm(l) => l.calls.as_slice(),
                _ => &[],
            }
            .iter()
            .enumerate()
            .map(move |(i, c)| (t + 1, i, c))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn legacy_forms_are_read_as_agents_exe_reads_them() {
        let doc = json!({"sessionId": "s", "turnId": "t", "turns": [
            {"tag": "UserTurn", "contents": {"userPrompt": "sys\n", "userTools": [
                {"tag": "V1", "contents": {"name": "x", "llmName": "bash_x", "description": "d",
                    "properties": [], "raw": {}}},
                {"tag": "V0", "contents": {"old": true}}],
              "userQuery": null,
              "userToolResponses": [
                [{"id": "a"}, {"_userToolResponse": "legacy text"}],
                [{"id": "b"}, {"k": 1}],
                [{"id": "c"}, {"type": "text", "content": 5}],
                [{"id": "d"}, {"type": "mixed", "parts": [{"type": "text", "text": "t"},
                    {"type": "media", "mimeType": "image/png", "base64Data": "AAAA"}]}]]}},
            {"tag": "LlmTurn", "byteUsage": {"stepTotalBytes": 1, "stepInputBytes": 1,
                "stepOutputBytes": 0, "stepReasoningBytes": 0, "stepToolBytes": 0,
                "stepTokenUsage": {"input_tokens": 7, "output_tokens": 3}},
             "contents": {"llmResponse": {"responseText": null, "responseThinking": "hm",
                "rawResponse": {}}, "llmToolCalls": [{"id": "a"}]}},
            {"tag": "UserTurn", "contents": {"userPrompt": "sys\n", "userTools": [],
                "userQuery": "legacy query", "userToolResponses": []}}
        ]});
        let s = Session::parse(&doc).unwrap();
        let TurnKind::User(u) = &s.turns[0].kind else {
            panic!()
        };
        assert_eq!(
            u.tools[0],
            SystemTool::V1 {
                name: "x".into(),
                llm_name: "bash_x".into(),
                description: "d".into()
            }
        );
        assert_eq!(u.tools[1], SystemTool::V0(json!({"old": true})));
        assert_eq!(u.responses[0].1, ToolResponse::Text("legacy text".into()));
        assert_eq!(u.responses[1].1, ToolResponse::Json(json!({"k": 1})));
        // A broken typed form is read as a legacy value, as agents-exe does.
        assert_eq!(
            u.responses[2].1,
            ToolResponse::Json(json!({"type": "text", "content": 5}))
        );
        assert!(matches!(&u.responses[3].1, ToolResponse::Mixed(p) if p.len() == 2));
        assert_eq!(
            s.turns[1].tokens,
            Some(TokenUsage {
                prompt: 7,
                completion: 3,
                total: 10,
                cached: None,
                thinking: None
            })
        );
        let TurnKind::User(q) = &s.turns[2].kind else {
            panic!()
        };
        assert_eq!(q.query.as_deref(), Some("legacy query"));
    }

    #[test]
    fn what_is_not_a_session_is_named() {
        for (doc, says) in [
            (json!([]), "is not an object"),
            (json!({"turns": 3}), "no \"turns\" list"),
            (
                json!({"turns": [{"tag": "Bot", "contents": {}}]}),
                "turns[0] has tag \"Bot\"",
            ),
            (
                json!({"turns": [{"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": 1}}}]}),
                "turns[0].contents.llmResponse.responseText is not a string",
            ),
            (
                json!({"turns": [{"tag": "UserTurn", "contents": {"userToolResponses": [[1]]}}]}),
                "userToolResponses[0] is not a [call, response] pair",
            ),
        ] {
            let err = Session::parse(&doc).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }
}
