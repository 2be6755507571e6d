//! Leader election on a `coordination.k8s.io/v1` Lease: with more than one
//! replica, only the holder of the lease reconciles (and so writes).
//!
//! Hand-written, because no maintained crate does what this module must:
//! stop leading, on the operator's own monotonic clock, once the lease has
//! run its `duration` since the start of the last renewal that succeeded,
//! whether the renewals since then failed or hung (an API server that
//! restarts, or never answers: [`hold`] returns, `main` exits and its
//! container restarts to campaign again; client-go's `leaderelection`
//! likewise stops leading past its renew deadline). The crates, checked
//! against kube 5 in December 2026:
//! - `kube-lease-manager` 0.13 (kube 5) keeps reporting leadership while its
//!   renewals fail: its holder check reads the last lease it saw, not its
//!   expiry; a failed renewal is logged and retried with backoff without
//!   sending `false`; and a request that hangs is not bounded by the
//!   lease. A replica cut off from the API server would go on writing
//!   after another took over. Its expiry is also wall-clock time.
//! - `kube-leader-election` 0.44 is built on kube 4, `kubert` 0.25 on kube
//!   1.1 and `kube-coordinate` 2.0-rc on kube 2: each would bring a second
//!   kube whose `Client` is not ours.
//! - kube-runtime 5 has no leader election (kube-rs/kube#485 is open).
//!
//! What is left is small: one compare-and-swap on the Lease
//! (`try_acquire`, a `replace` with the resourceVersion read) and the two
//! loops around it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;

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
pub(crate) async fn try_acquire(client: &Client, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
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

/// Wait until we hold the lease; returns when the successful attempt
/// started (its `renewTime`, on our clock), for [`hold`].
pub async fn acquire(client: &Client, cfg: &LeaseConfig) -> Instant {
    loop {
        let started = Instant::now();
        match try_acquire(client, cfg).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "leader: lease acquired");
                return started;
            }
            Ok(false) => tracing::debug!(lease = %cfg.name, "another replica leads"),
            Err(e) => tracing::warn!(lease = %cfg.name, "leader election: {e}"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// Renew until the lease is lost, or until it expires unrenewed: the lease
/// runs `duration` from the start of the last successful renewal
/// (`renewed`), after which another replica may take it, so a renewal that
/// fails or hangs until then ends the leadership.
pub async fn hold(client: &Client, cfg: &LeaseConfig, mut renewed: Instant) {
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        let expires = renewed + cfg.duration;
        let started = Instant::now();
        match tokio::time::timeout_at(expires, try_acquire(client, cfg)).await {
            Ok(Ok(true)) => renewed = started,
            Ok(Ok(false)) => {
                tracing::error!(lease = %cfg.name, "leader: lease lost to another replica");
                return;
            }
            // Retried after `renew_every`, while the lease lasts.
            Ok(Err(e)) => tracing::warn!(lease = %cfg.name, "leader: renewing: {e}"),
            Err(_) => {
                tracing::error!(lease = %cfg.name, "leader: the lease expired before it could be renewed");
                return;
            }
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

    /// A renewal that hangs (an API server that never answers) must not keep
    /// a leader leading after its lease expired for the other replicas.
    #[tokio::test]
    async fn a_hanging_renewal_ends_the_leadership_when_the_lease_expires() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", silent.local_addr().unwrap());
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let cfg = LeaseConfig {
            name: "bindery-operator".into(),
            namespace: "default".into(),
            identity: "me".into(),
            duration: Duration::from_secs(2),
            renew_every: Duration::from_millis(500),
        };
        let renewed = Instant::now();
        let held =
            tokio::time::timeout(Duration::from_secs(60), hold(&client, &cfg, renewed)).await;
        assert!(
            held.is_ok(),
            "still leading a minute after the lease expired"
        );
        let led = renewed.elapsed();
        assert!(
            led >= cfg.duration && led < cfg.duration + Duration::from_secs(10),
            "led for {led:?}"
        );
    }
}
