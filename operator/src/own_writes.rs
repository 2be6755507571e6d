//! What the operator itself last wrote, object by object: the
//! resourceVersion and generation the API server answered and a digest of
//! what was applied. Watch events that carry our own resourceVersion are
//! our writes coming back and trigger no reconcile; an apply whose digest
//! is unchanged since our last write, with nobody else's change of the
//! object seen in between, is not sent again. A change that keeps the
//! generation of a kind that has one (a controller writing the status)
//! reconciles the tenant but leaves what we applied standing. Anything
//! unknown (another writer, a restart, a lost record) counts as a change:
//! the worst case is a write too many, never one too few. So the record
//! of a kind lasts only while its watch sees: a watch that fails (and
//! again when it has listed anew) forgets its kind whole, for it could
//! not tell of anyone else's change or deletion meanwhile.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// An object: its kind, namespace and name.
pub(crate) type Key = (String, String, String);

#[derive(Debug)]
struct Written {
    resource_version: String,
    /// Its generation then, for kinds that have one: a change that keeps it
    /// (a controller writing the status) leaves what we applied alone.
    generation: Option<i64>,
    /// What we applied, if it was an apply.
    digest: Option<u64>,
    /// Someone else changed (or deleted) it since.
    changed: bool,
}

#[derive(Debug, Default)]
pub(crate) struct OwnWrites {
    written: Mutex<HashMap<Key, Written>>,
}

/// A digest of what an apply sends.
pub(crate) fn digest(body: &impl serde::Serialize) -> u64 {
    let mut h = DefaultHasher::new();
    serde_json::to_vec(body).unwrap_or_default().hash(&mut h);
    h.finish()
}

impl OwnWrites {
    /// Our write of `key` left it at `meta`'s resourceVersion and
    /// generation; `digest` if it was an apply.
    pub(crate) fn wrote(&self, key: Key, meta: &ObjectMeta, digest: Option<u64>) {
        let mut written = self.written.lock().unwrap();
        match meta.resource_version.clone() {
            Some(resource_version) => {
                written.insert(
                    key,
                    Written {
                        resource_version,
                        generation: meta.generation,
                        digest,
                        changed: false,
                    },
                );
            }
            None => {
                written.remove(&key);
            }
        }
    }

    /// A watch event showed `key` as `meta`: whether it is someone else's
    /// change (ours come back with the resourceVersion we recorded).
    pub(crate) fn is_foreign(&self, key: &Key, meta: &ObjectMeta) -> bool {
        let mut written = self.written.lock().unwrap();
        match written.get_mut(key) {
            Some(w) if meta.resource_version.as_ref() == Some(&w.resource_version) => false,
            Some(w) => {
                w.changed |= w.generation.is_none() || meta.generation != w.generation;
                true
            }
            None => true,
        }
    }

    /// Whether `meta` is the object as our last write of `key` left it.
    pub(crate) fn is_ours(&self, key: &Key, meta: &ObjectMeta) -> bool {
        let written = self.written.lock().unwrap();
        written.get(key).map(|w| Some(&w.resource_version)) == Some(meta.resource_version.as_ref())
    }

    /// The object `key` is gone (deleted by anyone): the next apply goes
    /// out whatever we last sent.
    pub(crate) fn forget(&self, key: &Key) {
        self.written.lock().unwrap().remove(key);
    }

    /// Forget every object of `kind`: its watch failed, and whatever it
    /// did not tell meanwhile (a deletion, a change) must not be taken for
    /// our last write still standing.
    pub(crate) fn forget_kind(&self, kind: &str) {
        self.written
            .lock()
            .unwrap()
            .retain(|(k, _, _), _| k != kind);
    }

    /// Whether applying `digest` to `key` would send what we last applied
    /// there, with no change by anyone else seen since.
    pub(crate) fn unchanged(&self, key: &Key, digest: u64) -> bool {
        self.written
            .lock()
            .unwrap()
            .get(key)
            .is_some_and(|w| w.digest == Some(digest) && !w.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("Deployment".into(), "shop".into(), name.into())
    }

    fn meta(resource_version: &str, generation: Option<i64>) -> ObjectMeta {
        ObjectMeta {
            resource_version: Some(resource_version.into()),
            generation,
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn our_own_write_coming_back_is_not_foreign_and_needs_no_apply() {
        let own = OwnWrites::default();
        own.wrote(key("a"), &meta("7", None), Some(1));
        assert!(!own.is_foreign(&key("a"), &meta("7", None)));
        assert!(own.is_ours(&key("a"), &meta("7", None)));
        assert!(!own.is_ours(&key("a"), &meta("6", None)));
        assert!(!own.is_ours(&key("b"), &meta("7", None)));
        assert!(own.unchanged(&key("a"), 1));
        assert!(!own.unchanged(&key("a"), 2), "a new digest is applied");
    }

    #[test]
    fn a_deleted_object_is_applied_again_even_unchanged() {
        let own = OwnWrites::default();
        own.wrote(key("a"), &meta("7", Some(1)), Some(1));
        // A deletion's last state keeps the generation we wrote.
        assert!(own.is_foreign(&key("a"), &meta("8", Some(1))));
        assert!(own.unchanged(&key("a"), 1), "not enough to tell a delete");
        own.forget(&key("a"));
        assert!(!own.unchanged(&key("a"), 1));
        assert!(own.is_foreign(&key("a"), &meta("7", Some(1))));
    }

    #[test]
    fn anyone_elses_change_is_foreign_and_makes_the_next_apply_go_out() {
        let own = OwnWrites::default();
        own.wrote(key("a"), &meta("7", None), Some(1));
        assert!(own.is_foreign(&key("a"), &meta("9", None)));
        assert!(!own.unchanged(&key("a"), 1));
        assert!(
            own.is_foreign(&key("b"), &meta("3", None)),
            "never written by us"
        );
        assert!(!own.unchanged(&key("b"), 1));
        own.wrote(key("a"), &ObjectMeta::default(), Some(1));
        assert!(!own.unchanged(&key("a"), 1), "no answer, no record");
    }

    #[test]
    fn a_kind_whose_watch_failed_is_forgotten_whole() {
        let own = OwnWrites::default();
        own.wrote(key("a"), &meta("7", Some(1)), Some(1));
        own.wrote(key("b"), &meta("8", Some(1)), Some(2));
        let service = ("Service".to_string(), "shop".to_string(), "a".to_string());
        own.wrote(service.clone(), &meta("9", None), Some(3));
        own.forget_kind("Deployment");
        assert!(!own.unchanged(&key("a"), 1));
        assert!(!own.unchanged(&key("b"), 2));
        assert!(!own.is_ours(&key("a"), &meta("7", Some(1))));
        assert!(own.unchanged(&service, 3), "another kind stays");
    }

    #[test]
    fn a_status_write_by_another_controller_reconciles_but_keeps_the_apply() {
        let own = OwnWrites::default();
        own.wrote(key("a"), &meta("7", Some(2)), Some(1));
        assert!(own.is_foreign(&key("a"), &meta("8", Some(2))));
        assert!(
            own.unchanged(&key("a"), 1),
            "same generation: our spec stands"
        );
        assert!(own.is_foreign(&key("a"), &meta("9", Some(3))));
        assert!(!own.unchanged(&key("a"), 1), "someone changed the spec");
    }
}
