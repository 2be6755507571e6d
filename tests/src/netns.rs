//! A network namespace of the test's own, for what must not touch the
//! machine's network: a node's bridge, routes, iptables rules and the
//! servers that listen on its addresses ([`crate::node`]).
//!
//! No name is registered (`ip netns add` would leave `/run/netns/NAME`
//! behind a test that dies): the namespace is held by an open file and
//! by the processes started in it, and goes with the last of them.
//!
//! A thread enters it with [`NetNs::enter`]; every thread it spawns
//! afterwards and every process it starts is in it too (a new task takes
//! its creator's namespaces), so a test enters first and builds its
//! runtime after. Only the network namespace is entered: the mount and
//! cgroup namespaces stay the machine's (`ip netns exec` would also mount
//! a `/sys` of its own, where the cgroup tree is empty).

use std::fs::File;
use std::os::fd::AsFd;
use std::process::Command;

use nix::sched::{setns, unshare, CloneFlags};

/// A network namespace, held open.
pub struct NetNs {
    handle: File,
}

impl NetNs {
    /// A new namespace with its loopback up.
    pub fn new() -> NetNs {
        // Made on a thread of its own, which ends with it: the caller's
        // thread stays where it is.
        let handle = std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET): a network namespace needs root (CAP_SYS_ADMIN)");
            File::open("/proc/thread-self/ns/net").expect("the new namespace's handle")
        })
        .join()
        .expect("the thread that made the namespace");
        let ns = NetNs { handle };
        ns.run(|| run_ok("ip", &["link", "set", "lo", "up"]));
        ns
    }

    /// Put the calling thread in the namespace, for good: what it spawns
    /// from now on is in there too.
    pub fn enter(&self) {
        setns(self.handle.as_fd(), CloneFlags::CLONE_NEWNET)
            .expect("setns into the test's network namespace");
    }

    /// Another handle on the same namespace (for a thread that outlives
    /// the borrow).
    pub fn try_clone(&self) -> NetNs {
        NetNs {
            handle: self
                .handle
                .try_clone()
                .expect("a second handle on the namespace"),
        }
    }

    /// The open file that holds the namespace.
    pub fn handle(&self) -> &File {
        &self.handle
    }

    /// `f` on a thread in the namespace; its value.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter();
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Default for NetNs {
    fn default() -> Self {
        NetNs::new()
    }
}

/// Run `program args` (in the caller's namespaces) and panic with its
/// output unless it succeeds.
pub fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}: run tests/setup.sh"));
    assert!(
        out.status.success(),
        "{program} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
