//! A person's consent to an authorization-code grant: shown the
//! authorization URL, they sign in and allow access, and the authorization
//! server sends their browser to the redirect URI with a code.

use async_trait::async_trait;

/// Gets a person's consent: given the authorization URL, returns the URL
/// the authorization server redirected them to (with `code` and `state`),
/// or why there is none.
#[async_trait]
pub trait Consent: Send + Sync {
    async fn redirected(&self, toolbox: &str, authorization_url: &str) -> Result<String, String>;
}

/// The command line's way, for a machine without a browser: the URL is
/// printed on stderr, and the person pastes the URL they were redirected to
/// on stdin (a browser shows it in its address bar, even when nothing
/// answers there).
pub struct Terminal;

#[async_trait]
impl Consent for Terminal {
    async fn redirected(&self, toolbox: &str, authorization_url: &str) -> Result<String, String> {
        eprintln!(
            "MCP server `{toolbox}` needs your consent. Open this URL, sign in and allow access:\n  {authorization_url}\nThen paste the URL your browser was sent to (its address bar) and press Enter:"
        );
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot read standard input: {e}"))?;
        let line = line.trim();
        if line.is_empty() {
            return Err("nothing was pasted on standard input".into());
        }
        Ok(line.to_string())
    }
}
