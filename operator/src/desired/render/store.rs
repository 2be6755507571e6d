//! Where the sessions are kept: SQLite on a claim (or an emptyDir), or
//! PostgreSQL, whose replicas forward to each other over mutual TLS.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerPort, EmptyDirVolumeSource, KeyToPath, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, SecretVolumeSource, Volume,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::env::{field_env, literal_env, secret_env};
use super::generated::peer_tls_name;
use super::pod::Parts;
use super::{meta, mount};
use crate::crd::KeyRef;
use crate::desired::{postgres_url, Inputs};
use crate::names::{
    peer_tls_secret, store_claim, PEER_PORT, PEER_TLS_DIR, PEER_TLS_KEYS, STORE_DIR,
};

/// The claim of a SQLite store that asks for one (`store.pvcSize`). A
/// Postgres store keeps no files: no claim, no store volume.
pub(super) fn claim(inputs: &Inputs<'_>, owner: &OwnerReference) -> Option<PersistentVolumeClaim> {
    let store = inputs.tenant.spec.store.as_ref();
    store
        .filter(|_| postgres_url(inputs.tenant).is_none())
        .and_then(|s| s.pvc_size.as_ref())
        .map(|size| PersistentVolumeClaim {
            metadata: meta(store_claim(inputs.tenant_name()), inputs, owner),
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: store.and_then(|s| s.storage_class_name.clone()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity(size.clone()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
}

/// The store's part of the sidecar and its pod.
pub(super) fn store(inputs: &Inputs<'_>, claim: Option<&PersistentVolumeClaim>) -> Parts {
    match postgres_url(inputs.tenant) {
        Some(url) => postgres(inputs, url),
        None => sqlite(claim),
    }
}

/// The URL holds a password: like a secret parameter, it goes from the
/// Secret to the pod's environment, never through here. Replicas forward
/// to each other over mutual TLS, with the certificate all of them share
/// (made by the operator).
fn postgres(inputs: &Inputs<'_>, url: &KeyRef) -> Parts {
    let peer_tls = Volume {
        name: "peer-tls".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(peer_tls_secret(inputs.tenant_name())),
            items: Some(
                PEER_TLS_KEYS
                    .iter()
                    .map(|k| KeyToPath {
                        key: (*k).into(),
                        path: (*k).into(),
                        mode: None,
                    })
                    .collect(),
            ),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    };
    Parts {
        volumes: vec![peer_tls],
        mounts: vec![mount("peer-tls", PEER_TLS_DIR, true)],
        args: vec![
            "--peer-tls-dir".into(),
            PEER_TLS_DIR.into(),
            "--peer-tls-name".into(),
            peer_tls_name(inputs),
            "--peer-listen".into(),
            format!("0.0.0.0:{PEER_PORT}"),
        ],
        // On the pod only: the Service is for clients.
        ports: vec![ContainerPort {
            name: Some("peer".into()),
            container_port: PEER_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }],
        env: vec![
            secret_env("BINDERY_STORE".into(), url),
            // Replicas forward to each other the requests that need what
            // one pod holds in memory: each says, with its heartbeat, where
            // it is reached (its pod IP, from the downward API).
            field_env("BINDERY_POD_IP", "status.podIP"),
            literal_env(
                "BINDERY_ADVERTISE_URL",
                format!("https://$(BINDERY_POD_IP):{PEER_PORT}"),
            ),
        ],
    }
}

/// A SQLite file on the claim, or on an emptyDir without one.
fn sqlite(claim: Option<&PersistentVolumeClaim>) -> Parts {
    let volume = match claim {
        Some(c) => Volume {
            name: "store".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: c.metadata.name.clone().unwrap_or_default(),
                read_only: None,
            }),
            ..Default::default()
        },
        None => Volume {
            name: "store".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    };
    Parts {
        volumes: vec![volume],
        mounts: vec![mount("store", STORE_DIR, false)],
        args: vec![
            "--store".into(),
            format!("sqlite://{STORE_DIR}/bindery.sqlite"),
        ],
        ..Default::default()
    }
}
