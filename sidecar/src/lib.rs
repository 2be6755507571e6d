//! Bindery's agent server: agent definitions, parameters, bindings, tools,
//! the LLM loop and the session API.

pub mod api;
#[cfg(feature = "cli")]
pub mod cli;

// The agent definition and its diagnostics live in the `bindery-spec` crate,
// which the operator shares; these keep their paths in this crate.
pub use bindery_bindings as bindings;
pub use bindery_llm as llm;
pub use bindery_metrics as metrics;
pub use bindery_params as params;
pub use bindery_reaper as reaper;
pub use bindery_session as session;
pub use bindery_spec as spec;
pub use bindery_spec::diagnostic;
pub use bindery_tools as tools;
pub use bindery_tree as tree;
pub use bindery_tree::report;

/// The layer rule of ARCHITECTURE.md, checked: a module may name
/// (`crate::…`) only modules of its own layer or below.
#[cfg(test)]
mod layers {
    use std::path::Path;

    /// Bottom first. `diagnostic` and `report` are shared leaf modules.
    const LAYERS: &[&[&str]] = &[
        &["spec", "diagnostic", "reaper"],
        &["params", "metrics", "llm"],
        &["tools"],
        &["bindings"],
        &["tree", "report"],
        &["session"],
        &["api"],
        &["cli"],
    ];

    fn layer(module: &str) -> Option<usize> {
        LAYERS.iter().position(|l| l.contains(&module))
    }

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The higher layers file `rel` (a path under `src/`) names.
    fn climbs(rel: &str, text: &str) -> Vec<String> {
        let own = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let Some(own_layer) = layer(own) else {
            return Vec::new(); // lib.rs, main.rs
        };
        let mut out = Vec::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                let target: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    !target.is_empty(),
                    "{rel}: `crate::{{…}}` hides what it imports: {line}"
                );
                if layer(&target).is_some_and(|t| t > own_layer) {
                    out.push(target);
                }
            }
        }
        out
    }

    #[test]
    fn the_check_sees_a_climb() {
        let text = "use crate::params::Values;\nuse crate::session::runner; // why\n";
        assert_eq!(climbs("tools/bash.rs", text), ["session"]);
        assert!(climbs("api/server.rs", text).is_empty());
        // Comments do not count.
        assert!(climbs("spec/mod.rs", "//! see crate::api\n").is_empty());
    }

    #[test]
    fn no_import_climbs_a_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut found = Vec::new();
        for file in &files {
            let rel = file
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(file).unwrap();
            found.extend(climbs(&rel, &text).into_iter().map(|t| (rel.clone(), t)));
        }
        assert!(
            found.is_empty(),
            "imports that climb a layer (see ARCHITECTURE.md): {found:?}"
        );
    }
}
