//! The secret values live in this process, for the logs' last line of
//! defence: whatever module writes a log record or a span attribute, it is
//! scrubbed of them before it is written or exported (see
//! `cli::telemetry`).
//!
//! A value is live from when it is registered until its [`Registration`]
//! is dropped: the process's own secret values for as long as the process
//! runs, a session's while it holds them in memory ([`LiveValues`]), a
//! run's (message-scope ones among them) while the run goes on.
//!
//! Records are many and registrations few: each change builds the one
//! scrubber of every live value again, and a record only takes a reference
//! to the current one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use super::scrub::Scrubber;
use super::{ParamValue, SecretString, Values};

struct Registry {
    entries: Mutex<BTreeMap<u64, Vec<(String, SecretString)>>>,
    current: RwLock<Arc<Scrubber>>,
    next: AtomicU64,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    entries: Mutex::new(BTreeMap::new()),
    current: RwLock::new(Arc::new(Scrubber::default())),
    next: AtomicU64::new(0),
});

/// Values that stay live until this is dropped.
#[derive(Debug)]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        let mut entries = REGISTRY.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.remove(&self.0).is_some() {
            rebuild(&entries);
        }
    }
}

/// Keep `secrets` (each with the name it is scrubbed to) out of every log
/// record until the registration is dropped; `None` when there are none.
pub fn register(secrets: Vec<(String, SecretString)>) -> Option<Registration> {
    if secrets.is_empty() {
        return None;
    }
    let key = REGISTRY.next.fetch_add(1, Ordering::Relaxed);
    let mut entries = REGISTRY.entries.lock().unwrap_or_else(|p| p.into_inner());
    entries.insert(key, secrets);
    rebuild(&entries);
    Some(Registration(key))
}

/// [`register`] the secret values among `values`, named by parameter.
pub fn register_values(values: &Values) -> Option<Registration> {
    register(
        values
            .iter()
            .filter_map(|(k, v)| match v {
                ParamValue::Secret(s) => Some((k.clone(), s.clone())),
                ParamValue::Plain(_) => None,
            })
            .collect(),
    )
}

/// What scrubs every live value now.
pub fn scrubber() -> Arc<Scrubber> {
    REGISTRY
        .current
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Called with the entries locked, so builds happen in the order of the
/// changes and the last one wins.
fn rebuild(entries: &BTreeMap<u64, Vec<(String, SecretString)>>) {
    let mut s = Scrubber::default();
    for (name, secret) in entries.values().flatten() {
        s.add(name, secret);
    }
    *REGISTRY.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(s);
}

/// A session's secret values as it holds them in memory, live while it
/// does: setting them registers them, clearing or dropping them does not
/// leave them registered. Reads see the [`Values`].
#[derive(Debug, Default)]
pub struct LiveValues {
    values: Values,
    registration: Option<Registration>,
}

impl LiveValues {
    pub fn set(&mut self, values: Values) {
        // The new values are registered before the old ones are let go.
        self.registration = register_values(&values);
        self.values = values;
    }

    pub fn clear(&mut self) {
        self.values.clear();
        self.registration = None;
    }
}

impl std::ops::Deref for LiveValues {
    type Target = Values;
    fn deref(&self) -> &Values {
        &self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(v: &str) -> Values {
        [("key".to_string(), ParamValue::Secret(SecretString::new(v)))].into()
    }

    // One test: the registry is the process's.
    #[test]
    fn values_are_live_while_registered() {
        let line = "a=live-one-4f2a b=live-two-9c1e";
        let one = register(vec![("one".into(), SecretString::new("live-one-4f2a"))]);
        assert_eq!(scrubber().scrub(line), "a=<secret:one> b=live-two-9c1e");
        let mut held = LiveValues::default();
        held.set(values("live-two-9c1e"));
        assert_eq!(held.len(), 1);
        assert_eq!(scrubber().scrub(line), "a=<secret:one> b=<secret:key>");
        drop(one);
        assert_eq!(scrubber().scrub(line), "a=live-one-4f2a b=<secret:key>");
        held.clear();
        assert!(held.is_empty());
        assert_eq!(scrubber().scrub(line), line);
        held.set(values("live-two-9c1e"));
        drop(held);
        assert_eq!(scrubber().scrub(line), line);
        assert!(register(Vec::new()).is_none());
    }
}
