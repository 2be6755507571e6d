//! One model client per agent, with its API key read once at start.

use std::collections::BTreeMap;
use std::time::Duration;

use bindery_llm::LlmError;
use bindery_llm::{ChatClient, ModelEndpoint};
use bindery_params::SecretString;
use bindery_spec::provider::Provider;
use bindery_tree::{AgentTree, AwsKeysRead, ModelKey};

pub struct ClientOptions {
    pub timeout: Duration,
    pub max_retries: u32,
    /// What one reply may bring back and how long a request may last.
    pub limits: bindery_llm::ReplyLimits,
    /// Every agent's model requests go here instead (`--model-url`).
    pub model: Option<ModelOverride>,
}

/// One OpenAI-compatible server for every agent, in place of each agent
/// file's `spec.model`: a local server, or the mock model of a first run.
pub struct ModelOverride {
    pub url: String,
    /// The model name sent; `None` keeps each agent's `spec.model.name`.
    pub name: Option<String>,
    /// The key for this server. An agent file's `apiKey` is never sent in
    /// its place: it belongs to the agent file's server.
    pub api_key: Option<SecretString>,
}

/// A model client that cannot be made: its URL does not read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--model-url: {0}")]
    ModelUrl(LlmError),
    #[error("{}: agent `{agent}`, model: {source}", file.display())]
    Agent {
        file: std::path::PathBuf,
        agent: String,
        source: LlmError,
    },
}

/// Clients by agent name, and warnings (an API key that could not be read:
/// requests then go without one, which suits local and mock models).
pub fn build_clients(
    tree: &AgentTree,
    opts: &ClientOptions,
) -> Result<(BTreeMap<String, ChatClient>, Vec<String>), ClientError> {
    let mut clients = BTreeMap::new();
    let mut warnings = Vec::new();
    for agent in tree.agents.values() {
        let m = &agent.spec.model;
        let aws = |i: usize| agent.aws_keys.get(i).and_then(Option::as_ref);
        let client = model_client(
            m,
            &agent.model_key,
            aws(0),
            &agent.name,
            opts,
            &mut warnings,
        )
        .map_err(|source| client_error(opts, agent, source))?;
        // `--model-url` stands for every model: no fallbacks past it.
        let mut fallbacks = Vec::new();
        if opts.model.is_none() {
            for (i, f) in m.fallbacks.iter().enumerate() {
                let key = agent.fallback_keys.get(i).unwrap_or(&ModelKey::Absent);
                let who = format!("{} (model fallback {})", agent.name, i + 1);
                fallbacks.push(
                    model_client(&f.as_model(), key, aws(i + 1), &who, opts, &mut warnings)
                        .map_err(|source| client_error(opts, agent, source))?,
                );
            }
        }
        let client = client.with_fallbacks(fallbacks);
        clients.insert(agent.name.clone(), client);
    }
    Ok((clients, warnings))
}

/// The client of model `m` (an agent's, or one of its fallbacks), with
/// `key`; `who` names it in a warning.
fn model_client(
    m: &bindery_spec::ModelSpec,
    key: &ModelKey,
    aws: Option<&AwsKeysRead>,
    who: &str,
    opts: &ClientOptions,
    warnings: &mut Vec<String>,
) -> Result<ChatClient, LlmError> {
    let mut endpoint = match &opts.model {
        Some(o) => {
            let name = o.name.clone().unwrap_or_else(|| m.name.clone());
            let endpoint = ModelEndpoint::new(o.url.clone(), name);
            match &o.api_key {
                Some(k) => endpoint.with_api_key(k.clone()),
                None => endpoint,
            }
        }
        None => ModelEndpoint::new(m.url.clone(), m.name.clone()),
    };
    endpoint.timeout = opts.timeout;
    endpoint.max_retries = opts.max_retries;
    endpoint.limits = opts.limits;
    // Refused at load (spec::checks) when unknown.
    endpoint.flavor = bindery_spec::flavor::Flavor::parse(&m.flavor).unwrap_or_default();
    endpoint.max_tokens = m.max_tokens;
    if opts.model.is_none() {
        // `--model-url` is an OpenAI-compatible server; the agent's
        // own model is spoken to in its provider's API.
        endpoint.provider = m.provider;
        endpoint.thinking_budget = m.thinking.as_ref().map(|t| t.budget_tokens);
        endpoint.api_version = m.azure.as_ref().and_then(|a| a.api_version.clone());
        endpoint.region = m.bedrock.clone().unwrap_or_default().region_of(&m.url);
        if let Some(aws) = aws {
            endpoint.aws_keys = Some(aws_keys(aws)?);
        }
        // Without its key, a cloud provider would sign with the pod's
        // own identity: a key that does not read is an error there.
        let cloud = matches!(m.provider, Provider::Bedrock | Provider::AzureOpenAi);
        match (key, cloud) {
            (ModelKey::NotText, true) => {
                return Err(LlmError::Config(
                    "the model's apiKey is not a string (without it the pod's cloud identity would be used)".to_owned(),
                ))
            }
            (ModelKey::Unreadable(e), true) => {
                return Err(LlmError::Config(format!(
                    "the model's apiKey cannot be read ({e}); without it the pod's cloud identity would be used"
                )))
            }
            _ => {}
        }
        match key {
            ModelKey::Absent => {}
            ModelKey::Key(k) => endpoint = endpoint.with_api_key(k.clone()),
            ModelKey::NotText => warnings.push(format!(
                "agent `{who}`: the model's apiKey must be a string; requests go without a key"
            )),
            ModelKey::Unreadable(e) => warnings.push(format!(
                "agent `{who}`: no API key for the model ({e}); requests go without a key"
            )),
        }
    }
    ChatClient::new(endpoint)
}

/// Bedrock's keys as the client takes them: each must have read as text.
fn aws_keys(read: &AwsKeysRead) -> Result<bindery_llm::AwsKeys, LlmError> {
    let text = |k: &ModelKey, field: &str| -> Result<Option<SecretString>, LlmError> {
        match k {
            ModelKey::Absent => Ok(None),
            ModelKey::Key(v) => Ok(Some(v.clone())),
            ModelKey::NotText => Err(LlmError::Config(format!(
                "the model's bedrock.{field} is not a string"
            ))),
            ModelKey::Unreadable(e) => Err(LlmError::Config(format!(
                "the model's bedrock.{field} cannot be read ({e})"
            ))),
        }
    };
    let id = text(&read.access_key_id, "accessKeyId")?;
    let secret = text(&read.secret_access_key, "secretAccessKey")?;
    match (id, secret) {
        (Some(id), Some(secret)) => Ok(bindery_llm::AwsKeys {
            access_key_id: id.expose().to_owned(),
            secret_access_key: secret,
            session_token: text(&read.session_token, "sessionToken")?,
        }),
        _ => Err(LlmError::Config(
            "the model's bedrock gives accessKeyId without secretAccessKey".to_owned(),
        )),
    }
}

/// `source` as the error of `agent`'s model, or of `--model-url`.
fn client_error(
    opts: &ClientOptions,
    agent: &bindery_tree::LoadedAgent,
    source: LlmError,
) -> ClientError {
    match &opts.model {
        Some(_) => ClientError::ModelUrl(source),
        None => ClientError::Agent {
            file: agent.file.clone(),
            agent: agent.name.clone(),
            source,
        },
    }
}
