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
    /// OpenAI's Responses API: `POST {url}/responses`, stateless (`store:
    /// false`, the whole history each time), reasoning items carried
    /// across turns encrypted, the key as `Authorization: Bearer`.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Google's Gemini API: `POST {url}/models/{name}:generateContent`
    /// (`url` is `https://generativelanguage.googleapis.com/v1beta`), the
    /// key as `x-goog-api-key`; thought signatures carried across turns.
    #[serde(rename = "gemini")]
    Gemini,
    /// Amazon Bedrock's Converse API: `POST {url}/model/{name}/converse`
    /// (`url` is `https://bedrock-runtime.{region}.amazonaws.com`), signed
    /// with SigV4 from the pod's identity (IRSA, EKS Pod Identity) or the
    /// keys in `bedrock`; or a Bedrock API key (`apiKey`) as a bearer token.
    #[serde(rename = "bedrock")]
    Bedrock,
    /// Azure OpenAI: chat completions at
    /// `{url}/openai/deployments/{name}/chat/completions?api-version=…`
    /// (`name` is the deployment), the key as `api-key`, or without one an
    /// Entra ID token from the pod's workload identity.
    #[serde(rename = "azure-openai")]
    AzureOpenAi,
}

/// Every value `provider` takes, for error messages.
pub const PROVIDERS: &str = "openai, openai-responses, anthropic, gemini, bedrock, azure-openai";

impl Provider {
    pub fn is_default(&self) -> bool {
        *self == Provider::default()
    }

    /// Its name as written in an agent file.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::OpenAiResponses => "openai-responses",
            Provider::Gemini => "gemini",
            Provider::Bedrock => "bedrock",
            Provider::AzureOpenAi => "azure-openai",
        }
    }

    /// Every provider, in the order docs list them.
    pub const ALL: [Provider; 6] = [
        Provider::OpenAi,
        Provider::OpenAiResponses,
        Provider::Anthropic,
        Provider::Gemini,
        Provider::Bedrock,
        Provider::AzureOpenAi,
    ];

    /// The provider named `name` (as written in an agent file).
    pub fn parse(name: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether the API takes a thinking budget: Anthropic's extended
    /// thinking (also Claude's on Bedrock), Gemini's `thinkingBudget`.
    pub fn takes_thinking(self) -> bool {
        matches!(
            self,
            Provider::Anthropic | Provider::Gemini | Provider::Bedrock
        )
    }

    /// Whether `flavor` (a dialect of chat completions) applies.
    pub fn speaks_chat_completions(self) -> bool {
        matches!(self, Provider::OpenAi | Provider::AzureOpenAi)
    }

    /// The `max_tokens` sent when the agent names none, where the API
    /// requires one (Anthropic's does).
    pub fn default_max_tokens(self) -> Option<u32> {
        match self {
            Provider::Anthropic => Some(8192),
            _ => None,
        }
    }
}

/// Amazon Bedrock's settings (`provider: bedrock`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BedrockSettings {
    /// The AWS region requests are signed for; read from `url`
    /// (`bedrock-runtime.{region}.amazonaws.com`) when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Static keys (an IAM user's); without them the pod's identity signs:
    /// `AWS_ACCESS_KEY_ID`, IRSA's web identity, or EKS Pod Identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<super::ValueSource>,
    /// The secret of `accessKeyId`; both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<super::ValueSource>,
    /// A session token, with temporary keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<super::ValueSource>,
}

impl BedrockSettings {
    /// The region: `region`, or the one `url`'s host names.
    pub fn region_of(&self, url: &str) -> Option<String> {
        self.region.clone().or_else(|| region_in_url(url))
    }

    /// Its credential sources, for the checks and `env-vars`.
    pub fn sources(&self) -> impl Iterator<Item = &super::ValueSource> {
        [
            &self.access_key_id,
            &self.secret_access_key,
            &self.session_token,
        ]
        .into_iter()
        .flatten()
    }
}

/// The region in a Bedrock runtime URL's host, which is Bedrock's own:
/// `bedrock-runtime[-fips].{region}.amazonaws.com[.cn]`, or a VPC
/// endpoint's `vpce-….bedrock-runtime.{region}.vpce.amazonaws.com`.
/// Any other host (an S3 bucket named `bedrock-runtime`, another
/// service's) names none.
pub fn region_in_url(url: &str) -> Option<String> {
    let rest = url.split("://").nth(1)?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.contains('@') {
        return None;
    }
    let host = authority.split(':').next()?.to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    let runtime = |l: &str| l == "bedrock-runtime" || l == "bedrock-runtime-fips";
    let region = match labels.as_slice() {
        [r, region, "amazonaws", "com"] | [r, region, "amazonaws", "com", "cn"] if runtime(r) => {
            region
        }
        [vpce, "bedrock-runtime", region, "vpce", "amazonaws", "com"]
            if vpce.starts_with("vpce-") =>
        {
            region
        }
        _ => return None,
    };
    is_region(region).then(|| region.to_string())
}

/// An AWS region's shape: `us-east-1`, `eu-central-2`, `us-gov-west-1`,
/// `cn-north-1`, `ap-southeast-3`: letters, then words, then a number.
fn is_region(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts[parts.len() - 1].bytes().all(|b| b.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty()
}

/// Azure OpenAI's settings (`provider: azure-openai`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AzureSettings {
    /// The `api-version` every request names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
}

