//! The tokens a server is started with (`--owner-token-file`, the MCP
//! client's and the approver's): kept as a digest, compared in constant
//! time, and the keys derived from the owner's. Its own module, so that
//! the state every handler shares holds them without depending on the
//! extractor that reads that state (`auth`).

use sha2::{Digest, Sha256};

use bindery_params::secret::constant_time_eq;

pub struct OwnerToken {
    digest: [u8; 32],
}

impl OwnerToken {
    pub fn new(token: &str) -> Self {
        OwnerToken {
            digest: Sha256::digest(token.trim().as_bytes()).into(),
        }
    }

    /// The key continuation tokens derive from: servers that share the
    /// owner token (replicas) show the same tokens.
    pub fn continuation_key(&self) -> [u8; 32] {
        Sha256::new()
            .chain_update(b"bindery continuation tokens\0")
            .chain_update(self.digest)
            .finalize()
            .into()
    }

    /// The key the servers sharing the owner token (replicas) sign the
    /// requests they forward to each other with (`api/peers.rs`).
    pub fn peer_key(&self) -> [u8; 32] {
        Sha256::new()
            .chain_update(b"bindery peer request signatures\0")
            .chain_update(self.digest)
            .finalize()
            .into()
    }

    /// Whether `presented` is this token (in constant time).
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let d: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        constant_time_eq(&d, &self.digest)
    }
}
