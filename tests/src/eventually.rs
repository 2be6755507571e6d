//! Waiting on a condition, the one way the tests do it: ask, briefly
//! apart (5 ms, doubling to 100 ms), until the answer comes or a deadline
//! passes, then fail saying what never happened. Never a fixed sleep.

use std::future::Future;
use std::time::Duration;

/// How long a condition of a test on this machine may take to hold.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Poll `check` until it gives `Some`, within `within`; panics naming
/// `what` (and the last thing `check` said, through `what`'s caller) when
/// it never does.
pub async fn eventually<T, Fut>(what: &str, within: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// [`eventually`] for a condition that needs no async work.
pub async fn until(what: &str, within: Duration, mut holds: impl FnMut() -> bool) {
    eventually(what, within, || std::future::ready(holds().then_some(()))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_answers_once_the_condition_holds_and_fails_past_the_deadline() {
        let mut n = 0;
        let got = eventually("n reaches 3", Duration::from_secs(1), || {
            n += 1;
            std::future::ready((n >= 3).then_some(n))
        })
        .await;
        assert_eq!(got, 3);
        let never = tokio::spawn(until("never", Duration::from_millis(50), || false));
        let e = never.await.unwrap_err();
        assert!(e.is_panic());
    }
}
