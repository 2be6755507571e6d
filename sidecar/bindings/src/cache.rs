//! A tool-result cache that cannot answer one tenant, or one session, with
//! another's result.
//!
//! The key covers everything the tool is given: the agent's place in the
//! tree (the chain of agents from the top-level one down to it: two agents,
//! or one agent reached by two paths, may each have a tool of the same name
//! bound differently), the tool, the model's arguments, a digest of every
//! non-secret parameter value of the run (so bound values such as a tenant
//! id are part of it), and the session's context when the tool is handed it
//! (a bash tool's `AGENT_SESSION_ID`, `AGENT_TURN_ID`, `AGENT_SESSION_JSON`,
//! …: its output may carry the conversation). A bash toolbox declared
//! `cache: shared` is run without that context, and only its results serve
//! every session.
//!
//! A call whose bound values include a secret is never cached: a token
//! hashed into a key is an oracle, and a result fetched with one credential
//! must not be replayed for another.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

// tokio's instant: in-process tests move the TTL with `tokio::time::advance`.
use tokio::time::Instant;

use sha2::{Digest, Sha256};

use super::BoundTool;
use bindery_params::Values;
use bindery_tools::CallContext;

pub type CacheKey = [u8; 32];

pub struct ToolCache {
    ttl: Duration,
    max_entries: usize,
    entries: Mutex<HashMap<CacheKey, (Instant, String)>>,
}

