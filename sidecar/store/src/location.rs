//! `serve --store`: which store a location names, and how to show it.
//!
//! A Postgres URL carries a password, so a location is shown only through
//! [`redact`]: in errors, logs and `Debug`.

use std::path::PathBuf;

/// The default store when `--store` (BINDERY_STORE) is absent.
pub const DEFAULT_SQLITE: &str = "data/bindery.sqlite";

/// Where sessions are kept.
#[derive(Clone, PartialEq)]
pub enum Location {
    /// An SQLite file (`sqlite://PATH` or a plain path).
    Sqlite(PathBuf),
    /// A `postgres://` or `postgresql://` URL, as given (password included).
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Location::Postgres(url) => f.debug_tuple("Postgres").field(&redact(url)).finish(),
        }
    }
}

/// Why `--store` names no store Bindery keeps sessions in; the location is
/// shown without its password.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LocationError {
    #[error("--store {0:?} names no SQLite file: give sqlite://PATH or postgres://…")]
    NoSqliteFile(String),
    #[error("--store {shown}: unknown scheme `{scheme}`; Bindery keeps sessions in sqlite://PATH (the default, {DEFAULT_SQLITE}) or postgres://USER:PASSWORD@HOST:PORT/DB")]
    UnknownScheme { shown: String, scheme: String },
}

impl Location {
    /// `None` (no `--store`) is the SQLite default.
    pub fn parse(given: Option<&str>) -> Result<Location, LocationError> {
        let Some(given) = given.map(str::trim) else {
            return Ok(Location::Sqlite(DEFAULT_SQLITE.into()));
        };
        let scheme = given.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Location::Postgres(given.to_owned())),
            Some("sqlite") | None => {
                let path = given.strip_prefix("sqlite://").unwrap_or(given);
                if path.is_empty() {
                    return Err(LocationError::NoSqliteFile(given.to_string()));
                }
                Ok(Location::Sqlite(path.into()))
            }
            Some(other) => Err(LocationError::UnknownScheme {
                shown: redact(given),
                scheme: other.to_string(),
            }),
        }
    }

    /// The location as it may be shown: without a password.
    pub fn shown(&self) -> String {
        match self {
            Location::Sqlite(p) => format!("sqlite://{}", p.display()),
            Location::Postgres(url) => redact(url),
        }
    }
}

/// A URL with its password removed: the one in `user:password@` and any
/// `password=` query parameter. Anything else is kept, so that an error
/// still says which host, port, database and user it is about.
pub fn redact(url: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match before_query.split_once("://") {
        Some((scheme, rest)) => {
            // The authority ends at the first `/`; its userinfo at its last `@`.
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let authority = match authority.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _password)) => format!("{user}:<redacted>@{host}"),
                    None => format!("{userinfo}@{host}"),
                },
                None => authority.to_owned(),
            };
            format!("{scheme}://{authority}{path}")
        }
        None => before_query.to_owned(),
    };
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=<redacted>"),
                _ => kv.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_removes_every_password_and_keeps_the_rest() {
        for (url, shown) in [
            (
                "postgres://bindery:s3cr%40t@db.example:5433/sessions?sslmode=disable",
                "postgres://bindery:<redacted>@db.example:5433/sessions?sslmode=disable",
            ),
            // An `@` left unescaped in the password: the host is after the last.
            (
                "postgresql://u:p@ss@host/db",
                "postgresql://u:<redacted>@host/db",
            ),
            (
                "postgres://host/db?user=u&password=hunter2&sslmode=require",
                "postgres://host/db?user=u&password=<redacted>&sslmode=require",
            ),
            ("postgres://u@host:5432", "postgres://u@host:5432"),
            ("postgres://host", "postgres://host"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn a_location_is_sqlite_by_default_and_postgres_by_scheme() {
        assert_eq!(
            Location::parse(None).unwrap(),
            Location::Sqlite(DEFAULT_SQLITE.into())
        );
        assert_eq!(
            Location::parse(Some("sqlite:///var/lib/b.db")).unwrap(),
            Location::Sqlite("/var/lib/b.db".into())
        );
        assert_eq!(
            Location::parse(Some("rel/b.db")).unwrap(),
            Location::Sqlite("rel/b.db".into())
        );
        for url in ["postgres://u:pw@h/db", "PostgreSQL://u:pw@h/db"] {
            let loc = Location::parse(Some(url)).unwrap();
            assert_eq!(loc, Location::Postgres(url.into()));
            assert!(!format!("{loc:?}").contains("pw"));
            assert!(!loc.shown().contains("pw"));
        }
        let err = Location::parse(Some("mysql://u:pw@h/db")).unwrap_err();
        assert_eq!(
            err,
            LocationError::UnknownScheme {
                shown: "mysql://u:<redacted>@h/db".into(),
                scheme: "mysql".into()
            }
        );
        let err = err.to_string();
        assert!(err.contains("unknown scheme `mysql`"), "{err}");
        assert!(!err.contains("pw@"), "{err}");
        assert_eq!(
            Location::parse(Some("sqlite://")),
            Err(LocationError::NoSqliteFile("sqlite://".into()))
        );
    }
}
