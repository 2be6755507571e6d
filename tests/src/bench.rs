//! The first line of every benchmark's output: when, where and on which
//! commit it ran. A run recorded with `tee` (docs/bench-runs/) then says
//! by itself what its numbers were measured on, and the docs need not
//! copy them into prose.

use std::path::Path;
use std::process::Command;

// k8s-openapi's timestamp type, already a dependency here.
use k8s_openapi::jiff;

/// `measured <time> at <commit> on <cores> × <cpu>, <memory>, load average
/// <1 5 15 min>`. What cannot be read (no git, no /proc) reads `unknown`.
pub fn context() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bindery-tests lives in the workspace");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "measured {} at {} on {cores} × {}, {}, load average {}",
        jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_default(),
        commit(root),
        cpu(&cpuinfo),
        memory(&meminfo),
        load(&loadavg),
    )
}

/// A goal's verdict line: `goal <what>: met (<measured>)`, or `not met`.
/// A bench prints one for each goal it checks, so that a recorded run
/// says whether the goals held without anyone reading its numbers.
pub fn goal(what: &str, met: bool, measured: &str) -> String {
    let verdict = if met { "met" } else { "not met" };
    format!("goal {what}: {verdict} ({measured})")
}

/// What `/proc` tells of a live process: its peak resident set size and
/// the CPU time it has used (user and system, all its threads). Zero for
/// what cannot be read (no /proc, the process gone).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Process {
    pub peak_rss_kib: u64,
    pub cpu_seconds: f64,
}

impl Process {
    pub fn read(pid: u32) -> Process {
        let read = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
        Process {
            peak_rss_kib: read("status").map_or(0, |s| peak_rss_kib(&s)),
            cpu_seconds: read("stat").map_or(0.0, |s| cpu_seconds(&s)),
        }
    }
}

/// The CPU time process `pid` has used so far (user and system, all its
/// threads, those that have ended too), to the nanosecond: the kernel's
/// CPU clock of the process (`clock_getcpuclockid`), where
/// [`Process::cpu_seconds`] counts ticks of 10 ms, too coarse for one
/// request. `None` when it cannot be read (the process gone).
pub fn cpu_time(pid: u32) -> Option<std::time::Duration> {
    use nix::time::{clock_getcpuclockid, clock_gettime};
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
    let t = clock_gettime(clock_getcpuclockid(pid).ok()?).ok()?;
    Some(std::time::Duration::new(
        u64::try_from(t.tv_sec()).ok()?,
        u32::try_from(t.tv_nsec()).ok()?,
    ))
}

fn peak_rss_kib(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn cpu_seconds(stat: &str) -> f64 {
    // Fields after the command name (which may hold spaces and
    // parentheses): utime and stime are the 12th and 13th, in clock
    // ticks, 100 a second on every Linux this runs on.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The checkout's short commit, `+changes` when tracked files differ from it.
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(rev) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{rev}+changes"),
            _ => rev,
        },
        None => "an unknown commit".into(),
    }
}

fn cpu(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or_else(|| "an unknown CPU".into(), |(_, m)| m.trim().to_string())
}

fn memory(meminfo: &str) -> String {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<f64>().ok())
        .map_or_else(
            || "unknown memory".into(),
            |kib| format!("{:.0} GiB", kib / 1024.0 / 1024.0),
        )
}

fn load(loadavg: &str) -> String {
    let three: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    if three.len() == 3 {
        three.join(" ")
    } else {
        "unknown".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_read_from_procs_text() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n";
        assert_eq!(cpu(cpuinfo), "AMD EPYC 7B13");
        assert_eq!(memory("MemTotal:       24605796 kB\n"), "23 GiB");
        assert_eq!(load("0.12 0.30 0.45 1/234 5678\n"), "0.12 0.30 0.45");
    }

    #[test]
    fn a_goal_says_whether_it_was_met_and_by_what() {
        assert_eq!(
            goal("a round trip ≤ 1.0 ms", false, "2.5 ms"),
            "goal a round trip ≤ 1.0 ms: not met (2.5 ms)"
        );
        assert_eq!(
            goal("none lost", true, "0/1000"),
            "goal none lost: met (0/1000)"
        );
    }

    #[test]
    fn a_process_is_read_from_procs_text() {
        assert_eq!(
            peak_rss_kib("Name:\tx\nVmHWM:\t  117004 kB\nVmRSS:\t1 kB\n"),
            117004
        );
        // A command name with a space and a parenthesis, then state, ppid,
        // …, utime 250 and stime 14 ticks.
        let stat = "4242 (bindery (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 14 0 0 20 0 9";
        assert_eq!(cpu_seconds(stat), 2.64);
        assert_eq!(Process::read(u32::MAX), Process::default());
    }

    #[test]
    fn a_processs_cpu_clock_counts_its_work() {
        let me = std::process::id();
        let start = cpu_time(me).expect("this process's CPU clock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        // Work until the clock has counted 5 ms of it.
        let mut n = 0u64;
        while cpu_time(me).unwrap() < start + std::time::Duration::from_millis(5) {
            n = std::hint::black_box(n.wrapping_add(1));
            assert!(
                std::time::Instant::now() < deadline,
                "the clock stood still"
            );
        }
        assert_eq!(cpu_time(u32::MAX), None);
    }

    #[test]
    fn what_cannot_be_read_says_so() {
        assert_eq!(cpu(""), "an unknown CPU");
        assert_eq!(memory("MemFree: 1 kB\n"), "unknown memory");
        assert_eq!(load(""), "unknown");
        assert_eq!(commit(Path::new("/nonexistent")), "an unknown commit");
    }
}
