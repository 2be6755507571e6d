//! Mutual TLS between the replicas of a tenant (`serve --peer-tls-dir`).
//!
//! Every replica has the same certificate, issued by the tenant's own CA
//! for one DNS name (`--peer-tls-name`, the tenant's Service name). A
//! replica takes forwards on its peer port only from a client presenting a
//! certificate the tenant CA issued, and forwards to a peer's pod address
//! while checking that the peer's certificate chains to the tenant CA and
//! names that one DNS name (the pod's IP is on no certificate). The files
//! are a `kubernetes.io/tls` Secret's, plus the CA: `ca.crt`, `tls.crt`,
//! `tls.key`, all PEM.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// What `--peer-tls-dir` gives: the server's side for the peer port, the
/// client's for forwards.
pub struct PeerTls {
    pub server: Arc<ServerConfig>,
    pub client: ClientConfig,
}

/// What is wrong with `--peer-tls-dir`'s files or `--peer-tls-name`.
#[derive(Debug, thiserror::Error)]
pub enum PeerTlsError {
    /// A file (`ca.crt`, `tls.crt`, `tls.key`) of the directory, and why.
    #[error("--peer-tls-dir {}: {problem}", path.display())]
    File { path: PathBuf, problem: String },
    #[error("--peer-tls-dir {} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    /// The certificate and the key do not go together.
    #[error("--peer-tls-dir {} and tls.key: {problem}", path.display())]
    Pair { path: PathBuf, problem: String },
    #[error("--peer-tls-name `{0}` is not a DNS name (the one on the replicas' certificate, such as acme.tenants.svc)")]
    Name(String),
    #[error("the TLS library refused this server's protocol versions: {0}")]
    Protocol(rustls::Error),
}

/// The files of `dir`, checked: an error names the file and what is wrong.
pub fn load(dir: &Path, name: &str) -> Result<PeerTls, PeerTlsError> {
    let file = |f: &str| dir.join(f);
    let bad = |f: &str, problem: &dyn std::fmt::Display| PeerTlsError::File {
        path: file(f),
        problem: problem.to_string(),
    };
    let certs = |f: &str| -> Result<Vec<CertificateDer<'static>>, PeerTlsError> {
        let certs = CertificateDer::pem_file_iter(file(f))
            .map_err(|e| bad(f, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(f, &e))?;
        if certs.is_empty() {
            return Err(PeerTlsError::NoCertificate { path: file(f) });
        }
        Ok(certs)
    };
    let ca = certs("ca.crt")?;
    let chain = certs("tls.crt")?;
    let key = || {
        PrivateKeyDer::from_pem_file(file("tls.key")).map_err(|e| {
            bad(
                "tls.key",
                &format!("{e} (a PEM private key: PKCS#8, PKCS#1 or SEC1)"),
            )
        })
    };
    let pair = |e: rustls::Error| PeerTlsError::Pair {
        path: file("tls.crt"),
        problem: e.to_string(),
    };
    let mut roots = RootCertStore::empty();
    for c in ca {
        roots.add(c).map_err(|e| bad("ca.crt", &e))?;
    }
    let roots = Arc::new(roots);
    let server_name =
        ServerName::try_from(name.to_string()).map_err(|_| PeerTlsError::Name(name.to_string()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());

    let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| bad("ca.crt", &e))?;
    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(PeerTlsError::Protocol)?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain.clone(), key()?)
        .map_err(pair)?;

    let servers = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| bad("ca.crt", &e))?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(PeerTlsError::Protocol)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(OneName {
            inner: servers,
            name: server_name,
        }))
        .with_client_auth_cert(chain, key()?)
        .map_err(pair)?;
    Ok(PeerTls {
        server: Arc::new(server),
        client,
    })
}

/// The usual check of a server's certificate (chain to the tenant CA,
/// validity, signatures), against the one name all replicas share instead
/// of the address connected to.
#[derive(Debug)]
struct OneName {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for OneName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _connected_to: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        false
    }
}
