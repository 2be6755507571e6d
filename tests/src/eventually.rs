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
    eventually_or(what, within, || {
        let asked = check();
        async move { asked.await.ok_or_else(String::new) }
    })
    .await
}

/// [`eventually`] for a check that says what it saw while the condition
/// does not hold yet (`Err`): the panic shows the last of it.
pub async fn eventually_or<T, Fut>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Fut,
) -> T
where
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        let seen = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}{}{seen}",
            if seen.is_empty() {
                ""
            } else {
                "; last seen:\n"
            }
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
        // What the check last saw is in the message.
        let seen = tokio::spawn(eventually_or(
            "never",
            Duration::from_millis(20),
            || async { Err::<(), _>("status 503".to_string()) },
        ));
        let e = seen.await.unwrap_err().into_panic();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("never: not within") && msg.ends_with("last seen:\nstatus 503"),
            "{msg}"
        );
    }
}
