//! Waiting on a condition, the one way the tests do it: ask, briefly
//! apart (5 ms, doubling to 100 ms), until the answer comes or a deadline
//! passes, then fail saying what never happened. Never a fixed sleep.

use std::time::Duration;

/// How long a condition of a test on this machine may take to hold.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The first pause between two askings; each next one is twice as long,
/// up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// Poll `check` until it gives `Some`, within `within`; panics naming
/// `what` (and the last thing `check` said, through `what`'s caller) when
/// it never does.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let mut pauses = Pauses::new(within, tokio::time::Instant::now);
    loop {
        match check().await {
            Some(v) => return v,
            None => pauses.after(what, "").await,
        }
    }
}

/// [`eventually`] for a check that says what it saw while the condition
/// does not hold yet (`Err`): the panic shows the last of it.
pub async fn eventually_or<T>(
    what: &str,
    within: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let mut pauses = Pauses::new(within, tokio::time::Instant::now);
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) => pauses.after(what, &seen).await,
        }
    }
}

/// [`eventually`] for a condition that needs no async work.
pub async fn until(what: &str, within: Duration, mut holds: impl FnMut() -> bool) {
    // Its own loop: through `eventually` rustc cannot prove the future
    // `Send` (the `AsyncFnMut`'s future is higher-ranked), and a spawned
    // `until` must be.
    let mut pauses = Pauses::new(within, tokio::time::Instant::now);
    while !holds() {
        pauses.after(what, "").await;
    }
}

/// [`eventually_or`] for code that cannot await (a synchronous test, a
/// constructor): the same askings and pauses, the thread sleeping between
/// them. Not on a thread of an async runtime.
pub fn eventually_or_blocking<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let mut pauses = Pauses::new(within, || std::time::Instant::now().into());
    loop {
        match check() {
            Ok(v) => return v,
            Err(seen) => std::thread::sleep(pauses.next(what, &seen)),
        }
    }
}

/// [`until`] for code that cannot await; see [`eventually_or_blocking`].
pub fn until_blocking(what: &str, within: Duration, mut holds: impl FnMut() -> bool) {
    eventually_or_blocking(what, within, || {
        holds().then_some(()).ok_or_else(String::new)
    })
}

/// The pauses between askings until a deadline: [`FIRST_PAUSE`], doubling
/// up to [`LONGEST_PAUSE`].
struct Pauses {
    within: Duration,
    /// The clock: the runtime's (which a test may pause) for the async
    /// waits, the system's for the blocking ones.
    now: fn() -> tokio::time::Instant,
    deadline: tokio::time::Instant,
    next: Duration,
}

impl Pauses {
    fn new(within: Duration, now: fn() -> tokio::time::Instant) -> Pauses {
        Pauses {
            within,
            now,
            deadline: now() + within,
            next: FIRST_PAUSE,
        }
    }

    /// The pause before asking again; a panic saying what did not happen
    /// in time, and what was `seen` last, once the deadline has passed.
    fn next(&mut self, what: &str, seen: &str) -> Duration {
        assert!(
            (self.now)() < self.deadline,
            "{what}: not within {:?}{}{seen}",
            self.within,
            if seen.is_empty() {
                ""
            } else {
                "; last seen:\n"
            }
        );
        let pause = self.next;
        self.next = (pause * 2).min(LONGEST_PAUSE);
        pause
    }

    /// [`Pauses::next`], slept on the runtime's timer.
    async fn after(&mut self, what: &str, seen: &str) {
        tokio::time::sleep(self.next(what, seen)).await
    }
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
        // A check may borrow what it changes (an async closure).
        let mut asked = Vec::new();
        let got = eventually_or("two askings", Duration::from_secs(1), async || {
            asked.push(asked.len());
            if asked.len() == 2 {
                Ok(asked.clone())
            } else {
                Err(format!("{asked:?}"))
            }
        })
        .await;
        assert_eq!(got, [0, 1]);
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
        // An async closure's wait can be spawned too.
        let status = 503;
        let seen = tokio::spawn(eventually_or(
            "never",
            Duration::from_millis(20),
            async move || Err::<(), _>(format!("status {status}")),
        ));
        assert!(seen.await.unwrap_err().is_panic());
    }

    #[test]
    fn blocking_it_answers_once_the_condition_holds_and_fails_past_the_deadline() {
        let mut n = 0;
        let got = eventually_or_blocking("n reaches 3", Duration::from_secs(1), || {
            n += 1;
            if n >= 3 {
                Ok(n)
            } else {
                Err(format!("n = {n}"))
            }
        });
        assert_eq!(got, 3);
        let mut asked = 0;
        until_blocking("the fourth asking", Duration::from_secs(1), || {
            asked += 1;
            asked == 4
        });
        assert_eq!(asked, 4, "asked again after the condition held");

        // Past the deadline: a panic, after the deadline and not before,
        // saying what was seen last.
        let started = std::time::Instant::now();
        let e = std::panic::catch_unwind(|| {
            let mut n = 0;
            eventually_or_blocking("never", Duration::from_millis(50), || {
                n += 1;
                Err::<(), _>(format!("status 503 (asking {n})"))
            })
        })
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(50));
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(
            msg.starts_with("never: not within 50ms; last seen:\nstatus 503 (asking ")
                && !msg.ends_with("(asking 1)"),
            "{msg}"
        );
        let e = std::panic::catch_unwind(|| {
            until_blocking("nothing holds", Duration::from_millis(20), || false)
        })
        .unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert_eq!(msg, "nothing holds: not within 20ms");
    }
}
