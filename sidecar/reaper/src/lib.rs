//! What a tool leaves behind. A tool's process may start others that
//! outlive it: a daemon that double-forks, a child that calls `setsid` to
//! leave the process group the server kills on a timeout. The server is
//! a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every process orphaned
//! below it becomes its own child instead of init's; when a call ends,
//! [`sweep`] kills and reaps every child of the server that is not one it
//! keeps (a call's process in flight, an MCP server, a value's command),
//! layer after layer until none is left. So nothing a tool started
//! outlives its call, whatever it did to its group or session. An orphan
//! of a call still running elsewhere goes at that sweep too: a process
//! whose parent left it is the server's, and no call's to keep.
//!
//! A child is spawned and kept under one lock ([`spawn_kept`]), which the
//! sweep takes too: no sweep can take a child for an orphan between its
//! start and its keeping.

#![forbid(unsafe_code)]

mod marks;
pub use marks::{end_what_dead_servers_left, mark, MARK};

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

static KEPT: LazyLock<Mutex<HashSet<u32>>> = LazyLock::new(Default::default);

/// Set once the server ends: nothing more is started ([`spawn_kept`]).
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Set once this process is the reaper: only then does a sweep kill. A
/// program that uses this crate and did not ask (a test process with
/// children of its own) is never swept.
static REAPING: AtomicBool = AtomicBool::new(false);

fn kept() -> MutexGuard<'static, HashSet<u32>> {
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Make this process the reaper of every process orphaned below it. On
/// a kernel that refuses it, orphans go to init as before (a warning).
pub fn become_subreaper() {
    match nix::sys::prctl::set_child_subreaper(true) {
        Ok(()) => REAPING.store(true, Ordering::SeqCst),
        Err(e) => {
            tracing::warn!(error = %e, "cannot become the reaper of the tools' orphans: a process a tool leaves behind may outlive its call")
        }
    }
}

/// A child the sweep leaves alone while this lives.
#[derive(Debug)]
pub struct Kept(u32);

impl Drop for Kept {
    fn drop(&mut self) {
        kept().remove(&self.0);
    }
}

/// `spawn` (which starts a child and gives its pid) run under the lock
/// the sweep takes, the child kept from then on.
pub fn spawn_kept<C>(
    spawn: impl FnOnce() -> std::io::Result<(C, Option<u32>)>,
) -> std::io::Result<(C, Option<Kept>)> {
    let mut set = kept();
    if CLOSED.load(Ordering::SeqCst) {
        return Err(std::io::Error::other(
            "the server is stopping: no tool process starts",
        ));
    }
    let (child, pid) = spawn()?;
    let guard = pid.map(|p| {
        set.insert(p);
        Kept(p)
    });
    Ok((child, guard))
}

/// The children of process `pid` now: each of its threads' `children`
/// file (the kernel lists a thread's own), or, where the kernel has none,
/// every process whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut listed = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                listed = true;
                out.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    if listed {
        return out;
    }
    let Ok(all) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in all.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if parent_and_state(child).is_some_and(|(ppid, _)| ppid == pid) {
            out.push(child);
        }
    }
    out
}

/// A process's parent and state letter (`R`, `S`, `T`, `Z`, …).
fn parent_and_state(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: the command may hold spaces and parens.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

fn signal(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), sig);
    }
}

/// Stop `pid` and wait (briefly) until it has: a stopped process forks
/// no more, so its list of children is then final.
fn freeze(pid: u32) {
    signal(pid, Signal::SIGSTOP);
    for _ in 0..200 {
        match parent_and_state(pid) {
            Some((_, 'T' | 't' | 'Z' | 'X')) | None => return,
            _ => std::thread::sleep(std::time::Duration::from_micros(250)),
        }
    }
}

/// Every process below `roots`, the roots included, each stopped before
/// its children are read: a tree that forks as it is walked cannot grow
/// past the walk.
fn frozen_tree(roots: Vec<u32>) -> Vec<u32> {
    let mut seen = HashSet::new();
    let mut tree = Vec::new();
    let mut todo = roots;
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        freeze(pid);
        tree.push(pid);
        todo.extend(children_of(pid));
    }
    tree
}

/// Kill and reap every child of this process that is not kept, and every
/// process below each: the trees are stopped whole first, then killed, so
/// none can outgrow the sweep; what they leave dying comes to this process
/// and is reaped by the next pass, until none is left. Blocking: run it
/// off the async workers. How many it killed.
pub fn sweep() -> usize {
    let mut killed = 0;
    if !anything_to_reap() {
        return killed;
    }
    // Each pass kills whole trees; later passes only reap their dead.
    for _ in 0..1000 {
        let orphans = orphans();
        if orphans.is_empty() {
            break;
        }
        killed += kill_trees(orphans);
    }
    if killed > 0 {
        tracing::info!(killed, "processes tools left behind were killed");
    }
    killed
}

