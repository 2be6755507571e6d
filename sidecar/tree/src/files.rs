//! Reading agent files: Bindery's Kubernetes-style YAML/JSON documents and
//! agents-exe's JSON files. Errors name the file, the field's path and,
//! where the parser knows it, the line.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use bindery_spec::agents_exe::{ignored_path, AgentFile};
use bindery_spec::{AgentDocument, AgentSpec, API_VERSION, KIND};

/// One agent read from a file.
#[derive(Debug)]
pub struct ParsedAgent {
    pub name: String,
    pub spec: AgentSpec,
    /// agents-exe's `toolDirectory` (helper agent files), still to list.
    pub tool_directory: Option<String>,
    /// The file is in agents-exe's format.
    pub agents_exe: bool,
    /// Fields of an agents-exe file Bindery does not read, by their path
    /// in the file (`contents.mcpServers[0].contents.fooBar`). Always empty
    /// for Bindery's own format, which refuses unknown fields.
    pub ignored: Vec<String>,
    /// What is wrong with an agents-exe file that did not stop its
    /// reading (a bad entry, a refused kind or field): the rest is loaded
    /// and checked all the same, so every problem shows at once.
    pub errors: Vec<String>,
}

/// Why a file's agents could not be read. Each names the file's place
/// (a document, a field's path, a toolbox entry) in the file's own words.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// What is wrong inside the file at `path`.
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<ParseError>,
    },
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("document {document}: not valid YAML: {source}")]
    Yaml {
        document: usize,
        source: serde_yaml::Error,
    },
    /// What is wrong in the `document`th document of a YAML file.
    #[error("document {document}: {error}")]
    InDocument {
        document: usize,
        error: Box<ParseError>,
    },
    /// A field's value does not read (`path` is `.` for the whole file).
    #[error("{}", at_path(path, message))]
    Field { path: String, message: String },
    #[error("holds no agent")]
    NoAgent,
    #[error("is `{api_version}` `{kind}`; an agent file holds `apiVersion: {API_VERSION}`, `kind: {KIND}`")]
    NotAnAgent { api_version: String, kind: String },
    /// agents-exe's toolbox kept in a file of its own could not be put in place.
    #[error("contents.{list}[{index}] (`{tag}`): {problem}")]
    OnDisk {
        list: &'static str,
        index: usize,
        tag: &'static str,
        problem: OnDiskProblem,
    },
}

