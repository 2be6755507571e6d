//! Starting a call's process with its limits, without fork(2).
//!
//! std and tokio start a child with posix_spawn, which copies nothing of
//! the parent, unless code must run in the child before it executes the
//! script, as setting its rlimits needs: then they fork, and fork copies
//! the page tables of the whole server and makes every page it writes
//! afterwards fault once. That cost grows with the server's memory
//! (measured on a 2-core VM: +0.7 ms a call at 22 MB resident, +2.2 ms at
//! 100 MB). This starts the child as posix_spawn does, with
//! `clone(CLONE_VM | CLONE_VFORK)`: the child borrows the parent's memory
//! on a stack of its own and runs only system calls until it executes the
//! script, while the thread that cloned it waits; the limits are set in
//! between, and its death with the server's (`PR_SET_PDEATHSIG`). Every
//! child is cloned from one thread that lives as long as the server
//! ([`spawner`]), which the death signal follows.
//!
//! The child's end is awaited on `SIGCHLD` (tokio's signal driver, which
//! `tokio::process` shares), then reaped with `waitpid`.

// The one place of the crate that starts a process by hand; each unsafe
// block says why it holds.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use nix::libc;
use tokio::net::unix::pipe;
use tokio::signal::unix::{signal, SignalKind};

/// What to start.
pub(super) struct Spawn<'a> {
    pub path: &'a Path,
    /// The arguments after the program's own name.
    pub args: &'a [String],
    /// The whole environment the child gets.
    pub env: Vec<(OsString, OsString)>,
    /// Whether the child's stdin is a pipe (or `/dev/null`).
    pub stdin: bool,
    /// RLIMIT_DATA, in bytes, for the child and what it starts.
    pub memory: Option<u64>,
    /// RLIMIT_NPROC for the child and what it starts.
    pub processes: Option<u64>,
}

/// A started child, in a process group of its own (its pid). Dropped
/// before it was reaped, it is killed and reaped in the background.
pub(super) struct Child {
    pid: libc::pid_t,
    reaped: bool,
    kept: Option<bindery_reaper::Kept>,
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
}

/// What the child reports when it could not execute the script: the
/// errno of the step that failed. Written by the child into the parent's
/// memory, which it shares until it executes or exits.
#[repr(C)]
struct ChildPlan {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Descriptors that become the child's 0, 1 and 2 (each above 2).
    stdio: [RawFd; 3],
    limits: [(libc::__rlimit_resource_t, libc::rlim_t); 2],
    n_limits: usize,
    /// The server's pid: a child whose parent is another by the time it
    /// asks to die with it has lost it already, and ends.
    server: libc::pid_t,
    errno: libc::c_int,
}

/// The child's side, between clone and execve. Only system calls: it
/// shares the parent's memory, so it must take no lock and allocate
/// nothing. Dispositions are reset as posix_spawn and std do (a caught
/// signal to its default, SIGPIPE, which Rust ignores, too), then the
/// signal mask emptied last, once no handler of the parent's can run.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` the parent keeps alive (and does
    // not touch) until this child has executed or exited.
    unsafe {
        let plan = &mut *(arg as *mut ChildPlan);
        for sig in 1..libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            let caught = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            if caught || sig == libc::SIGPIPE {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let fail = |plan: &mut ChildPlan| -> ! {
            plan.errno = *libc::__errno_location();
            libc::_exit(127)
        };
        // Killed when the server dies, even by SIGKILL: a call the server
        // can no longer record does nothing more. The parent is the
        // spawner thread, which lives as long as the server.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            fail(plan);
        }
        if libc::getppid() != plan.server {
            libc::_exit(127);
        }
        if libc::setpgid(0, 0) != 0 {
            fail(plan);
        }
        for (target, fd) in plan.stdio.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail(plan);
            }
        }
        // Only 0, 1 and 2 go on: a descriptor the server inherited from
        // whatever started it, without close-on-exec, stays the server's.
        // (Before Linux 5.9 there is no close_range; those close at exec
        // only if they were opened so.)
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
        for &(resource, value) in &plan.limits[..plan.n_limits] {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            if libc::setrlimit(resource, &limit) != 0 {
                fail(plan);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(plan.path, plan.argv, plan.envp);
        fail(plan)
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or variable holds a NUL byte",
        )
    })
}

/// A pipe whose both ends close on exec, each numbered above 2 so that
/// the child's `dup2` onto 0, 1 and 2 cannot overwrite one of them.
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just opened both; each is owned once.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor, owned here once.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

fn dev_null() -> io::Result<OwnedFd> {
    let file = std::fs::File::open("/dev/null")?;
    above_stdio(file.into())
}

