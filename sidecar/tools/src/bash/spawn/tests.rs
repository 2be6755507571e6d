use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sh(script: &str, stdin: bool, memory: Option<u64>, processes: Option<u64>) -> Child {
    spawn(&Spawn {
        path: Path::new("/bin/sh"),
        args: &["-c".to_string(), script.to_string()],
        env: vec![("GREETING".into(), "hello there".into())],
        stdin,
        memory,
        processes,
    })
    .expect("/bin/sh starts")
}

async fn output(mut child: Child) -> (ExitStatus, String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (a, b) = tokio::join!(
        stdout.read_to_string(&mut out),
        stderr.read_to_string(&mut err)
    );
    a.unwrap();
    b.unwrap();
    (child.wait().await.unwrap(), out, err)
}

#[tokio::test]
async fn the_child_gets_its_arguments_environment_and_pipes() {
    let mut child = sh(
        r#"read line; echo "$GREETING, $line"; echo oops >&2; exit 3"#,
        true,
        None,
        None,
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"world\n").await.unwrap();
    drop(stdin);
    let (status, out, err) = output(child).await;
    assert_eq!(status.code(), Some(3));
    assert_eq!(out, "hello there, world\n");
    assert_eq!(err, "oops\n");
}

#[tokio::test]
async fn the_child_gets_exactly_the_environment_given() {
    let child = spawn(&Spawn {
        path: Path::new("/usr/bin/env"),
        args: &[],
        env: vec![("A".into(), "1".into()), ("B".into(), "two words".into())],
        stdin: false,
        memory: None,
        processes: None,
    })
    .unwrap();
    let (_, out, _) = output(child).await;
    assert_eq!(out, "A=1\nB=two words\n");
}

#[tokio::test]
async fn only_stdin_stdout_and_stderr_go_to_the_child() {
    // A descriptor without close-on-exec, as one the server inherited.
    let file = std::fs::File::open("/dev/null").unwrap();
    let fd = std::os::fd::IntoRawFd::into_raw_fd(file);
    // SAFETY: clearing FD_CLOEXEC on the descriptor just opened.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let (_, out, _) = output(sh("ls /proc/self/fd", false, None, None)).await;
    // SAFETY: closing what was opened above.
    unsafe { libc::close(fd) };
    // `ls` itself holds one more: the directory it reads.
    let fds: Vec<&str> = out.split_whitespace().collect();
    assert!(!fds.contains(&fd.to_string().as_str()), "{fds:?}");
    assert!(fds.len() <= 4, "{fds:?}");
}

#[tokio::test]
async fn without_a_pipe_stdin_is_empty() {
    let (status, out, _) = output(sh("cat; echo end", false, None, None)).await;
    assert!(status.success());
    assert_eq!(out, "end\n");
}

#[tokio::test]
async fn the_child_leads_a_process_group_of_its_own() {
    let child = sh("ps -o pgid= -p $$", false, None, None);
    let pid = child.id();
    let (_, out, _) = output(child).await;
    assert_eq!(out.trim(), pid.to_string());
}

#[tokio::test]
async fn the_limits_hold_in_the_child_and_what_it_starts() {
    let limits = "grep -E '^Max (data size|processes)' /proc/self/limits | tr -s ' '";
    let child = sh(
        &format!("{limits}; sh -c \"{limits}\""),
        false,
        Some(256 << 20),
        Some(77),
    );
    let (_, out, _) = output(child).await;
    let one = "Max data size 268435456 268435456 bytes \nMax processes 77 77 processes \n";
    assert_eq!(out, format!("{one}{one}"));
    // Without limits the child has the server's own.
    let (_, out, _) = output(sh("ulimit -d", false, None, None)).await;
    assert_eq!(out.trim(), "unlimited");
}

#[tokio::test]
async fn a_broken_pipe_ends_the_writer_as_it_would_from_a_shell() {
    // Rust ignores SIGPIPE; the script must not inherit that, or `yes`
    // writes into the closed pipe forever.
    let (status, out, _) = output(sh("yes | head -n 2", false, None, None)).await;
    assert!(status.success());
    assert_eq!(out, "y\ny\n");
}

#[tokio::test]
async fn a_program_that_cannot_run_is_an_error_not_a_child() {
    let err = spawn(&Spawn {
        path: Path::new("/nonexistent/tool"),
        args: &[],
        env: vec![],
        stdin: false,
        memory: Some(1 << 30),
        processes: None,
    })
    .err()
    .expect("no such program");
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    let err = spawn(&Spawn {
        path: Path::new("/bin/sh"),
        args: &["-c\0".to_string()],
        env: vec![],
        stdin: false,
        memory: None,
        processes: None,
    })
    .err()
    .expect("a NUL byte");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn a_child_dropped_unwaited_is_killed_and_reaped() {
    let child = sh("sleep 30", false, None, None);
    let pid = child.id();
    drop(child);
    // Reaped in the background: its pid leaves /proc.
    let gone = async {
        while Path::new(&format!("/proc/{pid}")).exists() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), gone)
        .await
        .expect("the dropped child is killed and reaped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_children_at_once_each_get_their_own_output() {
    let runs = (0..64).map(|i| async move {
        let (status, out, _) = output(sh(&format!("echo {i}"), false, None, Some(4096))).await;
        assert!(status.success());
        assert_eq!(out, format!("{i}\n"));
    });
    futures::future::join_all(runs).await;
}

/// A child dies with the server (`PR_SET_PDEATHSIG`), not with the thread
/// that asked for it: started from a thread that then ends (as a blocking
/// pool's idle thread does), it runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_outlives_the_thread_that_started_it() {
    let rt = tokio::runtime::Handle::current();
    let mut child = std::thread::spawn(move || {
        let _in = rt.enter();
        sh("read line; echo \"got $line\"", true, None, None)
    })
    .join()
    .unwrap();
    // That thread is gone; the child still reads and answers.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"more\n").await.unwrap();
    drop(stdin);
    let (status, out, _) = output(child).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(out, "got more\n");
}
