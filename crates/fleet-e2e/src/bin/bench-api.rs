//! Benchmark: what authentication costs the API. One fleetd (embedded store) with 1,000 units
//! serves the same requests on three loopback listeners: plain HTTP with anonymous access,
//! plain HTTP with a bearer token, and HTTPS with a bearer token. Keep-alive clients send
//! `GET /fleet/v1/units` (a page of the 1,000 units) and `PUT` of new units for a fixed time
//! each; requests per second are printed with the cost of TLS + token against plain.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-api [SECONDS] [CLIENTS]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_e2e::Fleetd;
use fleet_e2e::https::{Caller, Credentials};
use fleet_e2e::pki::Authority;

const UNITS: usize = 1000;
const ROUNDS: usize = 3;
/// Numbers the PUT units, so that every PUT creates one.
static NEXT_UNIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The name prefixes of the units each variant PUTs (distinct, so every PUT creates a unit).
const PREFIXES: [&str; 3] = ["plain", "token", "tls"];

use fleet_testkit::free_port;

fn unit_body() -> &'static str {
    r#"{"desiredState":"inactive","options":[{"section":"Service","name":"ExecStart","value":"/bin/sleep 1000"}]}"#
}

/// Requests per second that `callers` (keep-alive, one task each) reach in `seconds` on one
/// kind of request; `put` sends each one a new unit named with that prefix.
async fn rate(callers: &[Arc<Caller>], seconds: f64, put: Option<&'static str>) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, caller) in callers.iter().enumerate() {
        let caller = caller.clone();
        tasks.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                let answer = match put {
                    Some(prefix) => {
                        let serial = NEXT_UNIT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let path = format!("/fleet/v1/units/{prefix}-{index}-{serial}.service");
                        caller.call("PUT", &path, Some(unit_body())).await
                    }
                    None => caller.call("GET", "/fleet/v1/units", None).await,
                };
                let status = answer.expect("an answer").status;
                assert_eq!(status, if put.is_some() { 201 } else { 200 });
                done += 1;
            }
            done
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.expect("a client task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(5.0);
    let clients: usize = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(8);
    let pki_dir = tempfile::tempdir().expect("temporary directory");
    let ca = Authority::new("bench CA");
    let ca_file = ca.write(&pki_dir.path().join("ca.pem"));
    let server = ca.server(pki_dir.path(), "server");
    let (plain_port, tls_port) = (free_port(), free_port());
    let listen = format!("unix://{{socket}},127.0.0.1:{plain_port},https://127.0.0.1:{tls_port}");
    let (cert, key) = (server.cert.display().to_string(), server.key.display().to_string());
    let fleetd = Fleetd::start(
        "bench0api0000001",
        &[
            ("api_listen", listen.as_str()),
            ("api_tls_cert_file", cert.as_str()),
            ("api_tls_key_file", key.as_str()),
            ("api_anonymous_role", "admin"),
            ("unit_manager", "native"),
        ],
    );
    let token = fleetd.ok(&["token", "create", "--role", "admin", "bench"]).stdout.trim().to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let plain = format!("http://127.0.0.1:{plain_port}");
    let tls = format!("https://localhost:{tls_port}");
    let make = |base: &str, token: Option<&str>| -> Vec<Arc<Caller>> {
        (0..clients)
            .map(|_| {
                Arc::new(Caller::new(base, Some(&ca_file), Credentials { token, certificate: None }).expect("caller"))
            })
            .collect()
    };
    let anonymous = make(&plain, None);
    let plain_token = make(&plain, Some(&token));
    let tls_token = make(&tls, Some(&token));
    runtime.block_on(async {
        for index in 0..UNITS {
            let path = format!("/fleet/v1/units/seed-{index}.service");
            let answer = anonymous[index % clients].call("PUT", &path, Some(unit_body())).await.expect("seed");
            assert_eq!(answer.status, 201);
        }
    });
    println!(
        "bench-api: {UNITS} units, {clients} keep-alive clients, {ROUNDS} rounds of {seconds} s per cell, median (embedded store)"
    );
    println!("  {:<30} {:>14} {:>14}", "listener", "GET /units/s", "PUT unit/s");
    let variants =
        [("plain HTTP, anonymous", &anonymous), ("plain HTTP + token", &plain_token), ("HTTPS + token", &tls_token)];
    // Rounds rotate the order, so drift (the PUTs grow the store) falls on every variant alike;
    // every GET round runs before the first PUT, so each lists the same units.
    let mut gets = vec![Vec::new(); variants.len()];
    let mut puts = vec![Vec::new(); variants.len()];
    runtime.block_on(async {
        for (_, callers) in &variants {
            rate(callers, 0.5, None).await; // warm-up: connections and handshakes
        }
        for round in 0..ROUNDS {
            for offset in 0..variants.len() {
                let index = (round + offset) % variants.len();
                gets[index].push(rate(variants[index].1, seconds, None).await);
            }
        }
        for round in 0..ROUNDS {
            for offset in 0..variants.len() {
                let index = (round + offset) % variants.len();
                puts[index].push(rate(variants[index].1, seconds, Some(PREFIXES[index])).await);
            }
        }
    });
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut rows = Vec::new();
    for (index, (name, _)) in variants.iter().enumerate() {
        let (get, put) = (median(&mut gets[index]), median(&mut puts[index]));
        println!("  {name:<30} {get:>14.0} {put:>14.0}");
        rows.push((get, put));
    }
    let cost = |base: f64, with: f64| (1.0 - with / base) * 100.0;
    println!(
        "  cost of HTTPS + token vs plain: GET {:.1}%, PUT {:.1}%",
        cost(rows[0].0, rows[2].0),
        cost(rows[0].1, rows[2].1)
    );
    println!(
        "  cost of the token alone:        GET {:.1}%, PUT {:.1}%",
        cost(rows[0].0, rows[1].0),
        cost(rows[0].1, rows[1].1)
    );
    // Encryption costs a tenth here, a sixth in a debug build; half is a stall, not a cost
    // (Nagle's algorithm holding each TLS record made it 90%, unnoticed in CI's slice for days).
    for (what, plain, https) in [("GET", rows[0].0, rows[2].0), ("PUT", rows[0].1, rows[2].1)] {
        if https < plain / 2.0 {
            eprintln!("bench-api: HTTPS + token answers {what} at {https:.0}/s against {plain:.0}/s in plain: a stall");
            std::process::exit(1);
        }
    }
}
