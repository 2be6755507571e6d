//! The price table Bindery ships (`prices/table.yaml`): what the common
//! models cost per million tokens, from the providers' own price pages, so
//! that usage reports and `cost` budgets are right without each agent
//! writing its prices. An agent's `pricing` wins over it, and a tenant's
//! (`AgentTenant.spec.pricing`) over both.

use std::sync::LazyLock;

use serde::Deserialize;

use crate::budget::Pricing;
use crate::provider::Provider;
use crate::ModelSpec;

/// The table's text, as shipped.
const TABLE: &str = include_str!("prices/table.yaml");

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Table {
    checked: String,
    #[allow(dead_code)] // documentation for readers of the file
    sources: std::collections::BTreeMap<String, String>,
    models: Vec<Row>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Row {
    provider: Provider,
    model: String,
    input: f64,
    output: f64,
    #[serde(default)]
    cache_read: Option<f64>,
    #[serde(default)]
    cache_write: Option<f64>,
    #[serde(default)]
    reasoning: Option<f64>,
}

static SHIPPED: LazyLock<Table> = LazyLock::new(|| {
    // Checked by this module's tests: a table that does not read is a
    // build of Bindery that never passed them.
    serde_yaml::from_str(TABLE).expect("prices/table.yaml reads")
});

/// The day the shipped prices were taken from the providers' pages.
pub fn checked() -> &'static str {
    &SHIPPED.checked
}

/// Where a model's price comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Its own `pricing` (an agent's, or a tenant's written into it).
    Given,
    /// Bindery's table, of [`checked`]'s date.
    Shipped,
}

impl ModelSpec {
    /// What the model costs: its `pricing`, else the shipped table's row
    /// for its provider and name, else nothing (its cost is not counted).
    pub fn price(&self) -> Option<(Pricing, Origin)> {
        match &self.pricing {
            Some(p) => Some((p.clone(), Origin::Given)),
            None => shipped(self.provider, &self.name).map(|p| (p, Origin::Shipped)),
        }
    }
}

/// A tenant's price of one model (`AgentTenant.spec.pricing`): it wins
/// over the agent's `pricing` and the shipped table, for that model and
/// any fallback of that name, in every agent of the tenant.
#[derive(serde::Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelPrice {
    /// The model's `name`, as the agent's model or fallback writes it.
    #[schemars(length(min = 1, max = 256))]
    pub model: String,
    pub price: Pricing,
}

/// `model` and its fallbacks with the tenant's `prices` over their own.
pub fn apply(model: &mut ModelSpec, prices: &[ModelPrice]) {
    let find = |name: &str| {
        prices
            .iter()
            .find(|p| p.model == name)
            .map(|p| p.price.clone())
    };
    if let Some(p) = find(&model.name) {
        model.pricing = Some(p);
    }
    for f in &mut model.fallbacks {
        if let Some(p) = find(&f.name) {
            f.pricing = Some(p);
        }
    }
}

/// The shipped price of `model` spoken through `provider`: the row whose
/// id is the model's, or its stem before a date or version suffix
/// (`claude-opus-4-5-20251101`, `gpt-4o-2024-08-06`,
/// `anthropic.claude-…-v1:0`); Bedrock's cross-region prefixes (`us.`,
/// `eu.`, `global.`, …) are not part of the id. OpenAI's rows serve the
/// Responses API and Azure deployments named as the model, too.
pub fn shipped(provider: Provider, model: &str) -> Option<Pricing> {
    let table_provider = match provider {
        Provider::OpenAiResponses | Provider::AzureOpenAi => Provider::OpenAi,
        p => p,
    };
    let model = match provider {
        Provider::Bedrock => without_geo_prefix(model),
        _ => model,
    };
    SHIPPED
        .models
        .iter()
        .filter(|r| r.provider == table_provider && names(&r.model, model))
        .max_by_key(|r| r.model.len())
        .map(|r| Pricing {
            input_per_million: r.input,
            output_per_million: r.output,
            cache_read_per_million: r.cache_read,
            cache_write_per_million: r.cache_write,
            reasoning_per_million: r.reasoning,
            currency: "USD".into(),
        })
}

/// Bedrock's inference-profile prefixes.
const GEO_PREFIXES: [&str; 7] = ["us.", "eu.", "apac.", "global.", "us-gov.", "jp.", "au."];

fn without_geo_prefix(model: &str) -> &str {
    GEO_PREFIXES
        .iter()
        .find_map(|p| model.strip_prefix(p))
        .unwrap_or(model)
}

