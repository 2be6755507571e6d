//! The end user's values a run's bindings take (`{identity: subject}`,
//! `{identity: "claim:email"}`, `{identity: "token:AUDIENCE [SCOPE…]"}`):
//! put into the run's values under their own names, which no parameter can
//! take, so the bindings merge them like any value and the scrubber knows
//! the exchanged tokens as the secrets they are.

use std::collections::BTreeSet;

use serde_json::Value;

use bindery_identity::{Exchanger, Person};
use bindery_params::secret::SecretString;
use bindery_params::{ParamValue, Values};
use bindery_spec::{AgentSpec, IdentityValue};

/// Every end user's value `spec` binds: in bindings, credentials of HTTP
/// toolboxes and helpers' `with` (a literal is the author's text, never
/// read as one).
pub fn wanted(spec: &AgentSpec) -> BTreeSet<IdentityValue> {
    let mut out = BTreeSet::new();
    if let Ok(v) = serde_json::to_value(spec) {
        walk(&v, &mut out);
    }
    out
}

fn walk(v: &Value, out: &mut BTreeSet<IdentityValue>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match k.as_str() {
                    "literal" => {}
                    "identity" => {
                        if let Ok(i) = serde_json::from_value::<IdentityValue>(v.clone()) {
                            out.insert(i);
                        }
                    }
                    _ => walk(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
        _ => {}
    }
}

/// The values of `person` that `spec` binds, for a run of session
/// `session`. One that cannot be had (a claim their token lacks, an
/// exchange refused) is left out, so its binding fails the call as
/// unbound; the log says why, never with a token.
pub async fn values(
    spec: &AgentSpec,
    person: &Person,
    exchanger: Option<&Exchanger>,
    session: &str,
) -> Values {
    let mut out = Values::new();
    for want in wanted(spec) {
        let value = match &want {
            IdentityValue::Subject => {
                Some(ParamValue::Plain(Value::String(person.subject.to_string())))
            }
            IdentityValue::Claim(c) => person.claims.get(c).cloned().map(ParamValue::Plain),
            IdentityValue::Token(t) => match exchange(person, exchanger, t).await {
                Ok(token) => Some(ParamValue::Secret(token)),
                Err(e) => {
                    tracing::warn!(session, subject = %person.subject, "{e}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_wanted_are_found_wherever_the_author_binds_them_and_never_in_a_literal() {
        let yaml: Value = serde_yaml::from_str(
            r#"
model: {url: "http://m.invalid/v1", name: m}
toolboxes:
  - openapi:
      spec: api.yaml
      baseUrl: https://billing.example.com
      secrets:
        - source: {identity: "token:billing invoices.read"}
          header: {name: Authorization, template: "Bearer {{secret}}"}
      bindings:
        - {arg: user, value: {identity: subject}}
        - {arg: email, value: {identity: "claim:email"}}
        - {arg: note, value: {literal: {identity: subject_not_this}}}
"#,
        )
        .unwrap();
        let spec: AgentSpec = serde_json::from_value(yaml).unwrap();
        let keys: Vec<String> = wanted(&spec).iter().map(|i| i.key()).collect();
        assert_eq!(
            keys,
            [
                "@identity:subject",
                "@identity:claim:email",
                "@identity:token:billing invoices.read"
            ]
        );
    }
}
