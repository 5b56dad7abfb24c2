//! Backing up the embedded store while fleetd serves and a burst of units is submitted, and
//! restoring it into the stopped fleetd (issue 69): every unit acknowledged before the backup
//! began is back, each with its hash; a restore is refused while fleetd runs and for a file
//! that is not a whole snapshot.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_e2e::{Fleetd, Ran, binary, write_unit};

/// `fleetd -config … -restore FILE` for `fleet`'s directory.
fn restore(fleet: &Fleetd, file: &std::path::Path) -> Ran {
    let output = Command::new(binary("fleetd"))
        .arg("-config")
        .arg(fleet.config_path())
        .arg("-restore")
        .arg(file)
        .output()
        .expect("run fleetd -restore");
    Ran::from(output)
}

/// Every unit with its full hash.
fn hashes(fleet: &Fleetd) -> BTreeMap<String, String> {
    let listed = fleet.ok(&["list-unit-files", "--full", "--no-legend", "--fields", "unit,hash"]).stdout;
    listed
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(unit, hash)| (unit.to_string(), hash.trim().to_string()))
        .collect()
}

/// A batch's units, and when fleetctl said they were written.
type Acknowledged = (Instant, Vec<String>);

#[test]
fn a_backup_under_a_burst_restores_every_unit_acknowledged_before_it() {
    let mut fleet = Fleetd::start("e2e0backup000001", &[]);
    let dir = tempfile::tempdir().expect("dir");
    let batches: Vec<Vec<String>> = (0..16)
        .map(|batch| {
            (0..50)
                .map(|n| {
                    let name = format!("burst-{batch:02}-{n:02}.service");
                    write_unit(
                        dir.path(),
                        &name,
                        &format!("[Service]\nExecStart=/bin/sleep {}\n", 1000 + batch * 50 + n),
                    )
                })
                .collect()
        })
        .collect();
    let acknowledged: Arc<Mutex<Vec<Acknowledged>>> = Arc::default();
    let burst = {
        let (acknowledged, socket) = (acknowledged.clone(), fleet.socket());
        std::thread::spawn(move || {
            for files in batches {
                let output = Command::new(binary("fleetctl"))
                    .arg(format!("--endpoint=unix://{}", socket.display()))
                    .arg("submit")
                    .args(&files)
                    .output()
                    .expect("fleetctl");
                assert!(output.status.success(), "{output:?}");
                let names = files
                    .iter()
                    .filter_map(|file| std::path::Path::new(file).file_name())
                    .map(|name| name.to_string_lossy().into_owned())
                    .collect();
                acknowledged.lock().expect("lock").push((Instant::now(), names));
            }
        })
    };
    let first_batch = Instant::now();
    while acknowledged.lock().expect("lock").len() < 2 {
        assert!(first_batch.elapsed() < Duration::from_secs(120), "the burst never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let snapshot = dir.path().join("fleet.backup");
    let began = Instant::now();
    let taken = fleet.ok(&["backup", &snapshot.display().to_string()]);
    assert!(taken.stdout.starts_with("Backup of "), "{taken:?}");
    burst.join().expect("the burst");
    let before: Vec<String> = acknowledged
        .lock()
        .expect("lock")
        .iter()
        .filter(|(at, _)| *at < began)
        .flat_map(|(_, names)| names.clone())
        .collect();
    assert!(before.len() >= 100, "at least two batches were in before the backup");
    let live = hashes(&fleet);
    assert_eq!(live.len(), 800, "the whole burst was written");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&snapshot).expect("the backup").permissions());
    assert_eq!(mode & 0o777, 0o600, "the backup is private");

    // Not while fleetd runs; not a file cut short.
    let running = restore(&fleet, &snapshot);
    assert_eq!(running.code, 1, "{running:?}");
    assert!(running.stderr.contains("restoring only into a stopped fleetd"), "{running:?}");
    let bytes = std::fs::read(&snapshot).expect("the backup");
    let cut = dir.path().join("cut.backup");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("a cut copy");
    fleet.stop_with(libc::SIGTERM);
    let refused = restore(&fleet, &cut);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("is not a whole snapshot"), "{refused:?}");

    let restored = restore(&fleet, &snapshot);
    assert_eq!(restored.code, 0, "{restored:?}");
    assert!(restored.stdout.starts_with("restored "), "{restored:?}");
    assert!(restored.stdout.contains("registry.redb.before-restore"), "the replaced store is kept: {restored:?}");
    fleet.launch();
    let back = hashes(&fleet);
    for unit in &before {
        assert_eq!(back.get(unit), live.get(unit), "{unit} is back with its hash");
    }
    for (unit, hash) in &back {
        assert_eq!(live.get(unit), Some(hash), "{unit} is what was written");
    }
}
