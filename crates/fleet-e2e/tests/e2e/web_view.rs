//! The web view in a real headless Chromium: the page shows the machines and units of a
//! running fleetd, follows a unit that starts within a second, draws only the rows in view
//! of a long list, and leaves a screenshot as a test artifact.

use std::time::{Duration, Instant};

use fleet_e2e::browser::Browser;
use fleet_e2e::{Fleetd, binary_dir, examples_dir, poll_until, write_unit};

const WAIT: Duration = Duration::from_secs(30);

fn text(browser: &mut Browser) -> String {
    browser.evaluate("document.body.innerText").as_str().unwrap_or_default().to_string()
}

#[test]
fn the_web_view_shows_the_cluster_and_follows_it_live() {
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let fleet = Fleetd::start(
        "0e0e0e0e0000000000000000000000a1",
        &[
            ("api_listen", listen.as_str()),
            ("api_anonymous_role", "viewer"),
            ("metadata", "region=web"),
            ("capacity_memory", "4G"),
            ("capacity_cpu", "2"),
        ],
    );
    let dir = tempfile::tempdir().expect("scratch dir");
    fleet.ok(&["start", &examples_dir().join("hello.service").display().to_string()]);
    let nowhere = write_unit(
        dir.path(),
        "nowhere.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=region=nowhere\n",
    );
    fleet.ok(&["start", "--no-block", &nowhere]);

    let mut browser = Browser::open(&format!("http://127.0.0.1:{port}/ui/"), 1280, 900);
    poll_until(
        "the page shows the machine and its units",
        WAIT,
        || {
            let seen = text(&mut browser);
            seen.contains("0e0e0e0e")
                && seen.contains("region=web")
                && seen.contains(env!("CARGO_PKG_VERSION"))
                && seen.contains("0 B/4 GiB, 0/2 CPU")
                && seen.contains("hello.service")
                && seen.contains("active/running")
                && seen.contains("nowhere.service")
                && seen.contains("region=nowhere")
                && seen.contains("1 by unix:uid=0")
        },
        String::new,
    );
    assert_eq!(browser.evaluate("document.getElementById('connection').dataset.state"), "live");

    // A unit started shows as active within a second of the API saying so.
    let sleeper = write_unit(dir.path(), "sleeper.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    fleet.ok(&["start", &sleeper]);
    let started = Instant::now();
    let shows = |browser: &mut Browser| {
        browser
            .evaluate(
                "[...document.querySelectorAll('#units .row')].some(r => r.innerText.includes('sleeper.service') && r.innerText.includes('active/running'))",
            )
            .as_bool()
            .unwrap_or(false)
    };
    while !shows(&mut browser) {
        assert!(started.elapsed() < Duration::from_secs(5), "the page never showed sleeper.service active");
        std::thread::sleep(Duration::from_millis(20));
    }
    let latency = started.elapsed();
    assert!(latency < Duration::from_secs(1), "the page followed the unit in {latency:?}");
    // The cluster's events: the latest when the page opened, then each as it comes (the
    // sleeper's placement came after), newest first, and a filter.
    let events = |browser: &mut Browser| {
        browser.evaluate("document.getElementById('events').innerText").as_str().unwrap_or_default().to_string()
    };
    poll_until(
        "the page shows the events of both units",
        WAIT,
        || {
            let shown = events(&mut browser);
            shown.contains("hello.service") && shown.contains("sleeper.service") && shown.contains("placed on 0e0e0e0e")
        },
        String::new,
    );
    let shown = events(&mut browser);
    let newest_first = shown.find("sleeper.service").zip(shown.find("hello.service"));
    assert!(newest_first.is_some_and(|(sleeper, hello)| sleeper < hello), "newest first: {shown}");
    browser.evaluate(
        "(f => { f.value = 'nowhere'; f.dispatchEvent(new Event('input')); })(document.getElementById('event-filter'))",
    );
    poll_until(
        "the filter leaves nowhere.service's events",
        WAIT,
        || {
            let shown = events(&mut browser);
            shown.contains("nowhere.service") && !shown.contains("sleeper.service")
        },
        String::new,
    );
    browser.evaluate(
        "(f => { f.value = ''; f.dispatchEvent(new Event('input')); })(document.getElementById('event-filter'))",
    );
    browser.screenshot(&binary_dir().join("test-artifacts/web-view.png"));
    browser.evaluate("document.getElementById('events').scrollIntoView()");
    browser.screenshot(&binary_dir().join("test-artifacts/web-view-events.png"));
    browser.evaluate("window.scrollTo(0, 0)");

    // A long list: only the rows in view exist in the page, and scrolling shows the end.
    let files: Vec<String> = (0..600)
        .map(|n| write_unit(dir.path(), &format!("many-{n:04}.service"), "[Service]\nExecStart=/bin/true\n"))
        .collect();
    let mut args = vec!["submit"];
    args.extend(files.iter().map(String::as_str));
    fleet.ok(&args);
    poll_until(
        "the page counts every unit",
        WAIT,
        || browser.evaluate("document.body.dataset.units") == "603",
        String::new,
    );
    let drawn = browser.evaluate("document.querySelectorAll('#units .row').length").as_u64().unwrap_or(0);
    assert!(drawn > 0 && drawn < 60, "{drawn} unit rows drawn for 603 units");
    browser.evaluate("(l => { l.scrollTop = l.scrollHeight; l.dispatchEvent(new Event('scroll')); })(document.getElementById('units'))");
    poll_until(
        "scrolling to the end shows the last units",
        WAIT,
        || {
            let rows =
                browser.evaluate("document.getElementById('units').innerText").as_str().unwrap_or_default().to_string();
            rows.contains("sleeper.service") && rows.contains("many-0599") && !rows.contains("many-0000")
        },
        String::new,
    );
    // Filtering by a glob narrows the list.
    browser.evaluate("(f => { f.value = 'many-059*'; f.dispatchEvent(new Event('input')); })(document.getElementById('unit-filter'))");
    poll_until(
        "the filter leaves ten units",
        WAIT,
        || browser.evaluate("document.querySelectorAll('#units .row').length").as_u64() == Some(10),
        String::new,
    );
}

/// Regression (issue 68): the header counted every unit with a reason as waiting (a placed unit
/// may carry one: kept on a drained machine, spread unevenly), and health had no column.
#[test]
fn the_header_counts_only_units_that_wait_and_health_has_its_column() {
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let fleet = Fleetd::start(
        "0e0e0e0e0000000000000000000000a2",
        &[("api_listen", listen.as_str()), ("api_anonymous_role", "viewer"), ("metadata", "zone=a")],
    );
    let dir = tempfile::tempdir().expect("scratch dir");
    let checked = "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nSpreadBy=zone\nHealthCheck=exec:/bin/true\nHealthCheckInterval=1s\nHealthCheckThreshold=1\n";
    let web: Vec<String> = (1..=2).map(|n| write_unit(dir.path(), &format!("web@{n}.service"), checked)).collect();
    fleet.ok(&["start", &web[0], &web[1]]);
    let nowhere = write_unit(
        dir.path(),
        "nowhere.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=zone=nowhere\n",
    );
    fleet.ok(&["start", "--no-block", &nowhere]);
    // The only machine drained: its units have nowhere to go, stay, and (the first of the
    // drain's wave) carry a reason.
    fleet.ok(&["machine", "drain", "0e0e0e0e"]);
    fleet.wait_until("a unit kept on the drained machine says so", WAIT, |fleet| {
        let listed = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"]).stdout;
        listed.lines().any(|line| line.starts_with("web@") && line.contains("cannot leave its draining machine"))
    });
    let mut browser = Browser::open(&format!("http://127.0.0.1:{port}/ui/"), 1400, 900);
    poll_until(
        "the header counts the one unit that waits, and health shows in its column",
        WAIT,
        || {
            let summary = browser.evaluate("document.getElementById('summary').innerText");
            let healthy = browser.evaluate(
                "[...document.querySelectorAll('#units .row')].filter(r => r.children[5] && r.children[5].innerText === 'healthy').length",
            );
            summary == "1 machines, 3 units: 2 active, 1 waiting for a machine" && healthy == 2
        },
        String::new,
    );
    assert!(text(&mut browser).contains("HEALTH"), "the column has its head");
    browser.evaluate(
        "(s => { s.value = 'unplaced'; s.dispatchEvent(new Event('input')); })(document.getElementById('unit-state'))",
    );
    poll_until(
        "waiting for a machine lists only the unit that waits",
        WAIT,
        || {
            browser
                .evaluate("document.getElementById('units').innerText")
                .as_str()
                .is_some_and(|rows| rows.contains("nowhere.service") && !rows.contains("web@1.service"))
        },
        String::new,
    );
    // A taint shows in the machine's own column (its units stay: it does not evict).
    fleet.ok(&["machine", "taint", "0e0e0e0e", "edge=yes"]);
    poll_until(
        "the machine's taints column shows the taint",
        WAIT,
        || {
            let cells = browser.evaluate(
                "[...document.querySelectorAll('#machines .row')].map(r => r.children[5] ? r.children[5].innerText : '').join('|')",
            );
            cells.as_str() == Some("edge=yes")
        },
        String::new,
    );
    assert!(text(&mut browser).contains("TAINTS"), "the column has its head");
}

/// A unit on a calendar shows how its last run ended and when it runs next in its own column,
/// and between runs it is not counted as waiting for a machine.
#[test]
fn a_unit_on_a_calendar_shows_its_runs_and_does_not_wait() {
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let fleet = Fleetd::start(
        "0e0e0e0e0000000000000000000000a3",
        &[("api_listen", listen.as_str()), ("api_anonymous_role", "viewer")],
    );
    let dir = tempfile::tempdir().expect("scratch dir");
    let tick = write_unit(
        dir.path(),
        "tick.service",
        "[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=*:*:0/2\n",
    );
    fleet.ok(&["start", &tick]);
    let mut browser = Browser::open(&format!("http://127.0.0.1:{port}/ui/"), 1600, 900);
    poll_until(
        "the runs column shows a run that succeeded and the next elapse, and nothing waits",
        WAIT,
        || {
            let runs = browser.evaluate(
                "[...document.querySelectorAll('#units .row')].map(r => r.children[6] ? r.children[6].innerText : '').join('|')",
            );
            let summary = browser.evaluate("document.getElementById('summary').innerText");
            runs.as_str().is_some_and(|runs| runs.starts_with("last: succeeded (run ") && runs.contains("; next 20"))
                && summary.as_str().is_some_and(|summary| summary.ends_with(" 0 waiting for a machine"))
        },
        String::new,
    );
    assert!(text(&mut browser).contains("RUNS"), "the column has its head");
    let priorities = browser.evaluate(
        "[...document.querySelectorAll('#units .row')].map(r => r.children[7] ? r.children[7].innerText : '').join('|')",
    );
    assert_eq!(priorities.as_str(), Some("50"), "a unit that sets no Priority= shows the default");
    assert!(text(&mut browser).contains("PRIORITY"), "the column has its head");
}

/// A unit whose file has an option nothing knows, or a metadata requirement that is ignored, is
/// marked in the list with what `fleetctl status` warns of, and the filter "with warnings"
/// shows those units alone; a unit's placement terms have their column, as in list-unit-files.
#[test]
fn a_unit_with_warnings_is_marked_and_can_be_filtered() {
    let port = fleet_testkit::free_port();
    let listen = format!("unix://{{socket}},http://127.0.0.1:{port}");
    let fleet = Fleetd::start(
        "0e0e0e0e0000000000000000000000a4",
        &[("api_listen", listen.as_str()), ("api_anonymous_role", "viewer")],
    );
    let dir = tempfile::tempdir().expect("scratch dir");
    let typo = write_unit(
        dir.path(),
        "typo.service",
        "[Service]\nExecStart=/bin/sleep 1000\nRestrt=always\n[X-Fleet]\nMachineMetadata=role\n",
    );
    let clean = write_unit(
        dir.path(),
        "clean.service",
        "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nTolerate=gpu\nLostAfter=never\n",
    );
    fleet.ok(&["submit", &typo, &clean]);
    let mut browser = Browser::open(&format!("http://127.0.0.1:{port}/ui/"), 1600, 900);
    let names = "[...document.querySelectorAll('#units .row')].map(r => r.children[0].innerText).join('|')";
    poll_until(
        "both units are listed, the one with warnings marked",
        WAIT,
        || browser.evaluate(names).as_str() == Some("clean.service|typo.service ⚠"),
        String::new,
    );
    // The clean unit's terms have their column, as in list-unit-files.
    let terms = browser.evaluate("document.querySelectorAll('#units .row')[0].children[10].innerText");
    assert_eq!(terms.as_str(), Some("tolerates gpu; never lost"));
    assert!(text(&mut browser).contains("TERMS"), "the column has its head");
    let listed = fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,terms"]).stdout;
    assert_eq!(listed, "clean.service\ttolerates gpu; never lost\ntypo.service\t-\n");
    let json = fleet.ok(&["list-unit-files", "-o", "json"]).stdout;
    let rows: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(rows[0]["terms"], serde_json::json!(["tolerates gpu", "never lost"]));
    assert_eq!(rows[1]["terms"], serde_json::json!([]));
    let title = browser.evaluate("document.querySelectorAll('#units .row')[1].children[0].title");
    let title = title.as_str().unwrap_or_default();
    assert!(
        title.contains("unknown option Restrt= in [Service], which systemd ignores; did you mean Restart=?"),
        "{title}"
    );
    assert!(title.contains("metadata requirement \"role\" is not one key=value, and is ignored"), "{title}");
    browser.evaluate(
        "(() => { const s = document.getElementById('unit-state'); s.value = 'warnings'; s.dispatchEvent(new Event('input')); })()",
    );
    poll_until(
        "the filter shows the unit with warnings alone",
        WAIT,
        || browser.evaluate(names).as_str() == Some("typo.service ⚠"),
        String::new,
    );
}
