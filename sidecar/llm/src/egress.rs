//! Where the sidecar's requests may go: the one policy of every HTTP
//! client that talks to a server an agent names (the model, OpenAPI and
//! PostgREST toolboxes, MCP servers over HTTP).
//!
//! A request carries credentials written for one origin (scheme, host and
//! port): an API key, a header bound to a secret parameter, a token in the
//! query string. A server that answers with a redirect must not be able to
//! send them, or the request's body, anywhere else. So:
//!
//! - a redirect is followed only to the origin of the first request, at
//!   most [`MAX_HOPS`] times, or not at all ([`Redirects::Never`]);
//! - a redirect that is not followed fails the request with a [`Refused`]
//!   that names the status and the target's origin, never its path or
//!   query (the server chose them, and they may echo a secret);
//! - no `Referer` is ever sent: it would repeat the previous URL, query
//!   string included.

use std::error::Error;
use std::fmt;

use reqwest::redirect::{Attempt, Policy};
use reqwest::{StatusCode, Url};

use bindery_spec::Redirects;

/// The most redirects one request follows.
pub const MAX_HOPS: usize = 5;

/// A client builder with the policy applied: redirects as `redirects`
/// says, no `Referer`. Every outbound client of the sidecar starts here.
pub fn client(redirects: Redirects) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .referer(false)
        .redirect(Policy::custom(move |attempt: Attempt<'_>| {
            match check(
                redirects,
                attempt.status(),
                attempt.url(),
                attempt.previous(),
            ) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(refused),
            }
        }))
}

/// Why a redirect was not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The redirect's status.
    pub status: StatusCode,
    /// The origin it pointed to (`http://host:port`), nothing more.
    pub to: String,
    pub why: Why,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// To an origin other than the first request's.
    OtherOrigin,
    /// `redirects: none`.
    NotFollowed,
    /// More than [`MAX_HOPS`] in a row.
    TooMany,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (status, to) = (&self.status, &self.to);
        match self.why {
            Why::OtherOrigin => write!(
                f,
                "the server answered {status}, a redirect to another origin ({to}); it was not followed, so no credential or body went there. If that server is the one meant to answer, point the URL at it"
            ),
            Why::NotFollowed => write!(
                f,
                "the server answered {status}, a redirect to {to}; this toolbox follows no redirects (`redirects: none`). Point the URL where the server redirects, or set `redirects: sameOrigin`"
            ),
            Why::TooMany => write!(
                f,
                "the server answered {status}, a redirect to {to}, after {MAX_HOPS} redirects already; no more are followed"
            ),
        }
    }
}

impl Error for Refused {}

/// Whether the redirect of `status` to `next`, after the request went to
/// each of `previous` (the first request first), may be followed. Pure.
pub fn check(
    redirects: Redirects,
    status: StatusCode,
    next: &Url,
    previous: &[Url],
) -> Result<(), Refused> {
    let refused = |why| Refused {
        status,
        to: origin(next),
        why,
    };
    if redirects == Redirects::Never {
        return Err(refused(Why::NotFollowed));
    }
    // `origin()` of a URL that is not http(s) is opaque and equals nothing.
    if previous
        .first()
        .is_none_or(|first| first.origin() != next.origin())
    {
        return Err(refused(Why::OtherOrigin));
    }
    // `previous` holds the first request too.
    if previous.len() > MAX_HOPS {
        return Err(refused(Why::TooMany));
    }
    Ok(())
}

/// `scheme://host[:port]` of `url`: no user, path, query or fragment.
pub fn origin(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

/// `url` as it may be shown (errors, logs): its origin and path, without
/// a user, a password, a query or a fragment, any of which may carry a
/// credential.
pub fn shown(url: &Url) -> String {
    format!("{}{}", origin(url), url.path())
}

/// [`shown`] of a URL given as text; text that is no URL is shown as
/// `<a URL that does not parse>` (it may still hold a credential).
pub fn shown_text(url: &str) -> String {
    Url::parse(url).map_or_else(|_| "<a URL that does not parse>".into(), |u| shown(&u))
}

/// The [`Refused`] somewhere in `e`'s chain of causes, if a redirect is
/// what failed the request.
pub fn refused<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a Refused> {
    let mut cause: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<Refused>() {
            return Some(r);
        }
        cause = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    const FOUND: StatusCode = StatusCode::FOUND;

    #[test]
    fn the_same_origin_is_followed_a_few_times() {
        let first = url("https://api.example:8443/v1/items?key=k");
        let next = url("https://api.example:8443/v2/items");
        assert_eq!(
            check(
                Redirects::SameOrigin,
                FOUND,
                &next,
                std::slice::from_ref(&first)
            ),
            Ok(())
        );
        let chain = vec![first; MAX_HOPS];
        assert_eq!(
            check(Redirects::SameOrigin, FOUND, &next, &chain),
            Ok(()),
            "hop {MAX_HOPS} is still followed"
        );
        let mut longer = chain.clone();
        longer.push(next.clone());
        let e = check(Redirects::SameOrigin, FOUND, &next, &longer).unwrap_err();
        assert_eq!(e.why, Why::TooMany);
    }

    #[test]
    fn another_scheme_host_or_port_is_another_origin() {
        let first = url("https://api.example/v1");
        for other in [
            "http://api.example/v1",
            "https://api.example:444/v1",
            "https://other.example/v1",
            "https://sub.api.example/v1",
            "file:///etc/passwd",
        ] {
            let e = check(
                Redirects::SameOrigin,
                FOUND,
                &url(other),
                std::slice::from_ref(&first),
            )
            .unwrap_err();
            assert_eq!(e.why, Why::OtherOrigin, "{other}");
        }
        // The default port written out is the same origin.
        assert_eq!(
            check(
                Redirects::SameOrigin,
                FOUND,
                &url("https://api.example:443/x"),
                &[first]
            ),
            Ok(())
        );
    }

    #[test]
    fn a_chain_on_one_origin_is_followed() {
        let first = url("http://a.example/");
        let back = url("http://a.example/end");
        let chain = [first, url("http://a.example/mid")];
        assert_eq!(check(Redirects::SameOrigin, FOUND, &back, &chain), Ok(()));
    }

    #[test]
    fn none_follows_nothing() {
        let first = url("http://a.example/");
        let e = check(
            Redirects::Never,
            StatusCode::TEMPORARY_REDIRECT,
            &first,
            std::slice::from_ref(&first),
        )
        .unwrap_err();
        assert_eq!(e.why, Why::NotFollowed);
        assert!(e.to_string().contains("307 Temporary Redirect"), "{e}");
        assert!(e.to_string().contains("`redirects: none`"), "{e}");
    }

    #[test]
    fn the_message_names_the_origin_only() {
        let next = url("http://user:pw-canary@evil.example:8080/steal?token=tok-canary#frag");
        let e = check(
            Redirects::SameOrigin,
            FOUND,
            &next,
            &[url("http://a.example/?key=key-canary")],
        )
        .unwrap_err();
        assert_eq!(e.to, "http://evil.example:8080");
        let text = e.to_string();
        assert!(text.contains("302 Found"), "{text}");
        assert!(text.contains("http://evil.example:8080"), "{text}");
        for hidden in ["canary", "steal", "frag", "a.example"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
    }

    #[test]
    fn refused_is_found_among_the_causes() {
        #[derive(Debug)]
        struct Outer(Refused);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("outer")
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let r = Refused {
            status: FOUND,
            to: "http://x".into(),
            why: Why::OtherOrigin,
        };
        assert_eq!(refused(&Outer(r.clone())), Some(&r));
        assert_eq!(refused(&fmt::Error), None);
    }
}