/// Start `spec`. Must run inside a tokio runtime (the pipes and the wait
/// are registered with it).
pub(super) fn spawn(spec: &Spawn<'_>) -> io::Result<Child> {
    let path = cstring(spec.path.as_os_str())?;
    let mut argv_c = vec![path.clone()];
    for a in spec.args {
        argv_c.push(cstring(OsStr::new(a))?);
    }
    let mut env_c = Vec::with_capacity(spec.env.len());
    for (k, v) in &spec.env {
        let mut kv = k.clone();
        kv.push("=");
        kv.push(v);
        env_c.push(cstring(&kv)?);
    }
    let argv: Vec<*const libc::c_char> = argv_c
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = env_c
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    let (stdin_child, stdin_parent) = if spec.stdin {
        let (r, w) = pipe_pair()?;
        (r, Some(w))
    } else {
        (dev_null()?, None)
    };
    let (stdout_parent, stdout_child) = pipe_pair()?;
    let (stderr_parent, stderr_child) = pipe_pair()?;

    let mut limits = [(0 as libc::__rlimit_resource_t, 0 as libc::rlim_t); 2];
    let mut n_limits = 0;
    if let Some(bytes) = spec.memory {
        limits[n_limits] = (libc::RLIMIT_DATA, bytes);
        n_limits += 1;
    }
    if let Some(n) = spec.processes {
        limits[n_limits] = (libc::RLIMIT_NPROC, n);
        n_limits += 1;
    }
    let mut plan = ChildPlan {
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stdio: [
            stdin_child.as_raw_fd(),
            stdout_child.as_raw_fd(),
            stderr_child.as_raw_fd(),
        ],
        limits,
        n_limits,
        server: std::process::id() as libc::pid_t,
        errno: 0,
    };
    let pid = spawner::clone_child(&mut plan)?;
    // SAFETY: the child wrote it (or not) before the clone above returned.
    let errno = unsafe { std::ptr::read_volatile(&plan.errno) };
    if errno != 0 {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(io::Error::from_raw_os_error(errno));
    }
    drop((stdin_child, stdout_child, stderr_child));
    let mut child = Child {
        pid,
        reaped: false,
        kept: None,
        stdin: None,
        stdout: None,
        stderr: None,
    };
    child.stdin = stdin_parent.map(pipe::Sender::from_owned_fd).transpose()?;
    child.stdout = Some(pipe::Receiver::from_owned_fd(stdout_parent)?);
    child.stderr = Some(pipe::Receiver::from_owned_fd(stderr_parent)?);
    Ok(child)
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Keep the sweep off this child until it is reaped.
    pub fn keep(&mut self, kept: Option<bindery_reaper::Kept>) {
        self.kept = kept;
    }

    /// The child's exit, once it has ended; it is reaped then.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = reap(self.pid).await;
        self.reaped = true;
        status
    }

    /// SIGKILL, unless it was reaped already (its pid may be another's).
    pub fn kill(&mut self) {
        if !self.reaped {
            // SAFETY: a signal to our own child, not reaped: its pid is
            // still its own, even when it has ended.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

/// Wait for `pid` (a child of this process) to end and reap it.
async fn reap(pid: libc::pid_t) -> io::Result<ExitStatus> {
    // Listening before the first look: a SIGCHLD between the two is kept.
    let mut chld = signal(SignalKind::child())?;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child, writing into `status`.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            0 => {
                chld.recv().await;
            }
            p if p == pid => return Ok(ExitStatus::from_raw(status)),
            _ => return Err(io::Error::last_os_error()),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.kill();
        let (pid, kept) = (self.pid, self.kept.take());
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = reap(pid).await;
                    drop(kept);
                });
            }
            Err(_) => {
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                drop(kept);
            }
        }
    }
}

/// The one thread every child is cloned from. A child's death signal
/// (`PR_SET_PDEATHSIG`) fires when the thread that started it ends, not
/// the process: a tokio thread may end while the server runs (a blocking
/// pool's idle one, a worker given up by `block_in_place`), this one
/// never does.
mod spawner {
    use super::{child_main, io, libc, ChildPlan};
    use std::sync::mpsc;
    use std::sync::{LazyLock, Mutex};

    /// A plan's address and the answer's way back; the plan lives until
    /// the answer came (its caller waits for it).
    struct Job(usize, mpsc::SyncSender<io::Result<libc::pid_t>>);

    static JOBS: LazyLock<Mutex<Option<mpsc::Sender<Job>>>> = LazyLock::new(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("bindery-spawner".into())
            .spawn(move || {
                // No handler of the server's runs here, so none in a
                // child while it shares this memory; the child empties
                // its mask before it executes.
                // SAFETY: blocking signals on this thread only.
                unsafe {
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
                }
                for Job(plan, answer) in rx {
                    let _ = answer.send(clone_here(plan as *mut ChildPlan));
                }
            });
        Mutex::new(started.ok().map(|_| tx))
    });

    /// Start the child `plan` describes, from the spawner thread; its pid.
    pub(super) fn clone_child(plan: &mut ChildPlan) -> io::Result<libc::pid_t> {
        let (answer, answered) = mpsc::sync_channel(1);
        let sent = JOBS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|tx| tx.send(Job(plan as *mut ChildPlan as usize, answer)));
        match sent {
            Some(Ok(())) => answered
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("the spawner thread ended"))),
            _ => Err(io::Error::other(
                "no spawner thread: cannot start processes",
            )),
        }
    }

    fn clone_here(plan: *mut ChildPlan) -> io::Result<libc::pid_t> {
        // The child's own stack; this thread waits (CLONE_VFORK) until
        // the child no longer needs it.
        let mut stack = vec![0u8; 64 * 1024];
        // SAFETY: the top of `stack`, aligned down to 16 as the ABI wants.
        let top = unsafe { stack.as_mut_ptr().add(stack.len()) };
        let top = (top as usize & !15) as *mut libc::c_void;
        // SAFETY: every signal is blocked on this thread, so no handler of
        // the server's runs in the child while it shares the server's
        // memory. `plan` (which the caller keeps, waiting for this
        // answer), the strings it points into and `stack` outlive the
        // child's use of them: CLONE_VFORK returns only once the child
        // executed or exited.
        let pid = unsafe {
            libc::clone(
                child_main,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                plan as *mut libc::c_void,
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(stack);
        Ok(pid)
    }
}

#[cfg(test)]
mod tests;
