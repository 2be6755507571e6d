//! The chat page at `/`: its files are served with a strict content
//! security policy and no cookies. In a real browser (`browser.rs`, with
//! the `browser-tests` feature): Debian's chromium driven by
//! playwright-core, as `tests/setup.sh` installs them.

use crate::common::{tool_then_answer, World};

#[cfg(feature = "browser-tests")]
mod browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_embedded_with_a_strict_policy_and_no_cookies() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    for (path, media_type) in [
        ("/", "text/html"),
        ("/chat.js", "text/javascript"),
        ("/chat.css", "text/css"),
    ] {
        // No token: the page holds no data.
        let r = api
            .http
            .get(format!("{}{path}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let header = |name: &str| {
            r.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        assert!(header("content-type").starts_with(media_type), "{path}");
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert!(r.headers().get("set-cookie").is_none(), "{path}");
        let body = r.text().await.unwrap();
        if path == "/" {
            // Scripts only from files, no inline style or handler.
            assert!(!body.contains("<script>"), "inline script");
            assert!(!body.contains(" style="), "inline style");
            let handler = body.split(" on").skip(1).find(|rest| {
                let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
                !name.is_empty() && rest[name.len()..].starts_with('=')
            });
            assert!(handler.is_none(), "an inline event handler: on{handler:?}");
            assert!(!body.contains("http"), "a third-party URL");
        }
    }
}
