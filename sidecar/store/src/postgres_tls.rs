//! TLS to PostgreSQL with rustls, as libpq's `sslmode` says:
//!
//! - `require`: encrypted; the server's certificate is not checked (as
//!   libpq without a root certificate), so it guards against listening,
//!   not against a server that pretends.
//! - `verify-full`: encrypted, the certificate chains to a trusted root and
//!   names the host. The roots are `sslrootcert=FILE` (PEM) when given,
//!   else the system's (rustls-platform-verifier; `SSL_CERT_FILE` applies).
//!
//! No channel binding: SCRAM authenticates without it, as libpq's default
//! `channel_binding=prefer` does when the client offers none.
//!
//! Why this and not a connector crate: `tokio-postgres-rustls` is
//! unmaintained (its maintained fork, `tokio-postgres-rustls-improved`,
//! says so), and both compute channel binding with `x509-cert` and `ring`
//! digests, a second crypto stack beside the aws-lc-rs every other client
//! here uses. Neither knows `sslmode`: the `require` verifier and the
//! `sslrootcert` roots below would still be ours. What a crate would
//! replace is the `MakeTlsConnect` glue, some 60 lines of this file.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::Socket;

/// How to check the server's certificate.
#[derive(Clone, Debug, PartialEq)]
pub enum Verify {
    /// `sslmode=require`: not at all.
    Nothing,
    /// `sslmode=verify-full`: chain and host name, against these roots
    /// (`sslrootcert`) or the system's.
    Full { root_file: Option<String> },
}

/// What is wrong with the roots a connection's server is checked against.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    /// `sslrootcert`'s file, and why it does not read.
    #[error("sslrootcert {file}: {problem}")]
    File { file: String, problem: String },
    #[error("sslrootcert {file} holds no certificate")]
    Empty { file: String },
    #[error("the system's root certificates: {0}")]
    System(rustls::Error),
    #[error("the TLS library refused its protocol versions: {0}")]
    Protocol(rustls::Error),
}

/// A client config for `verify`; errors say what is wrong with the roots.
pub fn client_config(verify: &Verify) -> Result<Arc<ClientConfig>, RootsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(RootsError::Protocol)?;
    let config = match verify {
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCertificateCheck(provider)))
            .with_no_client_auth(),
        Verify::Full {
            root_file: Some(file),
        } => {
            let bad = |problem: &dyn std::fmt::Display| RootsError::File {
                file: file.clone(),
                problem: problem.to_string(),
            };
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(Path::new(file)).map_err(|e| bad(&e))? {
                let cert = cert.map_err(|e| bad(&e))?;
                roots.add(cert).map_err(|e| bad(&e))?;
            }
            if roots.is_empty() {
                return Err(RootsError::Empty { file: file.clone() });
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Verify::Full { root_file: None } => {
            let verifier =
                rustls_platform_verifier::Verifier::new(provider).map_err(RootsError::System)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        }
    };
    Ok(Arc::new(config))
}

/// `sslmode=require`: any certificate, but the handshake's signatures are
/// still checked (so the session keys are the server's).
#[derive(Debug)]
struct NoCertificateCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCertificateCheck {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// tokio-postgres's TLS hook. `None` when TLS is off (`sslmode=disable`),
/// where tokio-postgres never asks for a handshake.
#[derive(Clone, Debug)]
pub struct Tls(pub Option<Arc<ClientConfig>>);

pub struct Connect {
    config: Option<Arc<ClientConfig>>,
    host: String,
}

impl MakeTlsConnect<Socket> for Tls {
    type Stream = Stream;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<Connect> {
        Ok(Connect {
            config: self.0.clone(),
            host: host.to_owned(),
        })
    }
}

impl TlsConnect<Socket> for Connect {
    type Stream = Stream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(async move {
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS is off (sslmode=disable)"))?;
            let name = ServerName::try_from(self.host.clone())
                .map_err(|e| io::Error::other(format!("host {}: {e}", self.host)))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, socket)
                .await?;
            Ok(Stream(Box::new(stream)))
        })
    }
}

/// An established TLS connection.
pub struct Stream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl TlsStream for Stream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
