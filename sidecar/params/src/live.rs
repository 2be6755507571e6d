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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use super::scrub::{Prepared, Scrubber};
use super::{ParamValue, SecretString, Values};

/// Every live value, and what readers scrub with.
///
/// Thousands of sessions may each hold a value, and each run registers its
/// own: building one scrubber of them all at every change would cost the
/// square of their number. So a change builds only `recent` (what was
/// registered since `base` was built), and `base` is built again from
/// every entry once `recent` has grown, or enough of `base`'s values have
/// gone, past the square root of their number. Until then a value that
/// went stays in `base`: scrubbed a little longer, never less.
struct Registry {
    state: Mutex<State>,
    current: RwLock<Live>,
    next: AtomicU64,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<u64, Vec<Prepared>>,
    /// Each entry's values folded (see [`super::scrub::fold`]), long
    /// enough to be told in a name.
    folded: BTreeMap<u64, Vec<SecretString>>,
    /// Entries registered since `base` was built.
    recent: Vec<u64>,
    /// Values of `base` unregistered since it was built.
    gone: usize,
}

/// What scrubs every live value: a record passes both scrubbers.
#[derive(Clone, Default)]
pub struct Live {
    base: Arc<Scrubber>,
    recent: Arc<Scrubber>,
}

impl Live {
    pub fn is_empty(&self) -> bool {
        self.base.is_empty() && self.recent.is_empty()
    }

    /// `text` with every live value replaced by its marker.
    pub fn scrub(&self, text: &str) -> String {
        let once = self.base.scrub(text);
        if self.recent.is_empty() {
            return once;
        }
        self.recent.scrub(&once)
    }
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    state: Mutex::new(State::default()),
    current: RwLock::new(Live::default()),
    next: AtomicU64::new(0),
});

/// Below this many live values, `base` is built again at every change.
const SMALL: usize = 256;

/// Values that stay live until this is dropped.
#[derive(Debug)]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = REGISTRY.state.lock().unwrap_or_else(|p| p.into_inner());
        state.folded.remove(&self.0);
        let Some(gone) = state.entries.remove(&self.0) else {
            return;
        };
        if let Some(at) = state.recent.iter().position(|k| *k == self.0) {
            state.recent.swap_remove(at);
        } else {
            state.gone += gone.len();
        }
        publish(&mut state);
    }
}

/// The server's own credentials (its tokens, model keys, the store's
/// password): besides the logs, every tool result and error text a run
/// makes is scrubbed of them ([`own`]), and no tool process is given one.
static OWN: RwLock<Vec<(String, SecretString)>> = RwLock::new(Vec::new());

/// Register the server's own credentials: live for as long as the
/// registration is kept, and among [`own`] for the process's life.
pub fn register_own(secrets: Vec<(String, SecretString)>) -> Option<Registration> {
    OWN.write()
        .unwrap_or_else(|p| p.into_inner())
        .extend(secrets.iter().cloned());
    register(secrets)
}

/// The server's private files, canonical: those it read credentials from
/// (`--api-keys`, a value's `{file}`, its token files) and its SQLite
/// store. `attach-file` never reads one, whatever its sandbox allows.
/// Only ever grows, and only by files the server itself names.
static PRIVATE_FILES: RwLock<BTreeSet<PathBuf>> = RwLock::new(BTreeSet::new());

/// The same files by identity (device, inode), where they exist when
/// named: another name of one (a hard link) is the same file.
static PRIVATE_IDS: RwLock<BTreeSet<(u64, u64)>> = RwLock::new(BTreeSet::new());

/// Note `path` as one of the server's private files (one not there yet is
/// named by its canonical directory).
pub fn private_file(path: &Path) {
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        PRIVATE_IDS
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((meta.dev(), meta.ino()));
    }
    let canonical = std::fs::canonicalize(path).ok().or_else(|| {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(dir).ok()?.join(path.file_name()?))
    });
    if let Some(p) = canonical {
        PRIVATE_FILES
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(p);
    }
}

