//! Which API a model is spoken to in: `spec.model.provider`.
//!
//! Each is a client of its own in the sidecar (`bindery-llm`); what one
//! does not take (extended thinking where the API has none) is refused at
//! load, never dropped.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model API Bindery speaks natively.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI's chat completions, and every server that speaks them
    /// (vLLM, Ollama, LiteLLM, Mistral, Moonshot): `POST {url}/chat/completions`,
    /// the key as `Authorization: Bearer`. `flavor` picks the dialect.
    #[default]
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic's Messages API: `POST {url}/messages` (`url` is
    /// `https://api.anthropic.com/v1`), the key as `x-api-key`; tool use
    /// blocks, extended thinking carried across turns with its
    /// signatures, prompt caching of the system prompt and the tools.
    #[serde(rename = "anthropic")]
    Anthropic,
}

/// Every value `provider` takes, for error messages.
pub const PROVIDERS: &str = "openai, anthropic";

impl Provider {
    pub fn is_default(&self) -> bool {
        *self == Provider::default()
    }

    /// Its name as written in an agent file.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }

    /// The `max_tokens` sent when the agent names none, where the API
    /// requires one (Anthropic's does).
    pub fn default_max_tokens(self) -> Option<u32> {
        match self {
            Provider::OpenAi => None,
            Provider::Anthropic => Some(8192),
        }
    }
}

/// Extended thinking: the model reasons before it answers, within a budget.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Thinking {
    /// The most tokens the model may think in, per reply; less than the
    /// reply's `maxTokens`. Anthropic's least is 1024.
    #[schemars(range(min = 1024))]
    pub budget_tokens: u32,
}

/// The least thinking budget Anthropic takes.
pub const MIN_THINKING_BUDGET: u32 = 1024;
