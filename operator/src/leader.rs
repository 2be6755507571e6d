//! Leader election on a `coordination.k8s.io/v1` Lease: with more than one
//! replica, only the holder of the lease reconciles (and so writes).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Who we are (the pod name in a cluster).
    pub identity: String,
    /// A holder that has not renewed for this long has lost the lease.
    pub duration: Duration,
    /// How often the holder renews (and others retry).
    pub renew_every: Duration,
}

fn expired(spec: &LeaseSpec, now: jiff::Timestamp) -> bool {
    let Some(MicroTime(renewed)) = spec.renew_time else {
        return true;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    renewed + jiff::SignedDuration::from_secs(secs) < now
}

/// Try once: `Ok(true)` when we hold the lease now.
pub async fn try_acquire(client: &Client, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let now = jiff::Timestamp::now();
    let ours = |transitions: i32, acquired: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(cfg.duration.as_secs().max(1) as i32),
        acquire_time: acquired.or(Some(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    match api.get_opt(&cfg.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(ours(0, None)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let mine = holder == cfg.identity;
            if !mine && !holder.is_empty() && !expired(&spec, now) {
                return Ok(false);
            }
            let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
            lease.spec = Some(ours(
                transitions,
                if mine { spec.acquire_time } else { None },
            ));
            // The resourceVersion we read makes this a compare-and-swap.
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Wait until we hold the lease.
pub async fn acquire(client: &Client, cfg: &LeaseConfig) {
    loop {
        match try_acquire(client, cfg).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "leader: lease acquired");
                return;
            }
            Ok(false) => tracing::debug!(lease = %cfg.name, "another replica leads"),
            Err(e) => tracing::warn!(lease = %cfg.name, "leader election: {e}"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// Renew until the lease is lost (or cannot be renewed before it expires).
pub async fn hold(client: &Client, cfg: &LeaseConfig) {
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        match try_acquire(client, cfg).await {
            Ok(true) => last_ok = tokio::time::Instant::now(),
            Ok(false) => {
                tracing::error!(lease = %cfg.name, "leader: lease lost to another replica");
                return;
            }
            Err(e) if last_ok.elapsed() >= cfg.duration => {
                tracing::error!(lease = %cfg.name, "leader: cannot renew the lease in time: {e}");
                return;
            }
            Err(e) => tracing::warn!(lease = %cfg.name, "leader: renewing: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_its_duration() {
        let now: jiff::Timestamp = "2026-11-29T12:00:10Z".parse().unwrap();
        let spec = |renewed: &str, secs| LeaseSpec {
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            lease_duration_seconds: Some(secs),
            ..Default::default()
        };
        assert!(!expired(&spec("2026-11-29T12:00:00Z", 15), now));
        assert!(expired(&spec("2026-11-29T12:00:00Z", 5), now));
        assert!(expired(&LeaseSpec::default(), now));
    }
}