/// What is wrong with an agents-exe toolbox kept in a file of its own.
#[derive(Debug, thiserror::Error)]
pub enum OnDiskProblem {
    #[error("`contents` must be the path of the toolbox's file")]
    NotAPath,
    #[error("reads a file of the server; give the toolbox inline (`{inline}`)")]
    NoDirectory { inline: &'static str },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{} must hold the toolbox's object ({{\"SpecUrl\": …}})", path.display())]
    NotAnObject { path: PathBuf },
}

/// Every agent in one file (a YAML file may hold several documents).
pub fn parse_file(path: &Path) -> Result<Vec<ParsedAgent>, ParseError> {
    let text = std::fs::read_to_string(path).map_err(|source| ParseError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_text_in(&text, Some(dir_of(path))).map_err(|e| ParseError::InFile {
        path: path.to_path_buf(),
        error: Box::new(e),
    })
}

/// The directory a file is in. A bare file name (`agent.json`) has the
/// empty path for parent, which no program can be started in and no
/// path joined to: it is the working directory.
pub fn dir_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// agents-exe's `OpenAPIServerOnDisk` / `PostgRESTServerOnDisk`: the
/// toolbox's contents in a file of their own (`"contents": "pets.json"`,
/// relative to the agent file's directory, as agents-exe reads it), put
/// in place as `OpenAPIServer` / `PostgRESTServer`. Without a directory
/// (an agent sent over the API) such a file is not read: refused.
fn inline_on_disk(doc: &mut serde_json::Value, dir: Option<&Path>) -> Result<(), ParseError> {
    for (list, on_disk, inline) in [
        ("openApiToolboxes", "OpenAPIServerOnDisk", "OpenAPIServer"),
        (
            "postgrestToolboxes",
            "PostgRESTServerOnDisk",
            "PostgRESTServer",
        ),
    ] {
        let Some(entries) = doc
            .get_mut("contents")
            .and_then(|c| c.get_mut(list))
            .and_then(|l| l.as_array_mut())
        else {
            continue;
        };
        for (i, entry) in entries.iter_mut().enumerate() {
            if entry.get("tag").and_then(|t| t.as_str()) != Some(on_disk) {
                continue;
            }
            let refuse = |problem| ParseError::OnDisk {
                list,
                index: i,
                tag: on_disk,
                problem,
            };
            let Some(file) = entry.get("contents").and_then(|c| c.as_str()) else {
                return Err(refuse(OnDiskProblem::NotAPath));
            };
            let Some(dir) = dir else {
                return Err(refuse(OnDiskProblem::NoDirectory { inline }));
            };
            let path = dir.join(file);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(source) => return Err(refuse(OnDiskProblem::Read { path, source })),
            };
            let contents: serde_json::Value = match serde_json::from_str(&text) {
                Ok(contents) => contents,
                Err(source) => return Err(refuse(OnDiskProblem::Json { path, source })),
            };
            if !contents.is_object() {
                return Err(refuse(OnDiskProblem::NotAnObject { path }));
            }
            *entry = serde_json::json!({"tag": inline, "contents": contents});
        }
    }
    Ok(())
}

/// Why an agents-exe field Bindery does not read (at `path`) may not be
/// dropped: it would restrict which calls exist, authenticate them, or
/// change what they send. Bindery reads each under agents-exe's spelling
/// (`Filter`, `Token`, …); one written otherwise is ignored by agents-exe
/// too, and the author surely meant it.
fn guards_a_call(path: &str) -> Option<String> {
    let http = [
        "openApiToolboxes[",
        "postgrestToolboxes[",
        "postgRESTToolboxes[",
    ];
    let field = path.rsplit('.').next().unwrap_or(path);
    // Anywhere: a binding pins what the model may not choose (a tenant,
    // a token); a helper's `with` pins its parameters.
    let mut guards = vec![
        ("Bindings", "which arguments are pinned to a parameter or a literal: without it the model would choose them"),
        ("parameters", "the parameters bindings pin arguments to"),
    ];
    if path.contains("extraAgents[") {
        guards.push(("with", "the helper's parameters its caller pins"));
    }
    if http.iter().any(|t| path.contains(t)) {
        guards.extend([
            ("Filter", "which operations become tools: without it every operation (a DELETE among them) would be one"),
            ("Token", "the bearer token of every request: without it the API would be called unauthenticated"),
            ("Headers", "the headers of every call"),
            ("Secrets", "the credentials of every request"),
            ("AllowedMethods", "which methods become tools"),
        ]);
    }
    // Any spelling close to a guarding field's (its case, a stray `s` or
    // space, a typo): the author meant that field.
    let written: String = field
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    let (spelled, why) = guards.into_iter().find(|(g, _)| {
        let g = g.to_ascii_lowercase();
        written == g || edit_distance(&written, &g) <= if g.len() > 5 { 2 } else { 1 }
    })?;
    Some(format!(
        "{path}: this field is not read as written (agents-exe, and Bindery, read `{spelled}`, which sets {why}); write `{spelled}`"
    ))
}

/// Levenshtein distance between two short ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Every agent in one text, read without a directory: an agents-exe
/// toolbox kept in a file of its own is refused.
pub fn parse_text(text: &str) -> Result<Vec<ParsedAgent>, ParseError> {
    parse_text_in(text, None)
}

fn parse_text_in(text: &str, dir: Option<&Path>) -> Result<Vec<ParsedAgent>, ParseError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        let mut value: serde_json::Value = serde_json::from_str(text).map_err(ParseError::Json)?;
        if value.get("tag").is_some() {
            inline_on_disk(&mut value, dir)?;
            let mut ignored = Vec::new();
            // A tagged object read with its `contents` before its `tag`
            // is buffered whole by serde, and the fields it skips inside
            // go unseen: a misspelt `filter` would load without a word.
            // Read with every `tag` first, each skipped field is seen.
            let text = bindery_spec::agents_exe::tag_first(&value);
            let de = &mut serde_json::Deserializer::from_str(&text);
            let file: AgentFile =
                serde_path_to_error::deserialize(serde_ignored::Deserializer::new(de, &mut |p| {
                    ignored.push(ignored_path(&p))
                }))
                .map_err(|e| field_error(e.path().to_string(), e.inner()))?;
            let AgentFile::OpenAIAgentDescription(desc) = file;
            let converted = desc.convert();
            ignored.extend(converted.ignored);
            // A field that restricts, authenticates or changes a call is
            // honoured or refused, never warned away.
            let mut errors = converted.errors;
            errors.extend(ignored.iter().filter_map(|p| guards_a_call(p)));
            return Ok(vec![ParsedAgent {
                name: converted.name,
                spec: converted.spec,
                tool_directory: converted.tool_directory,
                agents_exe: true,
                ignored,
                errors,
            }]);
        }
        let doc: AgentDocument = from_json(text)?;
        return Ok(vec![native(doc)?]);
    }
    // Each document is read as a plain JSON value first, so that the typed
    // pass can go through serde_path_to_error and name the field's path
    // (and so that enums read as one-key maps, as in JSON).
    let mut agents = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(de).map_err(|source| ParseError::Yaml {
            document: i + 1,
            source,
        })?;
        if value.is_null() {
            continue; // an empty document between `---` lines
        }
        let doc: AgentDocument = from_yaml_value(value).map_err(|e| ParseError::InDocument {
            document: i + 1,
            error: Box::new(e),
        })?;
        agents.push(native(doc)?);
    }
    if agents.is_empty() {
        return Err(ParseError::NoAgent);
    }
    Ok(agents)
}

