//! The servers a harness starts and stops as a group (the control plane's,
//! a node's): each logs to `DIR/NAME.log` and dies with the thread that
//! started it (`PR_SET_PDEATHSIG`), so the thread that owns a `Children`
//! must live as long as the servers do.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a server may take to stop on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Running servers, in the order they started.
pub struct Children {
    dir: PathBuf,
    list: Vec<(String, Child)>,
    /// What to say when a program is missing (how to install it).
    hint: &'static str,
}

impl Children {
    /// Servers logging under `dir`; `hint` says how to get a missing one.
    pub fn new(dir: &Path, hint: &'static str) -> Children {
        Children {
            dir: dir.to_path_buf(),
            list: Vec::new(),
            hint,
        }
    }

    /// Start `program` as `name`, its output appended to `NAME.log` (a
    /// server started again goes on in the same log).
    pub fn spawn(&mut self, name: &str, program: &Path, args: &[String]) {
        self.spawn_with(name, Command::new(program).args(args));
    }

    /// Start `cmd` as `name` (its program, arguments and environment set
    /// by the caller), as [`Self::spawn`] does.
    pub fn spawn_with(&mut self, name: &str, cmd: &mut Command) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(name))
            .expect("a log file");
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log);
        // If the test process dies without stopping us, the servers go too.
        // SAFETY: between fork and exec the closure only calls prctl, which
        // is async-signal-safe.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{} does not run: {e}: {}",
                cmd.get_program().to_string_lossy(),
                self.hint
            )
        });
        self.list.push((name.to_string(), child));
    }

    /// Where `name` logs.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// `name`'s whole log.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// The first server that has exited, if one has.
    pub fn exited(&mut self) -> Option<String> {
        self.list
            .iter_mut()
            .find_map(|(name, c)| (!matches!(c.try_wait(), Ok(None))).then(|| name.clone()))
    }

    /// Whether `name` runs.
    pub fn running(&mut self, name: &str) -> bool {
        self.list
            .iter_mut()
            .any(|(n, c)| n == name && matches!(c.try_wait(), Ok(None)))
    }

    /// The tail of every server's log, for a failure message.
    pub fn logs(&self, each: usize) -> String {
        self.list
            .iter()
            .map(|(name, _)| format!("--- {name}:\n{}\n", tail(&self.log(name), each)))
            .collect()
    }

    /// Stop `name` with `signal`, wait until it has exited and forget it.
    pub fn stop_one(&mut self, name: &str, signal: Signal) {
        if let Some(i) = self.list.iter().position(|(n, _)| n == name) {
            let (_, mut child) = self.list.remove(i);
            let _ = kill(Pid::from_raw(child.id() as i32), signal);
            let _ = child.wait();
        }
    }

    /// Stop them all, the last started first: SIGTERM, then SIGKILL after
    /// `STOP_GRACE` (10 s).
    pub fn stop(&mut self) {
        while let Some((_, mut child)) = self.list.pop() {
            if let Ok(None) = child.try_wait() {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
                let deadline = Instant::now() + STOP_GRACE;
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `n` bytes of `text` (on a char boundary).
pub fn tail(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
