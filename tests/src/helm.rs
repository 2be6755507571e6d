//! The chart tests' tools: the real `helm` (installed by
//! `tests/helm/install-helm.sh`), rendering and splitting manifests,
//! `kubernetes-validate` (PyPI) for the built-in kinds, and the operator
//! binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

const HELM_HINT: &str = "run `tests/helm/install-helm.sh` (or set BINDERY_HELM to a helm binary)";

/// The repository root.
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the tests crate is in the workspace")
            .to_path_buf()
    })
}

/// A path under the repository root, as a string for command lines.
pub fn repo_path(rel: &str) -> String {
    repo_root().join(rel).display().to_string()
}

/// Where tests/setup.sh installs and builds what the tests run:
/// `BINDERY_CACHE`, else `$XDG_CACHE_HOME/bindery`, else
/// `~/.cache/bindery` (the same rule as install-helm.sh and
/// tests/control-plane/build.sh).
pub fn bindery_cache() -> PathBuf {
    match std::env::var_os("BINDERY_CACHE") {
        Some(c) => PathBuf::from(c),
        None => match std::env::var_os("XDG_CACHE_HOME") {
            Some(x) => PathBuf::from(x).join("bindery"),
            None => {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/bindery")
            }
        },
    }
}

/// Where `install-helm.sh` puts helm (keep the two in step).
fn installed_helm() -> PathBuf {
    bindery_cache().join("helm/helm")
}

/// The helm binary: `BINDERY_HELM`, else the one `install-helm.sh`
/// installed. Panics with the install command when there is none.
pub fn helm_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let (path, from) = match std::env::var_os("BINDERY_HELM") {
            Some(p) => (PathBuf::from(p), "BINDERY_HELM"),
            None => (installed_helm(), "the install-helm.sh location"),
        };
        let runs = Command::new(&path)
            .args(["version", "--short"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            runs,
            "no runnable helm at {} ({from}): {HELM_HINT}",
            path.display()
        );
        path
    })
}

/// A private helm home: helm reads and writes nothing of the user's.
fn helm_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("bindery-helm-home-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("helm home");
        dir
    })
}

/// helm with `args`, from the repository root, with a private helm home
/// and no cluster (no `KUBECONFIG`) unless the caller gives one.
pub fn helm_command(args: &[&str]) -> Command {
    let home = helm_home();
    let mut command = Command::new(helm_path());
    command
        .args(args)
        .current_dir(repo_root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null());
    command
}

/// Run helm with `args` from the repository root, with no cluster.
pub fn helm(args: &[&str]) -> Output {
    helm_command(args).output().expect("helm runs")
}