fn native(doc: AgentDocument) -> Result<ParsedAgent, ParseError> {
    if doc.api_version != API_VERSION || doc.kind != KIND {
        return Err(ParseError::NotAnAgent {
            api_version: doc.api_version,
            kind: doc.kind,
        });
    }
    Ok(ParsedAgent {
        name: doc.metadata.name,
        spec: doc.spec,
        tool_directory: None,
        agents_exe: false,
        ignored: Vec::new(),
        errors: Vec::new(),
    })
}

fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| field_error(e.path().to_string(), e.inner()))
}

fn from_yaml_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ParseError> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| field_error(e.path().to_string(), e.inner()))
}

fn field_error(path: String, err: &dyn std::fmt::Display) -> ParseError {
    ParseError::Field {
        path,
        message: err.to_string(),
    }
}

fn at_path(path: &str, message: &str) -> String {
    if path == "." || path.is_empty() {
        message.to_string()
    } else {
        format!("at `{path}`: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guarding_field_is_known_in_any_near_spelling() {
        for field in [
            "filter",
            "Filters",
            "Filter ",
            "FILTER",
            "Fliter",
            "tokens",
            "header",
            "allowed_methods",
        ] {
            let path = format!("contents.openApiToolboxes[0].contents.{field}");
            assert!(guards_a_call(&path).is_some(), "{field}");
        }
        for field in ["Activation", "unusedTimeout", "Name", "tag"] {
            let path = format!("contents.openApiToolboxes[0].contents.{field}");
            assert!(guards_a_call(&path).is_none(), "{field}");
        }
        // A binding pins what the model may not choose, in any entry.
        for path in [
            "contents.bashToolboxes[0].contents.BINDINGS",
            "contents.bashToolboxes[1].contents.binding",
            "contents.Bindngs",
            "contents.Parameters",
            "contents.extraAgents[0].With",
            "contents.mcpServers[0].contents.bindings",
        ] {
            assert!(guards_a_call(path).is_some(), "{path}");
        }
        assert!(guards_a_call("contents.bashToolboxes[0].contents.Root2").is_none());
    }

    /// An agent sent as text (a stored agent) has no directory: a toolbox
    /// kept in a file is not read from the server's.
    #[test]
    fn an_on_disk_toolbox_without_a_directory_is_refused() {
        let text = r#"{"tag": "OpenAIAgentDescription", "contents": {"slug": "a", "modelUrl": "u",
            "modelName": "m", "openApiToolboxes": [{"tag": "OpenAPIServerOnDisk", "contents": "/etc/x.json"}]}}"#;
        let err = parse_text(text).unwrap_err();
        assert!(
            matches!(
                &err,
                ParseError::OnDisk {
                    problem: OnDiskProblem::NoDirectory { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("reads a file of the server"),
            "{err}"
        );
    }
}
