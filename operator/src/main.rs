use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Bindery's operator: reconciles `Agent`s and `AgentTenant`s into
/// per-tenant agent servers.
#[derive(Parser)]
#[command(name = "bindery-operator", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the CRD documents (generated from the Rust types) into a directory.
    Crdgen {
        #[arg(long, default_value = "crds")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crdgen { out } => match bindery_operator::crd::write_crds(&out) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
