//! `test-node`: the tests' real node ([`bindery_tests::node`]) kept
//! running for a person, to try the charts and images by hand (as root,
//! after `tests/setup.sh`):
//!
//! ```text
//! cargo run -p bindery-tests --bin test-node
//! ```
//!
//! It prints the administrator's kubeconfig and how to enter the node's
//! network namespace (where the API server, the pods and the Services'
//! addresses are), then serves until Ctrl-C or SIGTERM, and leaves nothing
//! behind.

use std::os::fd::AsRawFd;
use std::process::ExitCode;

use bindery_tests::control_plane::ADMIN;
use bindery_tests::node::Node;

fn main() -> ExitCode {
    if std::env::args().len() > 1 {
        eprintln!("usage: test-node (no arguments; as root, after tests/setup.sh)");
        return ExitCode::from(2);
    }
    let node = Node::start();
    let ns = node.namespace_handle();
    println!("node ready: {}", node.dir().display());
    println!(
        "export KUBECONFIG={}",
        node.plane.kubeconfig(ADMIN).display()
    );
    println!(
        "enter its network namespace: nsenter --net=/proc/{}/fd/{} bash",
        std::process::id(),
        ns.as_raw_fd()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    });
    println!("stopping the node");
    drop(node);
    ExitCode::SUCCESS
}