impl ToolCache {
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        ToolCache {
            ttl,
            max_entries,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The key for this call by the agent at `place` (its call stack,
    /// top-level agent first), handing the tool `ctx`, or `None` when it
    /// must not be cached.
    pub fn key(
        place: &[String],
        tool: &BoundTool,
        model_args: &serde_json::Value,
        values: &Values,
        ctx: &CallContext,
    ) -> Option<CacheKey> {
        if tool.uses_secret(values) {
            return None;
        }
        // The session's context, where the tool is given it.
        let context = tool.receives_session().then_some((
            &ctx.session_id,
            &ctx.conversation_id,
            &ctx.turn_id,
            &ctx.agent_id,
            ctx.session_json.as_deref(),
        ));
        let non_secret: Vec<(&String, &serde_json::Value)> = values
            .iter()
            .filter_map(|(k, v)| v.plain().map(|p| (k, p)))
            .collect();
        let mut h = Sha256::new();
        // Length-prefixed parts: no two different calls share an encoding.
        for part in [
            serde_json::to_vec(place).ok()?,
            tool.name().as_bytes().to_vec(),
            serde_json::to_vec(model_args).ok()?,
            serde_json::to_vec(&non_secret).ok()?,
            // Narrowings a calling agent fixed for this call.
            serde_json::to_vec(&tool.fixed_values()).ok()?,
            serde_json::to_vec(&context).ok()?,
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(&part);
        }
        Some(h.finalize().into())
    }

    pub fn get(&self, key: &CacheKey) -> Option<String> {
        let mut map = self.entries.lock().ok()?;
        match map.get(key) {
            Some((at, text)) if at.elapsed() < self.ttl => Some(text.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    pub fn put(&self, key: CacheKey, text: String) {
        let Ok(mut map) = self.entries.lock() else {
            return;
        };
        if map.len() >= self.max_entries {
            let ttl = self.ttl;
            map.retain(|_, (at, _)| at.elapsed() < ttl);
            if map.len() >= self.max_entries {
                map.clear();
            }
        }
        map.insert(key, (Instant::now(), text));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::AppliedBinding;
    use crate::BoundValue;
    use bindery_params::{ParamValue, SecretString};
    use bindery_spec::WhenUnbound;
    use bindery_tools::{CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec};

    struct Nop(ToolSpec, bool);

    #[async_trait::async_trait]
    impl Tool for Nop {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn receives_session(&self) -> bool {
            self.1
        }
        async fn call(&self, _: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text(""))
        }
    }

    fn tool(bound_to: &str) -> BoundTool {
        tool_given_session(bound_to, false)
    }

    fn tool_given_session(bound_to: &str, given: bool) -> BoundTool {
        BoundTool::new(Arc::new(Nop(
            ToolSpec {
                name: "t".into(),
                local_name: "t".into(),
                description: String::new(),
                args: Vec::new(),
                writes: false,
            },
            given,
        )))
        .with_bindings([AppliedBinding {
            arg: "a".into(),
            value: BoundValue::Param(bound_to.into()),
            when_unbound: WhenUnbound::Fail,
        }])
    }

    fn values(tenant: &str) -> Values {
        [
            ("tenant".to_string(), ParamValue::Plain(json!(tenant))),
            (
                "token".to_string(),
                ParamValue::Secret(SecretString::new("s")),
            ),
        ]
        .into()
    }

    #[test]
    fn keys_separate_tenants_and_skip_secrets() {
        let cx = CallContext::default();
        let t = tool("tenant");
        let args = json!({"q": 1});
        let root = ["root".to_string()];
        let a = ToolCache::key(&root, &t, &args, &values("acme"), &cx).unwrap();
        assert_eq!(
            Some(a),
            ToolCache::key(&root, &t, &args, &values("acme"), &cx)
        );
        assert_ne!(
            Some(a),
            ToolCache::key(&root, &t, &args, &values("globex"), &cx)
        );
        assert_ne!(
            Some(a),
            ToolCache::key(&root, &t, &json!({"q": 2}), &values("acme"), &cx)
        );
        assert_eq!(
            ToolCache::key(&root, &tool("token"), &args, &values("acme"), &cx),
            None
        );
        // Another agent's tool of the same name, or the same agent reached
        // by another path, has keys of its own.
        let other = ["other".to_string()];
        assert_ne!(
            Some(a),
            ToolCache::key(&other, &t, &args, &values("acme"), &cx)
        );
        let below = ["root".to_string(), "helper".to_string()];
        let via = ["other".to_string(), "helper".to_string()];
        assert_ne!(
            ToolCache::key(&below, &t, &args, &values("acme"), &cx),
            ToolCache::key(&via, &t, &args, &values("acme"), &cx)
        );

        let cache = ToolCache::new(Duration::from_secs(60), 2);
        cache.put(a, "result".into());
        assert_eq!(cache.get(&a).as_deref(), Some("result"));
        let expired = ToolCache::new(Duration::ZERO, 2);
        expired.put(a, "result".into());
        assert_eq!(expired.get(&a), None);
    }

    #[test]
    fn a_tool_given_the_session_is_keyed_by_it() {
        let root = ["root".to_string()];
        let args = json!({});
        let session = |id: &str, json: &str| CallContext {
            session_id: id.into(),
            session_json: Some(json.into()),
            ..CallContext::default()
        };
        let a = session("a", r#"{"turns":["alpha"]}"#);
        let b = session("b", r#"{"turns":["beta"]}"#);
        let given = tool_given_session("tenant", true);
        let key =
            |t: &BoundTool, cx: &CallContext| ToolCache::key(&root, t, &args, &values("acme"), cx);
        assert_ne!(key(&given, &a), key(&given, &b));
        assert_ne!(
            key(&given, &a),
            key(&given, &session("a", r#"{"turns":[]}"#))
        );
        assert_eq!(key(&given, &a), key(&given, &a.clone()));
        // A tool given nothing of the session is keyed without it.
        let shared = tool("tenant");
        assert_eq!(key(&shared, &a), key(&shared, &b));
    }

    /// A result is answered until its TTL has passed, and not after.
    #[tokio::test(start_paused = true)]
    async fn a_result_is_kept_for_its_ttl() {
        let cache = ToolCache::new(Duration::from_secs(600), 10);
        cache.put([1; 32], "kept".into());
        tokio::time::advance(Duration::from_secs(599)).await;
        assert_eq!(cache.get(&[1; 32]).as_deref(), Some("kept"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&[1; 32]), None);
    }
}
