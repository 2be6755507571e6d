//! A Secret's key names from its metadata alone, so that the operator can
//! say which key a parameter misses without reading a value.
//!
//! The API server records, in `metadata.managedFields`, the fields each
//! writer set: every create, update, patch and apply, whichever client made
//! it. A Secret's keys are fields of its `data` (`stringData` is folded into
//! `data` before a create, update or patch is recorded), so the union
//! over the writers' `f:data` entries is the set of its keys: a key removed
//! is removed from every writer's set. Two records do not name them for
//! certain, and then [`secret_key_names`] is `None`: a server-side apply
//! of `stringData` (recorded as applied, as `f:stringData`, a field the
//! Secret never stores: the entry stays when another writer removes the
//! key, and a key the applier stops applying stays in `data` unrecorded),
//! and a record a writer cleared (`managedFields: [{}]`). The operator then
//! checks no key of that Secret and says so in the parameter's status; a
//! key that is missing after all is reported by the kubelet on the pod
//! (`CreateContainerConfigError`).
//!
//! The record is the writers' claim, not the server's: a client may send
//! `managedFields` of its own on a create or update, and the server keeps
//! them. So a name that is no Secret key (`[-._a-zA-Z0-9]+`, 253 bytes at
//! most) makes the whole record unknown rather than reach a status, an
//! Event or `kubectl describe` (control characters, a line break, a
//! megabyte); and a key the record names is "present" only as far as its
//! writers say: the kubelet has the last word.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The keys of the Secret whose metadata is `meta`, from its
/// `managedFields`; `None` when no writer is recorded.
pub fn secret_key_names(meta: &ObjectMeta) -> Option<BTreeSet<String>> {
    let entries = meta.managed_fields.as_deref().unwrap_or_default();
    // A cleared record reads back as no entry at all.
    if !entries.iter().any(|e| e.fields_v1.is_some()) {
        return None;
    }
    let fields = || entries.iter().filter_map(|e| e.fields_v1.as_ref());
    if fields().any(|f| f.0.get("f:stringData").is_some()) {
        return None;
    }
    let data = fields().filter_map(|f| f.0.get("f:data").and_then(|d| d.as_object()));
    // `.` stands for the map itself; `f:NAME` for its entry NAME.
    let names: BTreeSet<String> = data
        .flat_map(|d| d.keys())
        .filter_map(|k| k.strip_prefix("f:"))
        .map(str::to_owned)
        .collect();
    names.iter().all(|n| is_key_name(n)).then_some(names)
}

/// Whether `name` could be a key of a Secret's `data` (the API server's
/// rule for a ConfigMap or Secret key).
fn is_key_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// The metadata a reconcile keeps of a Secret: without its annotations,
/// where a client-side `kubectl apply` leaves the Secret's values
/// (`kubectl.kubernetes.io/last-applied-configuration`), and without the
/// managed fields once their key names are taken.
pub fn without_values(mut meta: ObjectMeta) -> ObjectMeta {
    meta.annotations = None;
    meta.managed_fields = None;
    meta
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    fn entry(fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn the_keys_are_the_union_of_the_writers_data_fields() {
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry(json!({"f:data": {".": {}, "f:token": {}, "f:a.b-c_d": {}}, "f:type": {}})),
                entry(json!({"f:data": {"f:url": {}}})),
                entry(json!({"f:metadata": {"f:labels": {"f:x": {}}}})),
            ]),
            ..Default::default()
        };
        let keys = secret_key_names(&meta).unwrap();
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            ["a.b-c_d", "token", "url"]
        );
    }

    #[test]
    fn no_data_is_no_keys_and_applied_string_data_or_a_cleared_record_unknown_ones() {
        let empty = ObjectMeta {
            managed_fields: Some(vec![entry(json!({"f:type": {}}))]),
            ..Default::default()
        };
        assert_eq!(secret_key_names(&empty), Some(BTreeSet::new()));
        assert_eq!(secret_key_names(&ObjectMeta::default()), None);
        let cleared = ObjectMeta {
            managed_fields: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(secret_key_names(&cleared), None);
        let applied = ObjectMeta {
            managed_fields: Some(vec![
                entry(json!({"f:stringData": {"f:p": {}}})),
                entry(json!({"f:data": {"f:q": {}}})),
            ]),
            ..Default::default()
        };
        assert_eq!(secret_key_names(&applied), None);
    }

    #[test]
    fn a_name_that_is_no_key_makes_the_record_unknown() {
        let long = format!("f:{}", "k".repeat(254));
        for forged in [
            "f:CANARY-\u{1b}[31mRED\u{1b}[0m\nFAKE LINE",
            "f:a b",
            "f:",
            "f:x/y",
            long.as_str(),
        ] {
            let meta = ObjectMeta {
                managed_fields: Some(vec![
                    entry(json!({"f:data": {"f:token": {}}})),
                    entry(json!({"f:data": {forged: {}}})),
                ]),
                ..Default::default()
            };
            assert_eq!(secret_key_names(&meta), None, "{forged:?}");
        }
        // The longest real key is one.
        let longest = format!("f:{}", "k".repeat(253));
        let meta = ObjectMeta {
            managed_fields: Some(vec![entry(json!({"f:data": {longest: {}}}))]),
            ..Default::default()
        };
        assert_eq!(secret_key_names(&meta).map(|k| k.len()), Some(1));
    }

    #[test]
    fn what_is_kept_holds_no_annotation() {
        let meta = ObjectMeta {
            annotations: Some(
                [(
                    "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                    r#"{"data":{"token":"c2VjcmV0"}}"#.to_string(),
                )]
                .into(),
            ),
            managed_fields: Some(vec![entry(json!({"f:data": {"f:token": {}}}))]),
            resource_version: Some("7".into()),
            ..Default::default()
        };
        let kept = without_values(meta);
        assert_eq!(kept.annotations, None);
        assert_eq!(kept.managed_fields, None);
        assert_eq!(kept.resource_version.as_deref(), Some("7"));
    }
}
