//! Benchmark: what idle followers of the event stream cost a fleetd.
//!
//! `bench-events [FOLLOWERS] [IDLE_SECONDS]` (default 1,000 and 30): one real fleetd on the
//! embedded store with an HTTPS listener; FOLLOWERS followers of `GET /fleet/v1/events`
//! (`follow=true`), each its own HTTP/1.1 connection with a viewer token (eight a token: a
//! credential holds at most eight live feeds), all in this one process. Prints:
//!
//! 1. how long until every follower was streaming (each has read the events so far);
//! 2. fleetd's resident memory before the followers and with them (and per follower);
//! 3. fleetd's CPU over IDLE_SECONDS with every follower connected and nothing happening;
//! 4. one write (a unit submitted): how long until every follower was told of it, and
//!    fleetd's CPU for that delivery.
//!
//! Each step waits for what it measures (every follower streaming, every follower told), so a
//! small debug run checks the streams as well.

use fleet_e2e::{argument, resident_mib};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_e2e::https_listener::{Listener, write_private};
use fleet_e2e::{Fleetd, cpu_seconds};

/// Followers one token serves (the API's bound per identity).
const PER_TOKEN: usize = 8;

/// The longest any step may take.
const LIMIT: Duration = Duration::from_secs(120);

/// Follows the stream at `url` with `client` and `token`, counting the events it is told of
/// in `told` (an `id:` line each), until the stream ends.
async fn follow(client: reqwest::Client, url: String, token: String, told: Arc<AtomicU64>) -> Result<(), String> {
    let mut response = client
        .get(&url)
        .header("Authorization", format!("Bearer {token}"))
        .send()
        .await
        .map_err(|error| format!("{error:?}"))?;
    if !response.status().is_success() {
        return Err(format!("answered {}", response.status()));
    }
    let mut pending = String::new();
    while let Some(chunk) = response.chunk().await.map_err(|error| format!("{error:?}"))? {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            if pending[..end].starts_with("id:") {
                told.fetch_add(1, Ordering::Relaxed);
            }
            pending.drain(..=end);
        }
    }
    Ok(())
}

/// Waits until every count is at least `least`; how long that took, or `None` past `limit`.
async fn all_told(told: &[Arc<AtomicU64>], least: &[u64], limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if told.iter().zip(least).all(|(count, least)| count.load(Ordering::Relaxed) >= *least) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let followers: usize = argument(1, 1_000);
    let idle = Duration::from_secs(argument(2, 30u64));
    let listener = Listener::new();
    let mut config = listener.config();
    // Event streams share the live feeds' slots: half of the connections in all.
    config.push(("api_max_connections".into(), (2 * followers + 64).to_string()));
    let pairs: Vec<(&str, &str)> = config.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    let fleetd = Fleetd::start("bench0events0001", &pairs);
    let mut tokens = Vec::new();
    for index in 0..followers.div_ceil(PER_TOKEN) {
        let name = format!("follower-{index}");
        let token = fleetd.ok(&["token", "create", "--role", "viewer", &name]).stdout.trim().to_string();
        write_private(&listener.dir().join(&name), &token);
        tokens.push(token);
    }
    let pem = std::fs::read(&listener.ca_file).expect("the bench CA");
    let certificates = reqwest::Certificate::from_pem_bundle(&pem).expect("the bench CA's certificate");
    let rss_before = resident_mib(fleetd.pid());
    let url = format!("{}/fleet/v1/events?since=0&follow=true", listener.endpoint());
    let started = Instant::now();
    let mut told = Vec::with_capacity(followers);
    let mut streams = tokio::task::JoinSet::new();
    for index in 0..followers {
        let client = reqwest::Client::builder()
            .tls_certs_only(certificates.clone())
            .http1_only()
            .build()
            .expect("an HTTPS client");
        let counted = Arc::new(AtomicU64::new(0));
        let token = tokens[index / PER_TOKEN].clone();
        streams.spawn(follow(client, url.clone(), token, counted.clone()));
        told.push(counted);
    }
    // The token writes are events already: a follower that was told of one is streaming.
    let ones = vec![1; followers];
    let Some(streaming) = all_told(&told, &ones, LIMIT).await else {
        let ended = streams.try_join_next().map(|ended| format!("{ended:?}")).unwrap_or_default();
        panic!("not every follower was streaming within {LIMIT:?} {ended}");
    };
    println!(
        "1. {followers} followers streaming {:.2} s after the first connected ({:.2} s in all)",
        streaming.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let rss_with = resident_mib(fleetd.pid());
    println!(
        "2. fleetd resident memory: {rss_before:.1} MiB before, {rss_with:.1} MiB with them ({:.1} KiB a follower)",
        (rss_with - rss_before) * 1024.0 / followers.max(1) as f64
    );
    let cpu_before = cpu_seconds(fleetd.pid());
    let bench_before = cpu_seconds(std::process::id());
    tokio::time::sleep(idle).await;
    let (cpu_idle, bench_idle) =
        (cpu_seconds(fleetd.pid()) - cpu_before, cpu_seconds(std::process::id()) - bench_before);
    println!(
        "3. idle {:.0} s with them: fleetd CPU {cpu_idle:.2} s ({:.2}% of a core); the followers' process {bench_idle:.2} s",
        idle.as_secs_f64(),
        cpu_idle * 100.0 / idle.as_secs_f64()
    );
    assert!(streams.try_join_next().is_none(), "a stream ended while idle");
    let counts: Vec<u64> = told.iter().map(|count| count.load(Ordering::Relaxed) + 1).collect();
    let file = listener.dir().join("told.service");
    std::fs::write(&file, "[Service]\nExecStart=/bin/sleep 1000\n").expect("a unit file");
    let cpu_before = cpu_seconds(fleetd.pid());
    let written = Instant::now();
    fleetd.ok(&["submit", &file.display().to_string()]);
    let Some(_) = all_told(&told, &counts, LIMIT).await else {
        panic!("not every follower was told of the write within {LIMIT:?}");
    };
    println!(
        "4. one write told to all {followers}: {:.0} ms after fleetctl submit began; fleetd CPU {:.2} s",
        written.elapsed().as_secs_f64() * 1000.0,
        cpu_seconds(fleetd.pid()) - cpu_before
    );
    streams.abort_all();
}
