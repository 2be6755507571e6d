//! A model's `flavor`: which dialect of the OpenAI chat API the agent
//! speaks. Each adds to every request what agents-exe's flavour of the
//! same name sends; one Bindery does not know is refused, never taken for
//! another.

/// A known flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Flavor {
    /// OpenAI's chat completions as they are (agents-exe's `OpenAIv1`).
    #[default]
    OpenAi,
    /// Moonshot's Kimi (`KimiV1`): nothing added.
    Kimi,
    /// Mistral (`MistralV1`): `tool_choice: auto`, `parallel_tool_calls: true`.
    Mistral,
    /// Claude through an OpenAI-compatible API (`ClaudeV1`): extended
    /// thinking with a budget of 10000 tokens.
    Claude,
}

/// Every spelling read, Bindery's and agents-exe's.
pub const FLAVORS: &str =
    "openai, kimi, mistral, claude (agents-exe's OpenAIv1, KimiV1, MistralV1, ClaudeV1)";

impl Flavor {
    pub fn parse(s: &str) -> Option<Flavor> {
        Some(match s {
            "openai" | "OpenAIv1" | "openai-v1" => Flavor::OpenAi,
            "kimi" | "KimiV1" | "kimiv1" => Flavor::Kimi,
            "mistral" | "MistralV1" | "mistral-v1" => Flavor::Mistral,
            "claude" | "ClaudeV1" | "claude-v1" => Flavor::Claude,
            _ => return None,
        })
    }

    /// The thinking budget the flavour asks for, if any.
    pub fn thinking_budget(self) -> Option<u32> {
        match self {
            Flavor::Claude => Some(10000),
            _ => None,
        }
    }

    /// What the flavour adds to a request body's top-level object, as JSON
    /// text to append after its last member (empty: nothing).
    pub fn request_fields(self) -> &'static str {
        match self {
            Flavor::OpenAi | Flavor::Kimi => "",
            Flavor::Mistral => r#","tool_choice":"auto","parallel_tool_calls":true"#,
            Flavor::Claude => r#","thinking":{"type":"enabled","budget_tokens":10000}"#,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_reads_and_adds_valid_json() {
        for (s, f) in [
            ("openai", Flavor::OpenAi),
            ("OpenAIv1", Flavor::OpenAi),
            ("KimiV1", Flavor::Kimi),
            ("mistral-v1", Flavor::Mistral),
            ("ClaudeV1", Flavor::Claude),
        ] {
            assert_eq!(Flavor::parse(s), Some(f), "{s}");
            let body = format!(r#"{{"model":"m"{}}}"#, f.request_fields());
            serde_json::from_str::<serde_json::Value>(&body).unwrap();
        }
        for s in ["Bogus", "OpenAI", "gpt", ""] {
            assert_eq!(Flavor::parse(s), None, "{s}");
        }
    }
}
