use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bindery_operator::controller::{self, Context};
use bindery_operator::desired::OperatorConfig;
use bindery_operator::leader::{self, LeaseConfig};
use bindery_operator::metrics::Metrics;
use bindery_operator::watches::Health;
use clap::{Parser, Subcommand, ValueEnum};

/// Bindery's operator: reconciles `Agent`s and `AgentTenant`s into
/// per-tenant agent servers.
#[derive(Parser)]
#[command(name = "bindery-operator", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(ValueEnum, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Write the CRD documents (generated from the Rust types) into
    /// directories: by default the repository's `crds/` and the operator
    /// chart's copy.
    Crdgen {
        #[arg(long, default_values = ["crds", "charts/bindery-operator/crds"])]
        out: Vec<PathBuf>,
    },
    /// Run the controller (kubeconfig or in-cluster configuration).
    Run {
        /// Watch only this namespace (repeatable); all namespaces by default.
        #[arg(long = "namespace", value_name = "NS")]
        namespaces: Vec<String>,
        /// The sidecar image tenants run unless they name their own.
        #[arg(long, env = "BINDERY_SIDECAR_IMAGE", default_value_t = OperatorConfig::default().sidecar_image)]
        sidecar_image: String,
        #[arg(long, default_value = "cluster.local")]
        cluster_domain: String,
        /// Where `/metrics`, `/healthz` and `/readyz` are served.
        #[arg(long, default_value = "0.0.0.0:8080")]
        metrics_listen: String,
        /// Reconcile only while holding a Lease (run with more than one replica).
        #[arg(long)]
        leader_elect: bool,
        #[arg(long, default_value = "bindery-operator")]
        lease_name: String,
        /// Default: the pod's namespace (POD_NAMESPACE), else `default`.
        #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
        lease_namespace: String,
        /// Seconds a leader may go without renewing before another takes over.
        #[arg(long, default_value_t = 15)]
        lease_duration: u64,
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crdgen { out } => {
            for dir in out {
                match bindery_operator::crd::write_crds(&dir) {
                    Ok(files) => files.iter().for_each(|f| println!("wrote {}", f.display())),
                    Err(e) => {
                        eprintln!("error: {}: {e}", dir.display());
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Command::Run {
            namespaces,
            sidecar_image,
            cluster_domain,
            metrics_listen,
            leader_elect,
            lease_name,
            lease_namespace,
            lease_duration,
            log_format,
        } => {
            init_logging(log_format);
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let lease = leader_elect.then(|| LeaseConfig {
                name: lease_name,
                namespace: lease_namespace,
                identity: std::env::var("POD_NAME")
                    .unwrap_or_else(|_| format!("bindery-operator-{}", std::process::id())),
                duration: Duration::from_secs(lease_duration.max(2)),
                // A third of the lease (whole seconds cut a 2 s lease in half).
                renew_every: Duration::from_secs(lease_duration.max(2)) / 3,
            });
            let config = OperatorConfig {
                sidecar_image,
                cluster_domain,
            };
            match rt.block_on(run(namespaces, config, &metrics_listen, lease)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BINDERY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("no Kubernetes API to talk to (kubeconfig or in-cluster): {0}")]
    NoApi(kube::Error),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error("lost the leader lease; exiting so that only the leader writes")]
    LostLease,
}

async fn run(
    namespaces: Vec<String>,
    config: OperatorConfig,
    metrics_listen: &str,
    lease: Option<LeaseConfig>,
) -> Result<(), RunError> {
    let client = kube::Client::try_default().await.map_err(RunError::NoApi)?;
    let metrics = Arc::new(Metrics::default());
    let watches = Arc::new(Health::new(metrics.clone()));
    let listen = |source| RunError::Listen {
        address: metrics_listen.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(metrics_listen)
        .await
        .map_err(listen)?;
    let addr = listener.local_addr().map_err(listen)?;
    println!("metrics on http://{addr}");
    let m = metrics.clone();
    let health = watches.clone();
    // Liveness is the process answering, whatever the watches: they start
    // again on their own after every error, so a watch that stays failing
    // means an API server that does not answer (or refuses), which no
    // restart of the operator cures; restarting every replica during a
    // control-plane outage would only add their lists to its return.
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let blind = health.blind();
                async move {
                    if blind.is_empty() {
                        (axum::http::StatusCode::OK, "ok".to_string())
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            format!("not seeing:\n{}\n", blind.join("\n")),
                        )
                    }
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let m = m.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            bindery_operator::metrics::CONTENT_TYPE,
                        )],
                        m.render(),
                    )
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server: {e}");
        }
    });

    let mut renewed = tokio::time::Instant::now();
    if let Some(l) = &lease {
        tokio::select! {
            started = leader::acquire(&client, l) => renewed = started,
            _ = shutdown_signal() => return Ok(()),
        }
    }
    let ctx = Arc::new(Context {
        client: client.clone(),
        config,
        metrics,
        events: bindery_operator::events::Publisher::new(client.clone()),
        watches,
    });
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    tracing::info!(namespaces = ?scopes, "controller started");
    // Per scope, the tenants' controller and the Agents' (their `Valid`).
    let controllers = futures::future::join_all(scopes.into_iter().map(|ns| {
        let (tenants, agents) = (ctx.clone(), ctx.clone());
        async move {
            futures::join!(
                controller::run(tenants, ns.clone()),
                controller::run_agents(agents, ns)
            );
        }
    }));
    match &lease {
        Some(l) => {
            tokio::select! {
                _ = controllers => Ok(()),
                // A leader that lost its lease stops writing at once.
                _ = leader::hold(&client, l, renewed) => Err(RunError::LostLease),
            }
        }
        None => {
            controllers.await;
            Ok(())
        }
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}