/// stdout and stderr of a finished command, for messages.
pub fn both(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The oldest Kubernetes version Bindery supports (Cargo.toml's
/// k8s-openapi feature); charts render for it.
pub const KUBE_VERSION: &str = "1.33.0";

/// One way to render a chart: the chart, the release, its namespace,
/// values files (repository-relative or absolute) and `--set`s.
#[derive(Clone, Debug)]
pub struct Render {
    pub chart: &'static str,
    pub release: &'static str,
    pub namespace: String,
    pub values: Vec<String>,
    pub set: Vec<String>,
}

impl Render {
    pub fn new(chart: &'static str, release: &'static str) -> Render {
        Render {
            chart,
            release,
            namespace: "shop".into(),
            values: Vec::new(),
            set: Vec::new(),
        }
    }

    pub fn values(mut self, file: impl Into<String>) -> Render {
        self.values.push(file.into());
        self
    }

    pub fn set(mut self, kv: impl Into<String>) -> Render {
        self.set.push(kv.into());
        self
    }

    pub fn namespace(mut self, ns: impl Into<String>) -> Render {
        self.namespace = ns.into();
        self
    }

    fn value_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for v in &self.values {
            args.push("--values".to_string());
            args.push(repo_path(v));
        }
        for s in &self.set {
            args.push("--set".to_string());
            args.push(s.clone());
        }
        args
    }

    /// The arguments of `helm install` for this release (a cluster's
    /// kubeconfig is the caller's to give).
    pub fn install_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "install",
            self.release,
            &repo_path(self.chart),
            "--namespace",
            &self.namespace,
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.value_args());
        args
    }

    /// The arguments of `helm upgrade` of this release to these values.
    pub fn upgrade_args(&self) -> Vec<String> {
        let mut args = self.install_args();
        args[0] = "upgrade".into();
        args
    }

    /// `helm template` (CRDs and test hooks included); the output or helm's
    /// stderr.
    pub fn template(&self, extra: &[&str]) -> Result<String, String> {
        let chart = repo_path(self.chart);
        let mut args: Vec<String> = [
            "template",
            self.release,
            &chart,
            "--namespace",
            &self.namespace,
            "--kube-version",
            KUBE_VERSION,
            "--include-crds",
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.value_args());
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
        if out.status.success() {
            Ok(String::from_utf8(out.stdout).expect("utf-8"))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `helm lint --strict`; its whole output, `Err` when it fails.
    pub fn lint(&self) -> Result<String, String> {
        let chart = repo_path(self.chart);
        let mut args: Vec<String> = [
            "lint",
            "--strict",
            &chart,
            "--namespace",
            &self.namespace,
            "--kube-version",
            KUBE_VERSION,
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.value_args());
        let out = helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// The NOTES.txt a `helm install` would print (a client-side dry run:
    /// no cluster needed).
    pub fn notes(&self) -> String {
        let mut args = self.install_args();
        args.push("--dry-run=client".into());
        let out = helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "helm {args:?}: {}", both(&out));
        let text = String::from_utf8(out.stdout).expect("utf-8");
        match text.split_once("NOTES:\n") {
            Some((_, notes)) => notes.to_string(),
            None => panic!("no NOTES in helm install --dry-run:\n{text}"),
        }
    }
}

/// The documents of a multi-document YAML stream, as JSON; empty documents
/// (comments only) are left out.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d)
                .unwrap_or_else(|e| panic!("invalid YAML: {e}\n{yaml}"));
            serde_json::to_value(v).expect("YAML as JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// `kind/name` of a manifest, for messages.
pub fn id(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Validate a YAML stream with `kubernetes-validate --strict` against each
/// of `versions`. Kinds it has no schema for (custom resources) are
/// skipped by it; `Err` lists its complaints, and also any skipped kind
/// outside `custom_groups` (a misspelt apiVersion must not pass unseen).
pub fn kubernetes_validate(
    yaml: &str,
    versions: &[&str],
    custom_groups: &[&str],
) -> Result<String, String> {
    crate::kubectl::ensure_python_deps();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("manifests.yaml");
    std::fs::write(&file, yaml).expect("write manifests");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "kubernetes_validate", "--strict"]);
    for v in versions {
        cmd.args(["--kubernetes-version", v]);
    }
    let out = cmd
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains("No module named kubernetes_validate") {
        panic!(
            "kubernetes-validate is missing: run `python3 -m pip install -r tests/requirements.txt`"
        );
    }
    let unexpected_skips: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("WARN") && l.contains("Couldn't find schema"))
        .filter(|l| {
            !custom_groups
                .iter()
                .any(|g| l.contains(&format!("api version {g}/")))
        })
        .collect();
    if !out.status.success() || text.contains("ERROR") || !unexpected_skips.is_empty() {
        Err(text)
    } else {
        Ok(text)
    }
}

/// The `bindery-operator` binary of this build (built on first use).
pub fn operator_binary() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| workspace_binary("bindery-operator"))
}

/// The `bindery-sidecar` binary of this build (built on first use).
pub fn sidecar_binary() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| workspace_binary("bindery-sidecar"))
}

/// The binary of the workspace package `package` (its binary of the same
/// name) of this build (`target/<profile>/`, next to the directory of this
/// test executable), built first by `cargo build -p PACKAGE` so that it is
/// never stale.
fn workspace_binary(package: &str) -> PathBuf {
    // target/<profile>/deps/<test executable>
    let exe = std::env::current_exe().expect("the test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("target/").to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => "dev".to_string(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "--package",
            package,
            "--bin",
            package,
            "--profile",
            &profile,
            "--target-dir",
        ])
        .arg(&target_dir)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cargo ({}) does not run: {e}", Path::new(&cargo).display()));
    assert!(
        out.status.success(),
        "cargo build -p {package} failed:\n{}",
        both(&out)
    );
    let bin = profile_dir.join(format!("{package}{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.is_file(), "{} was not built", bin.display());
    bin
}
