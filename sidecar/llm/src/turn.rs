//! One message of a session's conversation, encoded once and shared.
//!
//! A turn never changes once made, so its JSON text is made with it, and a
//! copy of it is a reference count. The store writes that text, a run's
//! requests carry it ([`Conversation::push_turn`]) and the session's view
//! splices it, none of them encoding the message again; reading a session
//! or starting a run copies no conversation. What a round trip costs then
//! no longer grows with the conversation's length, but for the bytes that
//! must go over the wire.
//!
//! [`Conversation::push_turn`]: super::Conversation::push_turn

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::ChatMessage;

/// A [`ChatMessage`] with its JSON text (see the module's docs).
#[derive(Clone)]
pub struct Turn(Arc<Encoded>);

struct Encoded {
    message: ChatMessage,
    /// `serde_json`'s encoding of `message`: what encoding it anew gives.
    json: Box<RawValue>,
    /// Its encoding without the provider's reasoning, when it has some:
    /// what every reader but the store and the provider gets.
    shown: Option<Box<RawValue>>,
}

impl Turn {
    /// The turn of `message`, encoded now.
    pub fn new(message: ChatMessage) -> Turn {
        // A message is strings and lists of strings: its encoding cannot
        // fail (serde_json fails only on maps with non-string keys and on
        // a Serialize impl's own error; it has neither).
        let json = serde_json::value::to_raw_value(&message).expect("a chat message encodes");
        let shown = match &message {
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning: Some(_),
            } => Some(
                serde_json::value::to_raw_value(&ChatMessage::Assistant {
                    content: content.clone(),
                    tool_calls: tool_calls.clone(),
                    reasoning: None,
                })
                .expect("a chat message encodes"),
            ),
            _ => None,
        };
        Turn(Arc::new(Encoded {
            message,
            json,
            shown,
        }))
    }

    /// The turn stored as `text`: decoded, then encoded as this version
    /// encodes it (a store may keep another spelling of the same JSON:
    /// PostgreSQL's `jsonb` reorders keys, an older server wrote what it
    /// wrote), so that its text is always what encoding its message gives.
    pub fn from_json(text: &str) -> serde_json::Result<Turn> {
        Ok(Turn::new(serde_json::from_str(text)?))
    }

    /// The message.
    pub fn message(&self) -> &ChatMessage {
        &self.0.message
    }

    /// Its JSON text, whole: what the store keeps (the provider's
    /// reasoning included, to send back to it).
    pub fn json(&self) -> &str {
        self.0.json.get()
    }

    /// The bytes `turns` take as the items of a JSON array (a separator
    /// each): what a buffer that will hold them should reserve.
    pub fn encoded_len(turns: &[Turn]) -> usize {
        turns.iter().map(|t| t.json().len() + 1).sum()
    }
}

impl Deref for Turn {
    type Target = ChatMessage;

    fn deref(&self) -> &ChatMessage {
        &self.0.message
    }
}

impl From<ChatMessage> for Turn {
    fn from(message: ChatMessage) -> Turn {
        Turn::new(message)
    }
}

impl PartialEq for Turn {
    fn eq(&self, other: &Turn) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.message == other.0.message
    }
}

impl Eq for Turn {}

impl PartialEq<ChatMessage> for Turn {
    fn eq(&self, other: &ChatMessage) -> bool {
        &self.0.message == other
    }
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.message.fmt(f)
    }
}

/// Its JSON text as shown, spliced without encoding it again: through
/// `serde_json` (the views, a tool's `AGENT_SESSION_JSON`, `read-session`)
/// the message's encoding without the provider's reasoning, which only
/// the store ([`Turn::json`]) and the provider see.
impl Serialize for Turn {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0
            .shown
            .as_ref()
            .unwrap_or(&self.0.json)
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Turn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Turn, D::Error> {
        ChatMessage::deserialize(deserializer).map(Turn::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolCall;

    fn turns() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("be \"brief\"\n\tand kind ✓"),
            ChatMessage::user("read a.txt </script>"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "echo".into(),
                    arguments: r#"{"text":"\u0000"}"#.into(),
                }],
                reasoning: None,
            },
            ChatMessage::tool_result("call_1", "line one\nline two"),
            ChatMessage::assistant("done"),
        ]
    }

    /// Its text is what encoding the message gives, byte for byte, alone
    /// and inside a larger value (as a view splices it).
    #[test]
    fn a_turns_text_is_its_messages_encoding() {
        let messages = turns();
        let shared: Vec<Turn> = messages.iter().cloned().map(Turn::new).collect();
        for (turn, message) in shared.iter().zip(&messages) {
            assert_eq!(turn.json(), serde_json::to_string(message).unwrap());
            assert_eq!(turn, message);
        }
        assert_eq!(
            serde_json::to_string(&serde_json::json!({ "turns": shared })).unwrap(),
            serde_json::to_string(&serde_json::json!({ "turns": messages })).unwrap(),
        );
        assert_eq!(
            serde_json::to_vec(&shared).unwrap(),
            serde_json::to_vec(&messages).unwrap()
        );
    }

    /// A stored text in another spelling (keys reordered, spaces) reads
    /// back as the message, and its text becomes this version's encoding.
    #[test]
    fn a_stored_text_is_read_in_this_versions_spelling() {
        let stored = r#"{ "content": "hi \u00e9", "role": "user" }"#;
        let turn = Turn::from_json(stored).unwrap();
        assert_eq!(turn.message(), &ChatMessage::user("hi é"));
        assert_eq!(turn.json(), r#"{"role":"user","content":"hi é"}"#);
        let back: Turn = serde_json::from_str(turn.json()).unwrap();
        assert_eq!(back, turn);
        assert!(Turn::from_json(r#"{"role": "wizard"}"#).is_err());
    }

    /// The provider's reasoning is in the stored text, never in what is
    /// shown, and reads back from the store.
    #[test]
    fn reasoning_is_stored_and_never_shown() {
        let turn = Turn::new(ChatMessage::Assistant {
            content: Some("answer".into()),
            tool_calls: Vec::new(),
            reasoning: Some(crate::Reasoning {
                provider: "anthropic".into(),
                blocks: vec![serde_json::json!({"type": "thinking", "thinking": "secret plan"})],
                endpoint: None,
            }),
        });
        assert!(turn.json().contains("secret plan"));
        let shown = serde_json::to_string(&[&turn]).unwrap();
        assert_eq!(shown, r#"[{"role":"assistant","content":"answer"}]"#);
        assert_eq!(Turn::from_json(turn.json()).unwrap(), turn);
    }

    /// A copy is the same turn, not a new encoding.
    #[test]
    fn a_copy_shares_its_text() {
        let turn = Turn::new(ChatMessage::user("hello"));
        let copy = turn.clone();
        assert!(std::ptr::eq(turn.json(), copy.json()));
    }
}
