use serde_json::json;

use super::*;

#[test]
fn header_templates_put_the_secret_in_place() {
    assert_eq!(header_value(Some("Bearer {{secret}}"), "t0k"), "Bearer t0k");
    assert_eq!(header_value(None, "t0k"), "t0k");
    assert_eq!(
        header_value(Some("Token {{secret}}; v={{secret}}"), "a"),
        "Token a; v=a"
    );
}

#[test]
fn path_segments_are_percent_encoded() {
    assert_eq!(encode_segment("abc-1.2_~"), "abc-1.2_~");
    assert_eq!(encode_segment("a b/c?d#e%"), "a%20b%2Fc%3Fd%23e%25");
    assert_eq!(encode_segment("é"), "%C3%A9");
}

#[test]
fn urls_join_base_path_and_query() {
    let url = build_url(
        "http://api.test/v1/",
        "/projects/{project_id}/tasks",
        &[("project_id", "p 1/x")],
        &[
            ("status".to_string(), "open&done".to_string()),
            ("tag".to_string(), "a".to_string()),
        ],
    )
    .unwrap();
    assert_eq!(
        url.as_str(),
        "http://api.test/v1/projects/p%201%2Fx/tasks?status=open%26done&tag=a"
    );
}

#[test]
fn dot_segments_cannot_move_the_request() {
    for bad in ["..", ".", ""] {
        let err = build_url("http://api.test", "/p/{id}/x", &[("id", bad)], &[]).unwrap_err();
        assert_eq!(
            err,
            UrlError::PathValue {
                name: "id".into(),
                value: bad.into()
            }
        );
        assert!(err.to_string().contains("`id`"), "{err}");
    }
}

fn tool(secrets: Vec<Secret>) -> OpenApiTool {
    let doc = json!({
        "openapi": "3.1.0",
        "paths": {
            "/projects/{project_id}/tasks": {
                "post": {
                    "operationId": "add_task",
                    "parameters": [
                        {"name": "project_id", "in": "path", "schema": {"type": "string"}},
                        {"name": "notify", "in": "query", "schema": {"type": "boolean"}},
                        {"name": "tags", "in": "query", "schema": {"type": "array"}}
                    ],
                    "requestBody": {"content": {"application/json": {"schema": {
                        "type": "object", "required": ["title"],
                        "properties": {"title": {"type": "string"}, "points": {"type": "integer"}}
                    }}}}
                }
            }
        }
    });
    let (mut ops, _) = operations(&doc).unwrap();
    tool_of(ops.remove(0), secrets)
}

/// A tool for `op` on `http://api.test`, with the toolbox header
/// `x-tenant: acme` and a hidden argument for secret 1.
pub(crate) fn tool_of(op: Operation, secrets: Vec<Secret>) -> OpenApiTool {
    let mut spec = op.spec.clone();
    spec.args.push(ArgSpec {
        name: secret_arg(0),
        description: String::new(),
        required: false,
        schema: json!({"type": "string"}),
        transport: Transport::Json,
    });
    OpenApiTool {
        spec,
        op,
        shared: Arc::new(Shared {
            label: "toolbox 1 (openapi api.yaml)".into(),
            base_url: "http://api.test".into(),
            client: reqwest::Client::new(),
            max_response: 100,
            secrets,
            headers: vec![(
                HeaderName::from_static("x-tenant"),
                HeaderValue::from_static("acme"),
            )],
        }),
    }
}

