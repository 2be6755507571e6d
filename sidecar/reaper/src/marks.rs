//! What a server that died leaves running. A server killed with SIGKILL
//! ends nothing: its tool's process dies with it (`PR_SET_PDEATHSIG`,
//! set where the process is started), but what that process started
//! does not, and goes to init. So every process the server starts for a
//! tool carries a mark in its environment ([`MARK`]), which what it
//! starts inherits: the server's pid and start time, together one
//! server's for good (a pid comes back; a pid with its start time does
//! not). At its start a server kills every process of its user marked by
//! a server no longer running ([`end_what_dead_servers_left`]), before it
//! closes their calls as interrupted. Outside a container that is the
//! one way; in one, the container's end takes them all.
//!
//! A process that empties its environment (`env -i`) loses the mark: the
//! bound is the ordinary tool's, not a hostile one's (docs/security.md).

use std::collections::HashMap;
use std::sync::LazyLock;

use super::{freeze, signal};
use nix::sys::signal::Signal;

/// The variable that marks a tool's processes: `<pid>.<start time>` of
/// the server that started them.
pub const MARK: &str = "BINDERY_TOOL_SERVER";

/// This process's mark.
static OWN: LazyLock<String> = LazyLock::new(|| {
    let pid = std::process::id();
    format!("{pid}.{}", start_time(pid).unwrap_or(0))
});

/// The variable and value every process this server starts for a tool
/// is given.
pub fn mark() -> (&'static str, &'static str) {
    (MARK, OWN.as_str())
}

/// When process `pid` started, in clock ticks after boot (`stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: the command may hold spaces and parens.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the server a mark names runs now.
fn runs(mark: &str) -> bool {
    let Some((pid, started)) = mark.split_once('.') else {
        return false;
    };
    match (pid.parse::<u32>(), started.parse::<u64>()) {
        (Ok(pid), Ok(started)) => start_time(pid) == Some(started),
        _ => false,
    }
}

/// The mark in process `pid`'s environment, if it has one (and its
/// environment can be read: this user's processes only).
fn mark_of(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{MARK}=");
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Every process (pid and start time) marked by a server that no longer
/// runs.
fn left_by_dead_servers() -> Vec<(u32, u64)> {
    let me = std::process::id();
    let Ok(all) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // Each mark's server looked up once: whether it runs.
    let mut servers: HashMap<String, bool> = HashMap::new();
    let mut out = Vec::new();
    for e in all.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Read before the mark: the same start time after it is the same process.
        let Some(started) = start_time(pid) else {
            continue;
        };
        let Some(mark) = mark_of(pid) else {
            continue;
        };
        let alive = mark == *OWN || *servers.entry(mark).or_insert_with_key(|m| runs(m));
        if !alive {
            out.push((pid, started));
        }
    }
    out
}

/// Kill every process a server that died left running (see the module's
/// comment): all of them stopped first, so none forks past the kill, then
/// killed, pass after pass until none is found. Blocking (it reads every
/// process's environment once a pass); run it once, at start. How many
/// it killed.
pub fn end_what_dead_servers_left() -> usize {
    let mut killed = 0;
    for _ in 0..100 {
        let found = left_by_dead_servers();
        if found.is_empty() {
            break;
        }
        // Each still the process that was read (a pid may come back).
        let same = |&(pid, started): &(u32, u64)| start_time(pid) == Some(started);
        for p in found.iter().filter(|p| same(p)) {
            freeze(p.0);
        }
        for p in found.iter().filter(|p| same(p)) {
            signal(p.0, Signal::SIGKILL);
            killed += 1;
        }
    }
    if killed > 0 {
        tracing::warn!(
            killed,
            "processes the tools of a server that died had left running were killed"
        );
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_names_this_server_while_it_runs() {
        let (name, value) = mark();
        assert_eq!(name, MARK);
        assert!(runs(value), "{value}");
        assert!(!runs("0.0"));
        assert!(!runs("garbage"));
        // The same pid with another start time is another process.
        let pid = std::process::id();
        assert!(!runs(&format!("{pid}.{}", start_time(pid).unwrap() + 1)));
    }

    /// A process marked by a server that is gone is killed; one marked by
    /// this one, and one unmarked, are not.
    #[test]
    fn what_a_dead_server_left_is_killed_and_nothing_else() {
        let pid = std::process::id();
        let gone = format!("{pid}.{}", start_time(pid).unwrap() + 1);
        let start = |mark: Option<&str>| {
            let mut c = std::process::Command::new("sleep");
            c.arg("1000");
            if let Some(m) = mark {
                c.env(MARK, m);
            }
            c.spawn().unwrap()
        };
        let mut orphan = start(Some(&gone));
        let mut ours = start(Some(mark().1));
        let mut plain = start(None);
        // The child's environment is readable once it has executed.
        for c in [&orphan, &ours, &plain] {
            for _ in 0..2000 {
                if std::fs::read_to_string(format!("/proc/{}/cmdline", c.id()))
                    .is_ok_and(|s| s.starts_with("sleep"))
                {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        assert!(end_what_dead_servers_left() >= 1);
        let status = orphan.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(ours.try_wait().unwrap().is_none());
        assert!(plain.try_wait().unwrap().is_none());
        let _ = ours.kill();
        let _ = plain.kill();
        let _ = ours.wait();
        let _ = plain.wait();
    }
}