/// The `api-version` sent when the agent names none: the latest GA
/// version of Azure OpenAI's data-plane inference API.
pub const AZURE_API_VERSION: &str = "2024-10-21";

impl AzureSettings {
    pub fn api_version(&self) -> &str {
        self.api_version.as_deref().unwrap_or(AZURE_API_VERSION)
    }
}

/// Whether an ambient cloud credential (the pod's Entra token, its AWS
/// session) may go to `url`: https on the cloud's own domains, or a
/// loopback address (tests, a local proxy).
pub fn ambient_credential_may_reach(provider: Provider, url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return false;
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    }
    .to_ascii_lowercase();
    if host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    {
        return matches!(scheme, "http" | "https");
    }
    if provider == Provider::Bedrock && region_in_url(url).is_none() {
        // Bedrock's runtime endpoints only, not any host of AWS's domain
        // (EC2's public names are under it too).
        return false;
    }
    let suffixes: &[&str] = match provider {
        Provider::Bedrock => &[".amazonaws.com", ".amazonaws.com.cn"],
        Provider::AzureOpenAi => &[
            ".openai.azure.com",
            ".cognitiveservices.azure.com",
            ".services.ai.azure.com",
        ],
        _ => &[],
    };
    scheme == "https" && suffixes.iter().any(|s| host.ends_with(s))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_reads_back_by_name() {
        for p in Provider::ALL {
            assert_eq!(Provider::parse(p.name()), Some(p));
            let yaml = serde_yaml::to_string(&p).unwrap();
            assert_eq!(serde_yaml::from_str::<Provider>(&yaml).unwrap(), p);
            assert!(PROVIDERS.contains(p.name()));
        }
        assert_eq!(Provider::parse("Anthropic"), None);
    }

    #[test]
    fn the_region_is_read_from_bedrock_urls_only() {
        for (url, region) in [
            (
                "https://bedrock-runtime.us-east-1.amazonaws.com",
                Some("us-east-1"),
            ),
            (
                "https://bedrock-runtime-fips.us-gov-west-1.amazonaws.com/",
                Some("us-gov-west-1"),
            ),
            (
                "https://vpce-0a1b.bedrock-runtime.eu-west-3.vpce.amazonaws.com",
                Some("eu-west-3"),
            ),
            (
                "https://bedrock-runtime.cn-north-1.amazonaws.com.cn",
                Some("cn-north-1"),
            ),
            ("https://bedrock-runtime.us-east-1.evil.example", None),
            // Review 69 (second): hosts of AWS's domain that are not Bedrock's.
            ("https://bedrock-runtime.s3.amazonaws.com", None),
            ("https://bedrock-runtime.s3.us-east-1.amazonaws.com", None),
            (
                "https://bedrock-runtime.s3-website-us-east-1.amazonaws.com",
                None,
            ),
            ("https://bedrock-runtime.evil.amazonaws.com", None),
            ("https://x.bedrock-runtime.us-east-1.amazonaws.com", None),
            ("https://bedrock-runtime.x.vpce.amazonaws.com", None),
            ("https://u@bedrock-runtime.us-east-1.amazonaws.com", None),
            ("https://bedrock.us-east-1.amazonaws.com", None),
            ("http://127.0.0.1:9/v1", None),
            ("not a url", None),
        ] {
            assert_eq!(region_in_url(url).as_deref(), region, "{url}");
        }
    }

    #[test]
    fn an_ambient_credential_reaches_its_cloud_or_loopback_only() {
        use Provider::*;
        for (p, url, ok) in [
            (
                Bedrock,
                "https://bedrock-runtime.us-east-1.amazonaws.com",
                true,
            ),
            (
                Bedrock,
                "http://bedrock-runtime.us-east-1.amazonaws.com",
                false,
            ),
            (
                Bedrock,
                "https://bedrock-runtime.us-east-1.amazonaws.com.evil.io",
                false,
            ),
            (Bedrock, "https://amazonaws.com@evil.io", false),
            // Review 69: a host of AWS's domain that is not Bedrock's.
            (
                Bedrock,
                "https://ec2-1-2-3-4.compute-1.amazonaws.com",
                false,
            ),
            (
                Bedrock,
                "https://vpce-1.bedrock-runtime.eu-west-3.vpce.amazonaws.com",
                true,
            ),
            (Bedrock, "https://x.openai.azure.com", false),
            (AzureOpenAi, "https://res.openai.azure.com", true),
            (
                AzureOpenAi,
                "https://res.cognitiveservices.azure.com/",
                true,
            ),
            (AzureOpenAi, "https://res.openai.azure.com.evil.io", false),
            (AzureOpenAi, "http://127.0.0.1:8080", true),
            (AzureOpenAi, "http://[::1]:8080/x", true),
            (AzureOpenAi, "http://localhost:1", true),
            (AzureOpenAi, "http://10.0.0.1", false),
            (OpenAi, "https://api.openai.com/v1", false),
        ] {
            assert_eq!(ambient_credential_may_reach(p, url), ok, "{p:?} {url}");
        }
    }
}