fn args(pairs: &[(&str, ParamValue)]) -> CallArgs {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn a_call_builds_path_query_body_and_secret_header() {
    let t = tool(vec![
        Secret {
            value: SecretValue::Arg(secret_arg(0)),
            place: SecretPlace::Header {
                name: HeaderName::from_static("authorization"),
                template: Some("Bearer {{secret}}".into()),
            },
        },
        Secret {
            value: SecretValue::Loaded(SecretString::new("k&1")),
            place: SecretPlace::Query("api_key".into()),
        },
    ]);
    let req = t
        .request(&args(&[
            ("project_id", ParamValue::Plain(json!("p/1"))),
            ("notify", ParamValue::Plain(json!(true))),
            ("tags", ParamValue::Plain(json!(["a", "b"]))),
            ("title", ParamValue::Plain(json!("write tests"))),
            (
                "bindery-secret-1",
                ParamValue::Secret(SecretString::new("s3cr3t")),
            ),
        ]))
        .unwrap();
    assert_eq!(req.method, reqwest::Method::POST);
    assert_eq!(
        req.url.as_str(),
        "http://api.test/projects/p%2F1/tasks?notify=true&tags=a&tags=b&api_key=k%261"
    );
    assert_eq!(req.body, Some(json!({"title": "write tests"})));
    // The toolbox's plain header, then the secret one.
    assert_eq!(req.headers.len(), 2);
    assert_eq!(req.headers[0].0, "x-tenant");
    assert_eq!(req.headers[0].1.to_str().unwrap(), "acme");
    assert_eq!(req.headers[1].0, "authorization");
    assert_eq!(req.headers[1].1.to_str().unwrap(), "Bearer s3cr3t");
    assert!(req.headers[1].1.is_sensitive());
    // The request's Debug output (what a careless log line would print)
    // keeps the header value out.
    assert!(!format!("{req:?}").contains("s3cr3t"));
}

#[test]
fn a_request_stays_below_the_base_url() {
    for (base, path) in [
        ("http://api.test", "@evil.test/x"),
        ("http://api.test", "/a/../../b"),
        ("http://api.test/v1", "/../admin"),
        ("http://api.test", "/a/%2e%2e/b"),
        ("http://api.test", "\\..\\b"),
    ] {
        let err = build_url(base, path, &[], &[]).unwrap_err();
        assert!(
            matches!(err, UrlError::LeavesBase { .. }),
            "{base} {path}: {err}"
        );
        assert!(
            err.to_string().contains("does not stay below"),
            "{base} {path}: {err}"
        );
    }
    let url = build_url(
        "http://api.test/v1/",
        "/pets/{id}",
        &[("id", "a/../b")],
        &[],
    )
    .unwrap();
    assert_eq!(url.as_str(), "http://api.test/v1/pets/a%2F..%2Fb");
    for path in [
        "@h/x", "x", "/a/../b", "/a/./b", "/a/%2e", "/a\\b", "/a?b", "/a b",
    ] {
        assert!(document::unsafe_path(path).is_some(), "{path}");
    }
    assert_eq!(document::unsafe_path("/pets/{id}/tags:add"), None);
}

#[test]
fn missing_and_unknown_arguments_are_the_models_to_fix() {
    let t = tool(Vec::new());
    let err = t
        .request(&args(&[("project_id", ParamValue::Plain(json!("p")))]))
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::InvalidArguments("missing required argument `title`".into())
    );
    let err = t
        .request(&args(&[
            ("project_id", ParamValue::Plain(json!("p"))),
            ("title", ParamValue::Plain(json!("t"))),
            ("colour", ParamValue::Plain(json!("red"))),
        ]))
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::InvalidArguments("unknown argument colour".into())
    );
}

#[test]
fn an_unbound_optional_secret_is_left_out() {
    let t = tool(vec![Secret {
        value: SecretValue::Arg(secret_arg(0)),
        place: SecretPlace::Header {
            name: HeaderName::from_static("x-token"),
            template: None,
        },
    }]);
    let req = t
        .request(&args(&[
            ("project_id", ParamValue::Plain(json!(7))),
            ("title", ParamValue::Plain(json!("t"))),
        ]))
        .unwrap();
    let names: Vec<&str> = req.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["x-tenant"]);
    assert_eq!(req.url.as_str(), "http://api.test/projects/7/tasks");
}

#[test]
fn secrets_decode_as_agents_exe_decoders_do() {
    use bindery_spec::SecretDecode::{Base64, Hex};
    assert_eq!(decode_secret("c2Vjci10", Base64).unwrap(), "secr-t");
    assert_eq!(decode_secret("c2Vjci10\n", Base64).unwrap(), "secr-t");
    assert_eq!(decode_secret("736563722d74", Hex).unwrap(), "secr-t");
    let err = decode_secret("not base64!", Base64).unwrap_err();
    assert_eq!(err, DecodeError::NotBase64);
    let text = err.to_string();
    assert!(
        text.contains("not base64") && !text.contains("not base64!"),
        "{text}"
    );
    assert_eq!(decode_secret("abc", Hex).unwrap_err(), DecodeError::NotHex);
    assert!(DecodeError::NotHex.to_string().contains("in pairs"));
    assert_eq!(decode_secret("ff", Hex).unwrap_err(), DecodeError::NotUtf8);
    assert!(DecodeError::NotUtf8.to_string().contains("not UTF-8"));
}

