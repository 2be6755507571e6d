//! What a process the server starts (a bash tool's call, a parameter's
//! value command) inherits of the server's environment: all of it but
//! what holds a secret of the server's.

use std::ffi::OsString;

use crate::SecretString;

/// Environment variables a started process never inherits from the
/// sidecar: they hold the operator's parameter values (secrets among them)
/// and tokens.
const WITHHELD_PREFIX: &str = "BINDERY_";

/// Whether the sidecar's variable `name` (holding `value`) is kept from a
/// process it starts: the operator's parameter values (`BINDERY_*`), a
/// name that says it holds a credential (`AWS_SECRET_ACCESS_KEY`, the
/// trace exporter's headers, …), and any value holding one of the
/// server's own credentials, whatever its name (`own`:
/// [`crate::live::own`]). A tool that needs one gets it as a parameter
/// bound to an env-mode argument.
pub fn withheld(name: &str, value: &str, own: &[(String, SecretString)]) -> bool {
    name.starts_with(WITHHELD_PREFIX)
        || bindery_spec::checks::credential_env(name)
        || bindery_spec::checks::credential_value(value)
        || own
            .iter()
            .any(|(_, s)| s.expose().len() >= 4 && value.contains(s.expose()))
}

/// The server's environment less what is [`withheld`], as of now.
pub fn environment() -> Vec<(OsString, OsString)> {
    let own = crate::live::own();
    std::env::vars_os()
        .filter(|(k, v)| !withheld(&k.to_string_lossy(), &v.to_string_lossy(), &own))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_values_credentials_and_the_servers_own_are_withheld() {
        let own = vec![("owner token".to_string(), SecretString::new("tok-4f1e9c"))];
        assert!(withheld("BINDERY_PARAM_BILLING_TOKEN", "x", &own));
        assert!(withheld("BINDERY_MCP_CLIENT_TOKEN", "x", &own));
        assert!(withheld("OPENAI_API_KEY", "sk-x", &own));
        assert!(withheld("HARMLESS", "Bearer tok-4f1e9c", &own));
        assert!(!withheld("PATH", "/usr/bin:/bin", &own));
        assert!(!withheld("HOME", "/var/lib/bindery", &own));
    }
}
