//! The end user's values a run's bindings take (`{identity: subject}`,
//! `{identity: "claim:email"}`, `{identity: "token:AUDIENCE [SCOPE…]"}`):
//! put into the run's values under their own names, which no parameter can
//! take, so the bindings merge them like any value and the scrubber knows
//! the exchanged tokens as the secrets they are.

use serde_json::Value;

use bindery_identity::{Exchanger, Person};
use bindery_params::secret::SecretString;
use bindery_params::{ParamValue, Values};
use bindery_spec::IdentityValue;

/// The values of `person` in `wanted` (what the agent binds, found as it
/// loaded: `AgentSpec::identity_values`), for a run of session `session`. One that cannot be had (a claim their token lacks, an
/// exchange refused) is left out, so its binding fails the call as
/// unbound; the log says why, never with a token.
pub async fn values(
    wanted: &std::collections::BTreeSet<IdentityValue>,
    person: &Person,
    exchanger: Option<&Exchanger>,
    session: &str,
) -> Values {
    let mut out = Values::new();
    for want in wanted {
        let value = match want {
            IdentityValue::Subject => {
                Some(ParamValue::Plain(Value::String(person.subject.to_string())))
            }
            IdentityValue::Claim(c) => person.claims.get(c).cloned().map(ParamValue::Plain),
            IdentityValue::Token(t) => match exchange(person, exchanger, t).await {
                Ok(token) => Some(ParamValue::Secret(token)),
                Err(e) => {
                    tracing::warn!(session, subject = person.subject.as_str(), "{e}");
                    None
                }
            },
        };
        if let Some(v) = value {
            out.insert(want.key(), v);
        }
    }
    out
}

async fn exchange(
    person: &Person,
    exchanger: Option<&Exchanger>,
    want: &bindery_spec::TokenExchange,
) -> Result<SecretString, bindery_identity::ExchangeError> {
    let exchanger = exchanger
        .ok_or_else(|| bindery_identity::ExchangeError::NotConfigured(want.audience.clone()))?;
    // An expired token is exchanged no more, nor is what it was exchanged
    // for used: the person's rights end with their token.
    let token = person
        .live_token()
        .ok_or(bindery_identity::ExchangeError::NoToken)?;
    exchanger.exchange(&person.subject, token, want).await
}

/// `values` without the exchanged tokens (`@identity:token:…`): what a
/// run's calls take once the person's own token has expired.
pub fn without_tokens(values: &Values) -> Values {
    let prefix = format!("{}token:", bindery_spec::IDENTITY_PREFIX);
    let mut out = values.clone();
    out.retain(|k, _| !k.starts_with(&prefix));
    out
}