#[test]
fn agents_exe_arguments_reach_the_same_places() {
    let native = tool(vec![]);
    let op = agents_exe_args::regroup(native.op.clone(), |_| false);
    let names: Vec<(&str, bool)> = op
        .spec
        .args
        .iter()
        .map(|a| (a.name.as_str(), a.required))
        .collect();
    assert_eq!(
        names,
        [
            ("p_project_id", true),
            ("p_notify", false),
            ("p_tags", false),
            ("b", true)
        ]
    );
    assert_eq!(
        op.spec.arg("b").unwrap().schema["properties"],
        json!({"title": {"type": "string"}, "points": {"type": "integer"}})
    );
    let t = tool_of(op, vec![]);
    let req = t
        .request(&args(&[
            ("p_project_id", ParamValue::Plain(json!("p/1"))),
            ("p_tags", ParamValue::Plain(json!(["a", "b"]))),
            ("b", ParamValue::Plain(json!({"title": "t", "points": 3}))),
        ]))
        .unwrap();
    assert_eq!(
        req.url.as_str(),
        "http://api.test/projects/p%2F1/tasks?tags=a&tags=b"
    );
    assert_eq!(req.body, Some(json!({"title": "t", "points": 3})));
    // Bindery's names are not agents-exe's arguments.
    let err = t
        .request(&args(&[("project_id", ParamValue::Plain(json!("p")))]))
        .unwrap_err();
    assert!(err.to_string().contains("project_id"), "{err}");
    let err = t
        .request(&args(&[
            ("p_project_id", ParamValue::Plain(json!("p"))),
            ("b", ParamValue::Plain(json!("title"))),
        ]))
        .unwrap_err();
    assert!(err.to_string().contains("JSON object"), "{err}");
}

#[test]
fn a_kept_argument_stays_and_the_body_cannot_set_it() {
    let native = tool(vec![]);
    let op = agents_exe_args::regroup(native.op.clone(), |a| a == "title" || a == "project_id");
    let names: Vec<&str> = op.spec.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["project_id", "p_notify", "p_tags", "title", "b"]);
    assert!(!op.spec.arg("b").unwrap().required);
    let t = tool_of(op, vec![]);
    let sent = |b: serde_json::Value| {
        t.request(&args(&[
            ("project_id", ParamValue::Plain(json!("p"))),
            ("title", ParamValue::Plain(json!("bound"))),
            ("b", ParamValue::Plain(b)),
        ]))
    };
    assert_eq!(
        sent(json!({"points": 1})).unwrap().body,
        Some(json!({"title": "bound", "points": 1}))
    );
    let err = sent(json!({"title": "mine"})).unwrap_err();
    assert!(err.to_string().contains("may not set `title`"), "{err}");
    // Nor the bound path parameter's name, in any case, nor a key the
    // document does not offer.
    for key in ["project_id", "Project_Id", "TITLE", "zzz"] {
        let err = sent(json!({ key: 1 })).unwrap_err();
        assert!(err.to_string().contains(key), "{err}");
    }
    assert_eq!(agents_exe_args::folded("TENANT_\u{130}D"), "tenantid");
    assert_eq!(agents_exe_args::folded("tenant-\u{131}d "), "tenantid");
    assert_eq!(agents_exe_args::folded("tenant\u{ad}Id"), "tenantid");
}

/// A body the document lists nothing of takes any key but a bound one, in
/// any spelling a lenient server would read as it.
#[test]
fn a_free_form_body_takes_no_bound_name_in_any_spelling() {
    let doc = json!({
        "openapi": "3.1.0",
        "paths": {"/inv": {"post": {
            "operationId": "mkInv",
            "parameters": [{"name": "tenant_id", "in": "query", "schema": {"type": "string"}}],
            "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}
        }}}
    });
    let (mut ops, _) = operations(&doc).unwrap();
    let op = agents_exe_args::regroup(ops.remove(0), |a| a == "tenant_id");
    assert_eq!(
        op.spec.arg("b").unwrap().schema["additionalProperties"],
        true
    );
    let t = tool_of(op, vec![]);
    let sent = |b: serde_json::Value| {
        t.request(&args(&[
            ("tenant_id", ParamValue::Plain(json!("acme"))),
            ("b", ParamValue::Plain(b)),
        ]))
    };
    assert!(sent(json!({"note": "n", "zz": 1})).is_ok());
    for key in [
        "tenant_id",
        "tenant-id",
        "tenantId",
        "tenant_id ",
        "tenant\u{ad}id",
        "tenant_\u{131}d",
        "TENANT_\u{130}D",
    ] {
        assert!(sent(json!({ key: "evil" })).is_err(), "{key:?}");
    }
}