/// Whether the server is ending ([`end_all`] has begun): a call's
/// process killed now was killed by it.
pub fn ending() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

/// At the server's end: nothing starts any more, and every child (a
/// call's process in flight, an MCP server, a value's command) is killed
/// with all below it, whatever it did to its group or session, pass after
/// pass until none is left. Blocking. How many it killed.
pub fn end_all() -> usize {
    {
        // Under the spawn lock: a spawn under way is kept, then killed here.
        let _set = kept();
        CLOSED.store(true, Ordering::SeqCst);
    }
    let mut killed = 0;
    for _ in 0..1000 {
        let children = children_of(std::process::id());
        if children.is_empty() {
            break;
        }
        killed += kill_trees(children);
    }
    if killed > 0 {
        tracing::info!(
            killed,
            "the tools' processes were killed as the server ends"
        );
    }
    killed
}

/// This process's children that are not kept: what calls left behind.
fn orphans() -> Vec<u32> {
    let set = kept();
    children_of(std::process::id())
        .into_iter()
        .filter(|p| !set.contains(p))
        .collect()
}

/// Stop the trees under `roots` whole, kill every process in them, and
/// reap the roots (children of this process, maybe zombies already).
/// How many processes it killed.
fn kill_trees(roots: Vec<u32>) -> usize {
    let tree = frozen_tree(roots.clone());
    for pid in &tree {
        signal(*pid, Signal::SIGKILL);
    }
    for pid in roots {
        if let Ok(raw) = i32::try_from(pid) {
            let _ = waitpid(Pid::from_raw(raw), None);
        }
    }
    tree.len()
}

/// Whether this process reaps, and has a child at all.
fn anything_to_reap() -> bool {
    REAPING.load(Ordering::SeqCst) && has_children()
}

/// The memory the process tree under `root` holds now, the root included:
/// each process's private resident pages and the shared memory it maps
/// (`RssAnon` + `RssShmem`), which a process limit (RLIMIT_DATA) does not
/// see whole.
pub fn tree_memory(root: u32) -> u64 {
    let mut seen = HashSet::new();
    let mut todo = vec![root];
    let mut kib = 0u64;
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) || seen.len() > 10_000 {
            continue;
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            for line in status.lines() {
                if let Some(v) = line
                    .strip_prefix("RssAnon:")
                    .or_else(|| line.strip_prefix("RssShmem:"))
                {
                    kib += v
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0);
                }
            }
        }
        todo.extend(children_of(pid));
    }
    kib * 1024
}

/// Kill orphan trees, the largest first, until those left hold at most
/// `limit` bytes together. An orphan (a tree a call left with `setsid`,
/// now this process's child) is no longer below the call that started
/// it, and which call that was cannot be told: so it is held to the
/// bound on its own, and no call is stopped for another's orphan.
/// Blocking; how many processes it killed.
pub fn trim_orphans(limit: u64) -> usize {
    if !anything_to_reap() {
        return 0;
    }
    let mut held: Vec<(u64, u32)> = orphans().into_iter().map(|p| (tree_memory(p), p)).collect();
    let mut total: u64 = held.iter().map(|(m, _)| m).sum();
    held.sort_unstable_by(|a, b| b.cmp(a));
    let mut killed = 0;
    for (memory, root) in held {
        if total <= limit {
            break;
        }
        killed += kill_trees(vec![root]);
        total = total.saturating_sub(memory);
    }
    if killed > 0 {
        tracing::warn!(
            killed,
            limit,
            "processes tools left behind held more memory than a call may: killed"
        );
    }
    killed
}

/// [`sweep`] on a blocking thread: only when there is something to sweep.
pub async fn sweep_async() -> usize {
    if !anything_to_reap() {
        return 0;
    }
    tokio::task::spawn_blocking(sweep).await.unwrap_or(0)
}

/// Whether this process has any child at all, one system call. Every
/// process a tool left is this process's child or below one (an orphan
/// comes here when its parent ends, before that parent can be reaped),
/// so with none there is nothing to sweep: the common case, a server
/// with no call in flight and no MCP server, skips the walk, which on a
/// kernel without `/proc/*/task/*/children` reads every process's `stat`.
fn has_children() -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    let any = WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT | WaitPidFlag::WEXITED;
    !matches!(waitid(Id::All, any), Err(nix::errno::Errno::ECHILD))
}
