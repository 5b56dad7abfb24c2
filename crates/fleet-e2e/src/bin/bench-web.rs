//! Benchmark: the web view at a size. One fleetd (embedded store) holds N units (10,000 by
//! default; inactive, so that no process is started for them) and a few running ones; a real
//! headless Chromium opens `/ui/`. Printed: the time until the page holds every unit, the rows
//! it draws, the time from a unit's start to the page showing it active, and fleetd's CPU
//! while nobody watches and while the page watches.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-web [UNITS] [IDLE_SECONDS]`

use std::time::{Duration, Instant};

use fleet_e2e::browser::Browser;
use fleet_e2e::{Fleetd, cpu_seconds, examples_dir, write_unit};

fn cpu_share(fleet: &Fleetd, over: Duration) -> f64 {
    let before = cpu_seconds(fleet.pid());
    std::thread::sleep(over);
    (cpu_seconds(fleet.pid()) - before) / over.as_secs_f64() * 100.0
}

fn main() {
    let units: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let idle = Duration::from_secs_f64(std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(10.0));
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let fleet = Fleetd::start(
        "bebebebe000000000000000000000001",
        &[("api_listen", listen.as_str()), ("api_anonymous_role", "viewer")],
    );
    let dir = tempfile::tempdir().expect("scratch dir");
    let files: Vec<String> = (0..units)
        .map(|n| write_unit(dir.path(), &format!("web-{n:05}.service"), "[Service]\nExecStart=/bin/sleep 1000\n"))
        .collect();
    let submitted = Instant::now();
    for chunk in files.chunks(2000) {
        let mut args = vec!["submit"];
        args.extend(chunk.iter().map(String::as_str));
        fleet.ok(&args);
    }
    println!("web view with {units} units on one fleetd (embedded store)");
    println!("  submitted in {:.1} s", submitted.elapsed().as_secs_f64());
    let quiet = cpu_share(&fleet, idle);

    let opened = Instant::now();
    let mut browser = Browser::open(&format!("http://127.0.0.1:{port}/ui/"), 1280, 900);
    let expected = units.to_string();
    while browser.evaluate("document.body.dataset.units").as_str() != Some(expected.as_str()) {
        assert!(opened.elapsed() < Duration::from_secs(120), "the page never held every unit");
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("  (a) page open until it holds every unit: {:.2} s", opened.elapsed().as_secs_f64());
    let rows = browser.evaluate("document.querySelectorAll('#units .row').length");
    println!("  (b) unit rows in the page: {rows} (of {units})");

    let reported = Instant::now();
    fleet.ok(&["start", "--no-block", &examples_dir().join("hello.service").display().to_string()]);
    let shows = "[...document.querySelectorAll('#units .row')].some(r => r.innerText.includes('hello.service') && r.innerText.includes('active/running'))";
    while browser.evaluate(shows).as_bool() != Some(true) {
        assert!(reported.elapsed() < Duration::from_secs(30), "the page never showed hello.service active");
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "  (c) `fleetctl start --no-block` until the page shows the unit active (scheduling, start, report, view): {:.0} ms",
        reported.elapsed().as_secs_f64() * 1000.0
    );
    let watched = cpu_share(&fleet, idle);
    println!("  (d) fleetd CPU, idle: {quiet:.1}% with no page open, {watched:.1}% while the page watches");
    let scrolled = Instant::now();
    browser.evaluate("(l => { l.scrollTop = l.scrollHeight; l.dispatchEvent(new Event('scroll')); })(document.getElementById('units'))");
    let last = format!("web-{:05}.service", units - 1);
    while !browser.evaluate("document.getElementById('units').innerText").as_str().unwrap_or("").contains(&last) {
        assert!(scrolled.elapsed() < Duration::from_secs(30), "scrolling never showed the last unit");
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("  (e) scroll to the end until the last unit shows: {:.0} ms", scrolled.elapsed().as_secs_f64() * 1000.0);
}
