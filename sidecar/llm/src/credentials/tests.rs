use std::sync::atomic::{AtomicUsize, Ordering};

use super::testing::TestClock;
use super::*;

#[test]
fn refresh_is_five_minutes_before_expiry_or_half_way_through_a_short_life() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let hour = now + Duration::from_secs(3600);
    assert_eq!(refresh_time(now, hour), hour - REFRESH_BEFORE);
    let short = now + Duration::from_secs(120);
    assert_eq!(refresh_time(now, short), now + Duration::from_secs(60));
    assert_eq!(refresh_time(now, now - Duration::from_secs(1)), now);
}

#[test]
fn scrubbing_hides_each_secret_and_each_long_segment_of_a_jwt() {
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2ln";
    let body = format!("bad token {jwt}; claims eyJzdWIiOiJzeXN0ZW06c2EifQ; sig c2ln");
    let out = scrubbed(&body, &[jwt, ""]);
    assert_eq!(out, "bad token <secret>; claims <secret>; sig c2ln");
    // Scrubbed before it is cut: a secret across the cut leaves nothing.
    let long = format!("{}{jwt}", "x".repeat(290));
    assert!(!scrubbed(&long, &[jwt]).contains("eyJ"));
}

#[test]
fn identity_urls_are_https_or_loopback() {
    let ok = |u: &str, h| identity_url(u, "X", h).is_ok();
    assert!(ok(
        "https://sts.us-east-1.amazonaws.com/",
        HttpHosts::LoopbackOnly
    ));
    assert!(ok("http://127.0.0.1:1/", HttpHosts::LoopbackOnly));
    assert!(ok("http://[::1]:1/", HttpHosts::LoopbackOnly));
    assert!(ok("http://LOCALHOST:1/", HttpHosts::LoopbackOnly));
    assert!(!ok("http://169.254.170.23/", HttpHosts::LoopbackOnly));
    assert!(ok("http://169.254.170.23/", HttpHosts::ContainerAgents));
    assert!(ok("http://169.254.170.2/", HttpHosts::ContainerAgents));
    assert!(ok("http://[fd00:ec2::23]/", HttpHosts::ContainerAgents));
    assert!(!ok("http://[fd00:ec2::24]/", HttpHosts::ContainerAgents));
    assert!(!ok("http://169.254.169.254/", HttpHosts::ContainerAgents));
    assert!(!ok(
        "http://localhost.evil.example/",
        HttpHosts::ContainerAgents
    ));
    assert!(!ok("file:///etc/passwd", HttpHosts::ContainerAgents));
    assert!(!ok("https://", HttpHosts::LoopbackOnly));
}

fn at(clock: &TestClock, secs: u64) -> SystemTime {
    clock.now() + Duration::from_secs(secs)
}

#[tokio::test]
async fn the_cache_fetches_once_until_due_and_keeps_a_good_value_when_a_refresh_fails() {
    let clock = TestClock::new();
    let c = clock.clock();
    let cache: Cache<u32> = Cache::default();
    let fetches = AtomicUsize::new(0);
    let ok = |v: u32| {
        fetches.fetch_add(1, Ordering::SeqCst);
        let expires = at(&clock, 3600);
        async move { Ok((v, expires)) }
    };
    assert_eq!(cache.get(&c, || ok(1)).await.unwrap(), 1);
    assert_eq!(cache.get(&c, || ok(2)).await.unwrap(), 1);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(3600 - 200));
    let fail = || async { Err(failed("test", "down".into(), true)) };
    assert_eq!(
        cache.get(&c, fail).await.unwrap(),
        1,
        "still good for 200 s"
    );
    clock.advance(Duration::from_secs(180));
    let e = cache.get(&c, fail).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "no credentials for the model endpoint from test: down"
    );
    assert_eq!(cache.get(&c, || ok(3)).await.unwrap(), 3);
}

#[tokio::test]
async fn an_unreadable_file_is_named_never_quoted() {
    let dir = std::env::temp_dir().join(format!("bindery-credentials-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, b"\xff\xfe secret-canary").unwrap();
    let e = read_token_file(&file).await.unwrap_err();
    assert!(e.contains("is not UTF-8"), "{e}");
    std::fs::write(&file, vec![b'a'; MAX_TOKEN_FILE_BYTES as usize + 1]).unwrap();
    let e = read_token_file(&file).await.unwrap_err();
    assert!(e.contains("larger than"), "{e}");
    std::fs::write(&file, " tok-canary \n").unwrap();
    assert_eq!(read_token_file(&file).await.unwrap().expose(), "tok-canary");
    let _ = std::fs::remove_dir_all(&dir);
}