/// Whether the file of `meta` is one of the server's private files,
/// under whatever name.
pub fn is_private_id(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    PRIVATE_IDS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&(meta.dev(), meta.ino()))
}

/// Whether `canonical` is one of the server's private files.
pub fn is_private_file(canonical: &Path) -> bool {
    PRIVATE_FILES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .contains(canonical)
}

/// The server's own credentials registered so far.
pub fn own() -> Vec<(String, SecretString)> {
    OWN.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Keep `secrets` (each with the name it is scrubbed to) out of every log
/// record until the registration is dropped; `None` when there are none.
pub fn register(secrets: Vec<(String, SecretString)>) -> Option<Registration> {
    let prepared: Vec<Prepared> = secrets
        .iter()
        .flat_map(|(name, secret)| Prepared::all(name, secret))
        .collect();
    if prepared.is_empty() {
        return None;
    }
    let folded = secrets
        .iter()
        .filter_map(|(_, secret)| super::scrub::folded(secret))
        .collect();
    let key = REGISTRY.next.fetch_add(1, Ordering::Relaxed);
    let mut state = REGISTRY.state.lock().unwrap_or_else(|p| p.into_inner());
    state.entries.insert(key, prepared);
    state.folded.insert(key, folded);
    state.recent.push(key);
    publish(&mut state);
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

/// Whether `name` (or any text) holds a live value folded (see
/// [`super::scrub::fold`]): what a name made of a value would hold, where
/// the scrubber, which knows a value's encodings and not its spellings,
/// finds nothing.
pub fn holds_folded(name: &str) -> bool {
    let name = super::scrub::fold(name);
    let state = REGISTRY.state.lock().unwrap_or_else(|p| p.into_inner());
    state
        .folded
        .values()
        .flatten()
        .any(|f| name.contains(f.expose()))
}

/// What scrubs every live value now.
pub fn scrubber() -> Live {
    REGISTRY
        .current
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Build what changed and make it what readers get. Called with the state
/// locked, so builds happen in the order of the changes and the last wins.
fn publish(state: &mut State) {
    let total: usize = state.entries.values().map(Vec::len).sum();
    let recent_len: usize = state
        .recent
        .iter()
        .filter_map(|k| state.entries.get(k))
        .map(Vec::len)
        .sum();
    let bound = if total < SMALL { 0 } else { total.isqrt() };
    let mut current = REGISTRY.current.write().unwrap_or_else(|p| p.into_inner());
    if recent_len > bound || state.gone > bound {
        let mut base = Scrubber::default();
        for p in state.entries.values().flatten() {
            base.add_prepared(p);
        }
        state.recent.clear();
        state.gone = 0;
        current.base = Arc::new(base);
        current.recent = Arc::default();
    } else {
        let mut recent = Scrubber::default();
        for p in state
            .recent
            .iter()
            .filter_map(|k| state.entries.get(k))
            .flatten()
        {
            recent.add_prepared(p);
        }
        current.recent = Arc::new(recent);
    }
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

    // One test: the registry is the process's, and its tests would see
    // each other's values.
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

        // Past a few hundred values, a change builds only what is recent;
        // every live value is scrubbed all the same, and one that went is
        // not kept for ever.
        let value = |n: usize| format!("many-{n:05}-9b7e");
        let mut held: Vec<Registration> = (0..2000)
            .map(|n| register(vec![(format!("m{n}"), SecretString::new(value(n)))]).unwrap())
            .collect();
        for n in [0, 999, 1999] {
            assert_eq!(scrubber().scrub(&value(n)), format!("<secret:m{n}>"));
        }
        // Drop all but the last: the first ones are let go before long.
        let last = held.pop().unwrap();
        drop(held);
        assert_eq!(scrubber().scrub(&value(0)), value(0));
        assert_eq!(scrubber().scrub(&value(1999)), "<secret:m1999>");
        drop(last);
    }
}
