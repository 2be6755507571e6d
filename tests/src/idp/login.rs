//! The person at the browser, headless: open the authorization URL, fill
//! in Keycloak's login form, and take the redirect back to the client
//! (with its `code`) without following it. Cookies are carried by hand
//! between the two requests (Keycloak ties the form to its session cookie).

use std::fmt;

use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::StatusCode;

/// Why a login did not end in a redirect to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginError {
    /// What was asked (the authorization URL or the form).
    pub step: &'static str,
    /// The answer's status.
    pub status: u16,
    /// What the page said (its error message, or its title).
    pub says: String,
}

impl fmt::Display for LoginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} answered {} instead of a redirect to the client: {}",
            self.step, self.status, self.says
        )
    }
}

impl std::error::Error for LoginError {}

/// `name=value` of each `Set-Cookie` of `response`.
fn cookies(response: &reqwest::Response) -> Vec<String> {
    response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .map(|v| v.trim().to_string())
        .collect()
}

/// The `action` of the login form (`id="kc-form-login"`), unescaped.
fn form_action(html: &str) -> Option<String> {
    let form = &html[html.find("id=\"kc-form-login\"")?..];
    // The attribute may come before the id: look back to the tag's start.
    let tag_start = html[..html.len() - form.len()].rfind('<')?;
    let tag_end = tag_start + html[tag_start..].find('>')?;
    let tag = &html[tag_start..tag_end];
    let start = tag.find("action=\"")? + "action=\"".len();
    let end = start + tag[start..].find('"')?;
    Some(tag[start..end].replace("&amp;", "&"))
}

/// The page's error message (Keycloak's `input-error` or feedback text),
/// else its title.
pub(crate) fn page_message(html: &str) -> String {
    for marker in ["id=\"input-error", "kc-feedback-text", "<title"] {
        if let Some(at) = html.find(marker) {
            let rest = &html[at..];
            if let Some(open) = rest.find('>') {
                let text = &rest[open + 1..];
                let text = text[..text.find('<').unwrap_or(text.len())].trim();
                if !text.is_empty() {
                    return text.replace("&#39;", "'").replace("&quot;", "\"");
                }
            }
        }
    }
    html.chars().take(200).collect()
}

/// Log `user` in at `authorization_url`: the URL Keycloak redirects the
/// browser back to (the client's redirect URI with `code` and `state`, or
/// with `error` when the server refuses the request after the login).
/// `http` must not follow redirects.
pub(crate) async fn login(
    http: &reqwest::Client,
    authorization_url: &str,
    user: &str,
    password: &str,
) -> Result<String, LoginError> {
    let page = http
        .get(authorization_url)
        .send()
        .await
        .map_err(|e| LoginError {
            step: "authorization URL",
            status: 0,
            says: e.to_string(),
        })?;
    let status = page.status();
    let jar = cookies(&page);
    if status.is_redirection() {
        // Refused before any login (an error redirect to the client).
        return Ok(location(&page));
    }
    let html = page.text().await.unwrap_or_default();
    let action = match (status, form_action(&html)) {
        (StatusCode::OK, Some(action)) => action,
        _ => {
            return Err(LoginError {
                step: "authorization URL",
                status: status.as_u16(),
                says: page_message(&html),
            })
        }
    };
    let answer = http
        .post(&action)
        .header(COOKIE, jar.join("; "))
        .form(&[
            ("username", user),
            ("password", password),
            ("credentialId", ""),
        ])
        .send()
        .await
        .map_err(|e| LoginError {
            step: "login form",
            status: 0,
            says: e.to_string(),
        })?;
    if answer.status().is_redirection() {
        return Ok(location(&answer));
    }
    let status = answer.status().as_u16();
    Err(LoginError {
        step: "login form",
        status,
        says: page_message(&answer.text().await.unwrap_or_default()),
    })
}

fn location(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_finds_the_forms_action_and_the_pages_message() {
        let html = r#"<html><head><title>Sign in to r</title></head><body>
            <form id="kc-form-login" onsubmit="x" action="http://127.0.0.1:1/realms/r/login-actions/authenticate?session_code=a&amp;execution=b" method="post">
            <span id="input-error" class="x" aria-live="polite">
                Invalid username or password.
            </span></form></body></html>"#;
        assert_eq!(
            form_action(html).as_deref(),
            Some(
                "http://127.0.0.1:1/realms/r/login-actions/authenticate?session_code=a&execution=b"
            )
        );
        assert_eq!(page_message(html), "Invalid username or password.");
        let reversed = r#"<form action="/a?x=1&amp;y=2" id="kc-form-login">"#;
        assert_eq!(form_action(reversed).as_deref(), Some("/a?x=1&y=2"));
        assert_eq!(form_action("<form id=\"other\">"), None);
        assert_eq!(
            page_message("<title>We are sorry...</title>"),
            "We are sorry..."
        );
    }
}