/// Whether `id` is the row id `stem`, or `stem` followed only by a date
/// (`-20251101`, `-2024-08-06`, `@20251101`) or `-latest`, then only a
/// version (`-v1:0`, `-v2`, `:0`). Anything else is another model
/// (`claude-sonnet-4` is not `claude-sonnet-4-5`).
fn names(stem: &str, id: &str) -> bool {
    let Some(rest) = id.strip_prefix(stem) else {
        return false;
    };
    let rest = strip_date(rest);
    let rest = rest
        .strip_prefix("-v")
        .map_or(rest, |v| v.trim_start_matches(|c: char| c.is_ascii_digit()));
    rest.is_empty()
        || rest
            .strip_prefix(':')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

fn strip_date(rest: &str) -> &str {
    let digits = |s: &str, n: usize| s.len() >= n && s[..n].chars().all(|c| c.is_ascii_digit());
    if let Some(tail) = rest.strip_prefix("-latest") {
        return tail;
    }
    for sep in ["-", "@"] {
        if let Some(tail) = rest.strip_prefix(sep) {
            if digits(tail, 8) {
                return &tail[8..];
            }
            let b = tail.as_bytes();
            if tail.len() >= 10
                && digits(tail, 4)
                && b[4] == b'-'
                && digits(&tail[5..], 2)
                && b[7] == b'-'
                && digits(&tail[8..], 2)
            {
                return &tail[10..];
            }
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_and_every_price_is_a_price() {
        assert!(!SHIPPED.models.is_empty());
        assert_eq!(checked().len(), 10, "{}", checked());
        for r in &SHIPPED.models {
            let prices = [
                Some(r.input),
                Some(r.output),
                r.cache_read,
                r.cache_write,
                r.reasoning,
            ];
            assert!(
                prices
                    .into_iter()
                    .flatten()
                    .all(|p| p.is_finite() && p >= 0.0),
                "{}",
                r.model
            );
            assert_eq!(
                shipped(r.provider, &r.model).map(|p| p.input_per_million),
                Some(r.input),
                "{}",
                r.model
            );
        }
        let mut ids: Vec<_> = SHIPPED
            .models
            .iter()
            .map(|r| (r.provider.name(), r.model.as_str()))
            .collect();
        ids.sort();
        let before = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), before, "a model is in the table twice");
    }

    #[test]
    fn a_model_is_named_by_its_stem_with_a_date_or_version_only() {
        for (stem, id, yes) in [
            ("claude-opus-4-5", "claude-opus-4-5", true),
            ("claude-opus-4-5", "claude-opus-4-5-20251101", true),
            ("gpt-4o", "gpt-4o-2024-08-06", true),
            ("claude-sonnet-4-5", "claude-sonnet-4-5@20250929", true),
            (
                "anthropic.claude-sonnet-4-5",
                "anthropic.claude-sonnet-4-5-20250929-v1:0",
                true,
            ),
            ("claude-3-5-haiku", "claude-3-5-haiku-latest", true),
            ("gpt-4o", "gpt-4o-mini", false),
            ("claude-sonnet-4", "claude-sonnet-4-5", false),
            ("claude-sonnet-4", "claude-sonnet-4-5-20250929", false),
            ("gpt-5", "gpt-5.1", false),
            ("gemini-2.5-flash", "gemini-2.5-flash-lite", false),
            ("m", "m-2025", false),
            ("m", "m-v1:", false),
            ("m", "n", false),
        ] {
            assert_eq!(names(stem, id), yes, "{stem} / {id}");
        }
        assert_eq!(
            without_geo_prefix("us.anthropic.claude"),
            "anthropic.claude"
        );
        assert_eq!(without_geo_prefix("anthropic.claude"), "anthropic.claude");
    }

    #[test]
    fn a_tenants_price_wins_for_the_model_and_fallbacks_of_its_name() {
        let mut model: ModelSpec = serde_yaml::from_str(
            "{url: 'http://m', name: big, pricing: {inputPerMillion: 3, outputPerMillion: 15}, fallbacks: [{url: 'http://f', name: small}, {url: 'http://g', name: other}]}",
        )
        .unwrap();
        let price = |x: f64| Pricing {
            input_per_million: x,
            output_per_million: x,
            cache_read_per_million: None,
            cache_write_per_million: None,
            reasoning_per_million: None,
            currency: "USD".into(),
        };
        let prices = [
            ModelPrice {
                model: "big".into(),
                price: price(1.0),
            },
            ModelPrice {
                model: "small".into(),
                price: price(0.5),
            },
        ];
        apply(&mut model, &prices);
        assert_eq!(model.pricing, Some(price(1.0)));
        assert_eq!(model.fallbacks[0].pricing, Some(price(0.5)));
        assert_eq!(model.fallbacks[1].pricing, None);
    }

    #[test]
    fn a_given_price_wins_and_an_unknown_model_has_none() {
        let model = |name: &str, pricing: Option<Pricing>| ModelSpec {
            provider: Provider::Anthropic,
            flavor: "openai".into(),
            url: "https://api.anthropic.com/v1".into(),
            name: name.into(),
            api_key: None,
            pricing,
            max_tokens: None,
            thinking: None,
            bedrock: None,
            azure: None,
            fallbacks: Vec::new(),
        };
        let row = &SHIPPED
            .models
            .iter()
            .find(|r| r.provider == Provider::Anthropic)
            .expect("an Anthropic row")
            .model;
        let (p, origin) = model(&format!("{row}-20990101"), None)
            .price()
            .expect("shipped");
        assert_eq!(origin, Origin::Shipped);
        assert_eq!(p.currency, "USD");
        let own = Pricing {
            input_per_million: 1.0,
            output_per_million: 2.0,
            cache_read_per_million: None,
            cache_write_per_million: None,
            reasoning_per_million: None,
            currency: "EUR".into(),
        };
        assert_eq!(
            model(row, Some(own.clone())).price(),
            Some((own, Origin::Given))
        );
        assert_eq!(model("my-finetune", None).price(), None);
        // The same name through another provider is not that row.
        assert_eq!(shipped(Provider::Gemini, row), None);
    }
}
