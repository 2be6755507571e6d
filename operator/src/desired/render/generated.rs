//! The Secrets the operator makes for a tenant when they are absent, once:
//! the owner token and the replicas' peer certificate.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::meta;
use crate::desired::Inputs;
use crate::names::{owner_token_secret, peer_tls_secret, workload, OWNER_FILE};

/// The owner-token Secret a tenant gets when it names none (created once,
/// never overwritten: the token is the caller's to keep).
pub(crate) fn generated_owner_token(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    token: &str,
) -> k8s_openapi::api::core::v1::Secret {
    let tenant = inputs.tenant_name();
    k8s_openapi::api::core::v1::Secret {
        metadata: meta(owner_token_secret(tenant), inputs, owner),
        string_data: Some(BTreeMap::from([(
            OWNER_FILE.to_string(),
            token.to_string(),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The DNS names of the tenant's Service, which its replicas' shared
/// certificate carries.
pub(crate) fn peer_dns_names(inputs: &Inputs<'_>) -> Vec<String> {
    let svc = workload(inputs.tenant_name());
    let ns = inputs
        .tenant
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    vec![
        svc.clone(),
        format!("{svc}.{ns}"),
        format!("{svc}.{ns}.svc"),
        format!("{svc}.{ns}.svc.{}", inputs.config.cluster_domain),
    ]
}

/// The one name a replica checks on a peer's certificate.
pub(crate) fn peer_tls_name(inputs: &Inputs<'_>) -> String {
    peer_dns_names(inputs).swap_remove(2)
}

/// The peer certificate's Secret of a tenant on Postgres (created once,
/// never overwritten): a CA of the tenant's own and one certificate,
/// issued by it for the tenant's Service names, that every replica
/// presents as server and as client. The CA's key is not kept: a new
/// certificate is had by deleting the Secret (the pods roll with the new
/// one).
pub(crate) fn generated_peer_tls(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    now: jiff::Timestamp,
) -> Result<k8s_openapi::api::core::v1::Secret, rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let tenant = inputs.tenant_name();
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    // From yesterday (a node whose clock is behind), for ten years.
    let since = today.yesterday().unwrap_or(today);
    let from = rcgen::date_time_ymd(
        i32::from(since.year()),
        since.month() as u8,
        since.day() as u8,
    );
    let until = rcgen::date_time_ymd(
        i32::from(today.year()) + 10,
        today.month() as u8,
        today.day().min(28) as u8,
    );

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{tenant} replicas CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = from;
    ca.not_after = until;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let names = peer_dns_names(inputs);
    let mut leaf = CertificateParams::new(names.clone())?;
    leaf.distinguished_name
        .push(DnType::CommonName, names[2].clone());
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf.not_before = from;
    leaf.not_after = until;
    let cert = leaf.signed_by(&key, &issuer)?;

    let file = |text: String| k8s_openapi::ByteString(text.into_bytes());
    Ok(k8s_openapi::api::core::v1::Secret {
        metadata: meta(peer_tls_secret(tenant), inputs, owner),
        data: Some(BTreeMap::from([
            ("ca.crt".to_string(), file(ca_cert.pem())),
            ("tls.crt".to_string(), file(cert.pem())),
            ("tls.key".to_string(), file(key.serialize_pem())),
        ])),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    })
}
