//! Cluster secrets end to end on the embedded store: set from standard input or a file,
//! listed by name only, sealed at rest under the machine's own key (made 0600 when the first
//! secret is set), named by units and checked at submission, and never in the clear in the
//! store, fleetd's log or what fleetctl shows.

use std::io::Write;
use std::process::{Command, Stdio};

use fleet_e2e::{Fleetd, Ran, binary, write_unit};

/// Runs fleetctl against `fleet` with `input` on its standard input.
fn fleetctl_with_input(fleet: &Fleetd, args: &[&str], input: &[u8]) -> Ran {
    let mut child = Command::new(binary("fleetctl"))
        .arg(format!("--endpoint=unix://{}", fleet.socket().display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fleetctl");
    child.stdin.take().expect("stdin").write_all(input).expect("writing the value");
    child.wait_with_output().expect("fleetctl ran").into()
}

/// Whether `needle` occurs anywhere in the file at `path`.
fn file_holds(path: &std::path::Path, needle: &[u8]) -> bool {
    let bytes = std::fs::read(path).unwrap_or_default();
    bytes.windows(needle.len()).any(|window| window == needle)
}

const VALUE: &[u8] = b"correct-horse-battery-staple-4711";

#[test]
fn secrets_are_sealed_at_rest_named_by_units_and_never_shown() {
    let fleet = Fleetd::start("e2e0secrets00001", &[("unit_manager", "native")]);
    let key = fleet.state_dir().join("secrets.key");
    assert_eq!(fleet.ok(&["secret", "list", "--no-legend"]).stdout, "");
    assert!(!key.exists(), "the key is made when the first secret is set");

    let set = fleetctl_with_input(&fleet, &["secret", "set", "db-password"], &[VALUE, b"\n"].concat());
    assert_eq!(set.code, 0, "{set:?}");
    assert_eq!(set.stderr, format!("Set secret db-password (version 1, {} bytes)\n", VALUE.len()));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).expect("the key").permissions());
    assert_eq!(mode & 0o777, 0o600);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("value");
    std::fs::write(&file, VALUE).unwrap();
    let again = fleet.ok(&["secret", "set", "db-password", "--from-file", &file.display().to_string()]);
    assert!(again.stderr.contains("version 2"), "{again:?}");
    let listed = fleet.ok(&["secret", "list"]).stdout;
    let row = listed.lines().nth(1).unwrap_or_default();
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[..4], ["db-password", "2", &VALUE.len().to_string(), "unix:uid=0"], "{listed}");

    // Units name secrets; one that names none that exists, or names one badly, is refused
    // and nothing is stored.
    let uses = write_unit(
        dir.path(),
        "uses.service",
        "[Service]\nExecStart=/bin/sleep 100017\n[X-Fleet]\nSecret=db-password:DB\n",
    );
    let missing = write_unit(dir.path(), "missing.service", "[Service]\nExecStart=/bin/true\n[X-Fleet]\nSecret=nope\n");
    let bad =
        write_unit(dir.path(), "bad.service", "[Service]\nExecStart=/bin/true\n[X-Fleet]\nSecret=../etc/shadow\n");
    let refused = fleet.fleetctl(&["submit", &missing]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("names secret nope, which does not exist"), "{refused:?}");
    let refused = fleet.fleetctl(&["submit", &bad]);
    assert!(refused.stderr.contains("is not 1 to 128"), "{refused:?}");
    let submitted = fleet.ok(&["submit", &uses]);
    // Regression: fleetctl warned of Secret= as a key fleet does not know.
    assert_eq!(submitted.stderr, "", "no warning of Secret=: {submitted:?}");
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout.lines().count(), 1, "only the good unit");
    let cat = fleet.ok(&["cat", "uses.service"]).stdout;
    assert!(cat.contains("Secret=db-password:DB"), "{cat}");

    // A secret a unit names cannot be removed; once the unit is gone it can.
    let refused = fleet.fleetctl(&["secret", "rm", "db-password"]);
    assert!(refused.stderr.contains("is named by uses.service"), "{refused:?}");
    fleet.ok(&["destroy", "uses.service"]);
    assert_eq!(fleet.ok(&["secret", "rm", "db-password"]).stderr, "Removed secret db-password\n");
    assert_eq!(fleet.fleetctl(&["secret", "rm", "db-password"]).stderr, "Secret db-password does not exist\n");

    // Bad values: nothing stored.
    let empty = fleetctl_with_input(&fleet, &["secret", "set", "empty"], b"");
    assert!(empty.stderr.contains("may not be empty"), "{empty:?}");
    let huge = fleetctl_with_input(&fleet, &["secret", "set", "huge"], &vec![b'x'; 70_000]);
    assert!(huge.stderr.contains("at most 65536 bytes"), "{huge:?}");
    let badly = fleet.fleetctl(&["secret", "set", "-rf"]);
    assert_ne!(badly.code, 0, "{badly:?}");
    assert_eq!(fleet.ok(&["secret", "list", "--no-legend"]).stdout, "");

    // The value is nowhere in the clear: not in the store, not in fleetd's log.
    let set = fleetctl_with_input(&fleet, &["secret", "set", "api-key"], VALUE);
    assert_eq!(set.code, 0, "{set:?}");
    assert!(!file_holds(&fleet.state_dir().join("registry.redb"), VALUE), "the store holds it sealed only");
    assert!(!fleet.log().as_bytes().windows(VALUE.len()).any(|window| window == VALUE), "the log does not hold it");
    let api = fleet.api("GET", "/fleet/v1/secrets", "");
    assert!(api.contains("\"name\":\"api-key\"") && !api.contains("sealed"), "{api}");
}

#[test]
fn a_unit_reads_its_secret_as_a_credential_that_goes_with_it() {
    let credentials = tempfile::tempdir().unwrap();
    let base = credentials.path().display().to_string();
    let fleet = Fleetd::start("e2e0secrets00002", &[("unit_manager", "native"), ("credentials_dir", &base)]);
    let set = fleetctl_with_input(&fleet, &["secret", "set", "db-password"], VALUE);
    assert_eq!(set.code, 0, "{set:?}");
    let dir = tempfile::tempdir().unwrap();
    let reader = write_unit(
        dir.path(),
        "reader.service",
        "[Service]\nExecStart=/bin/sh -c 'sha256sum \"$CREDENTIALS_DIRECTORY/DB\"; exec sleep 100019'\n\
         [X-Fleet]\nSecret=db-password:DB\n",
    );
    fleet.ok(&["start", &reader]);
    let expected = fleet_e2e::sha256_hex(VALUE);
    fleet.wait_until("the unit printed its credential's hash", std::time::Duration::from_secs(20), |f| {
        f.fleetctl(&["journal", "reader.service"]).stdout.contains(&expected)
    });
    let file = credentials.path().join("e2e0secrets00002/reader.service/DB");
    assert_eq!(std::fs::read(&file).unwrap(), VALUE);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o400);
    // The value is in the credential alone: not in the unit's file, the store, the log.
    let cat = fleet.ok(&["cat", "reader.service"]).stdout;
    assert!(!cat.as_bytes().windows(VALUE.len()).any(|window| window == VALUE));
    assert!(!file_holds(&fleet.state_dir().join("registry.redb"), VALUE));
    assert!(!fleet.log().as_bytes().windows(VALUE.len()).any(|window| window == VALUE));

    fleet.ok(&["destroy", "reader.service"]);
    fleet.wait_until("the credentials went with the unit", std::time::Duration::from_secs(20), |_| !file.exists());
    assert!(!file.parent().unwrap().exists());
}

/// A pull agent has the value of a secret its unit names from its manager, over its own mTLS
/// channel; the manager, which does not run the unit, keeps no credential of it.
#[test]
fn a_pull_agent_has_its_units_secrets_from_its_manager_and_no_one_else_does() {
    use fleet_e2e::pki::ManagerPki;
    use fleet_testkit::free_port;
    let pki = ManagerPki::local();
    let port = free_port();
    let manager_credentials = tempfile::tempdir().unwrap();
    let mut config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    config.push(("credentials_dir".into(), manager_credentials.path().display().to_string()));
    let pairs: Vec<(&str, &str)> = config.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    let manager = Fleetd::start("e2e0secrets00003", &pairs);
    let set = fleetctl_with_input(&manager, &["secret", "set", "api-key"], VALUE);
    assert_eq!(set.code, 0, "{set:?}");
    let token = manager.ok(&["registration-token", "create", "--max-uses", "1", "once"]).stdout.trim().to_string();

    let pull_dir = tempfile::tempdir().unwrap();
    let pull_credentials = pull_dir.path().join("credentials");
    let pull_config = format!(
        "machine_id = pullsecrets00001\nstate_dir = {}\nunit_manager = native\nmanager_url = https://localhost:{port}\n\
         manager_ca_file = {}\npublic_ip = 127.0.0.9\nregistration_token = {token}\ncredentials_dir = {}\n",
        pull_dir.path().join("state").display(),
        pki.api_ca_file.display(),
        pull_credentials.display()
    );
    let pull = fleet_e2e::pull::PullFleetd::start_configured(pull_dir, &pull_config, &[], &[]);
    manager.wait_until("the pull agent joins", std::time::Duration::from_secs(30), |f| {
        f.ok(&["list-machines", "--full", "--no-legend"]).stdout.contains("pullsecrets00001")
    });
    let dir = tempfile::tempdir().unwrap();
    let pulled = write_unit(
        dir.path(),
        "pulled-secret.service",
        "[Service]\nExecStart=/bin/sh -c 'sha256sum \"$CREDENTIALS_DIRECTORY/key\"; exec sleep 100021'\n\
         [X-Fleet]\nMachineID=pullsecrets00001\nSecret=api-key:key\n",
    );
    manager.ok(&["start", "--no-block", &pulled]);
    let expected = fleet_e2e::sha256_hex(VALUE);
    manager.wait_until(
        "the pull agent's unit printed its credential's hash",
        std::time::Duration::from_secs(30),
        |f| f.fleetctl(&["journal", "pulled-secret.service"]).stdout.contains(&expected),
    );
    let delivered = pull_credentials.join("pullsecrets00001/pulled-secret.service/key");
    assert_eq!(std::fs::read(&delivered).unwrap(), VALUE);
    // Not kept with the desired state the pull agent keeps on disk, nor in its log.
    let state = pull.dir.path().join("state");
    assert_eq!(files_holding(&state, VALUE), Vec::<std::path::PathBuf>::new(), "kept nowhere on disk");
    assert!(!pull.log().as_bytes().windows(VALUE.len()).any(|window| window == VALUE));
    // The manager runs nothing of it: no credential there.
    assert_eq!(std::fs::read_dir(manager_credentials.path()).map(|dir| dir.count()).unwrap_or(0), 0);

    // The machine's own certificate has its unit's secrets, no other unit's; revoked, nothing.
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("machine-credentials.json")).unwrap()).unwrap();
    let certificates = tempfile::tempdir().unwrap();
    let (cert, key) = (certificates.path().join("cert.pem"), certificates.path().join("key.pem"));
    std::fs::write(&cert, kept["certificate"].as_str().expect("its certificate")).unwrap();
    std::fs::write(&key, kept["key"].as_str().expect("its key")).unwrap();
    let caller = fleet_e2e::https::Caller::new(
        &format!("https://localhost:{port}"),
        Some(&pki.api_ca_file),
        fleet_e2e::https::Credentials { token: None, certificate: Some((&cert, &key)) },
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ask = |unit: &str| {
        let path = format!("/fleet/v1/agents/pullsecrets00001/secrets/{unit}");
        runtime.block_on(caller.call("GET", &path, None)).expect("an answer")
    };
    let encoded = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(VALUE)
    };
    let own = ask("pulled-secret.service");
    assert_eq!(own.status, 200, "{}", own.body);
    assert!(own.body.contains(&encoded));
    let other = ask("someone-elses.service");
    assert_eq!(other.status, 403, "{}", other.body);

    // A new value reaches the pull agent's unit by a restart its rollout follows: the pins
    // travel in the machine's work, the version it was given in its reports.
    let rotated = fleetctl_with_input(&manager, &["secret", "set", "api-key", "--min-ready", "1s"], b"rotated-value");
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let waited = manager.fleetctl(&["rollout", "status", "secret-api-key", "--wait"]);
    assert_eq!(waited.code, 0, "{waited:?}");
    let expected = fleet_e2e::sha256_hex(b"rotated-value");
    manager.wait_until("the unit printed the new credential's hash", std::time::Duration::from_secs(30), |f| {
        f.fleetctl(&["journal", "pulled-secret.service"]).stdout.contains(&expected)
    });
    assert_eq!(std::fs::read(&delivered).unwrap(), b"rotated-value");
    let encoded = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(b"rotated-value")
    };

    manager.ok(&["machine", "revoke", "pullsecrets00001"]);
    let revoked = ask("pulled-secret.service");
    assert!(matches!(revoked.status, 401 | 403), "{}: {}", revoked.status, revoked.body);
    assert!(!revoked.body.contains(&encoded));
}

/// Every file below `dir` that holds `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(path) = dirs.pop() {
        for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if file_holds(&path, needle) {
                found.push(path);
            }
        }
    }
    found
}

/// On etcd: the value reaches etcd sealed (its data directory, write-ahead log included,
/// never holds it), and only the member that runs the unit writes the credential.
#[test]
fn on_etcd_only_the_member_that_runs_the_unit_has_the_value() {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("secrets.key");
    fleet_secrets::ClusterKeys::generate().unwrap().create(&key).unwrap();
    let credentials = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let cluster = fleet_e2e::Cluster::start(2, |index| {
        vec![
            ("unit_manager".into(), "native".into()),
            ("secrets_key_file".into(), key.display().to_string()),
            ("credentials_dir".into(), credentials[index].path().display().to_string()),
        ]
    });
    let (first, second) = (&cluster.members[0], &cluster.members[1]);
    let set = fleetctl_with_input(first, &["secret", "set", "db-password"], VALUE);
    assert_eq!(set.code, 0, "{set:?}");
    let dir = tempfile::tempdir().unwrap();
    let pinned = write_unit(
        dir.path(),
        "pinned-secret.service",
        &format!(
            "[Service]\nExecStart=/bin/sh -c 'sha256sum \"$CREDENTIALS_DIRECTORY/DB\"; exec sleep 100023'\n\
             [X-Fleet]\nMachineID={}\nSecret=db-password:DB\n",
            fleet_e2e::member_id(1)
        ),
    );
    first.ok(&["start", "--no-block", &pinned]);
    let expected = fleet_e2e::sha256_hex(VALUE);
    second.wait_until("the unit printed its credential's hash", std::time::Duration::from_secs(30), |f| {
        f.fleetctl(&["journal", "pinned-secret.service"]).stdout.contains(&expected)
    });
    assert_eq!(files_holding(credentials[1].path(), VALUE).len(), 1, "the running member's credential");
    assert!(files_holding(credentials[0].path(), VALUE).is_empty(), "nothing on the other member");
    for member in &cluster.members {
        assert!(files_holding(member.dir.path(), VALUE).is_empty(), "nothing in a member's state or units");
        assert!(!member.log().as_bytes().windows(VALUE.len()).any(|window| window == VALUE));
    }
    assert!(files_holding(&cluster.etcd.data_dir(), VALUE).is_empty(), "etcd holds it sealed only");

    // A new value set through one member reaches the unit on the other by its rollout.
    let rotated = fleetctl_with_input(first, &["secret", "set", "db-password", "--min-ready", "1s"], b"rotated-db");
    assert_eq!(rotated.code, 0, "{rotated:?}");
    assert_eq!(first.fleetctl(&["rollout", "status", "secret-db-password", "--wait"]).code, 0);
    let expected = fleet_e2e::sha256_hex(b"rotated-db");
    second.wait_until("the unit printed the new credential's hash", std::time::Duration::from_secs(30), |f| {
        f.fleetctl(&["journal", "pinned-secret.service"]).stdout.contains(&expected)
    });
    assert!(files_holding(credentials[0].path(), b"rotated-db").is_empty(), "still nothing on the other member");
}

/// Rotating the cluster's secrets key: a new key in front, fleetd told (SIGHUP), every value
/// sealed again, the old key dropped; the units still have their values.
#[test]
fn the_secrets_key_rotates_without_losing_a_value() {
    let credentials = tempfile::tempdir().unwrap();
    let base = credentials.path().display().to_string();
    let fleet = Fleetd::start("e2e0secrets00004", &[("unit_manager", "native"), ("credentials_dir", &base)]);
    for name in ["one", "two"] {
        assert_eq!(fleetctl_with_input(&fleet, &["secret", "set", name], VALUE).code, 0);
    }
    let key = fleet.state_dir().join("secrets.key");
    let rotate = |extra: &[&str]| {
        let output = Command::new(binary("fleetd"))
            .arg("-rotate-secrets-key")
            .arg(&key)
            .args(extra)
            .output()
            .expect("fleetd -rotate-secrets-key");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let said = rotate(&[]);
    let new_key = said.split("now seals with key ").nth(1).and_then(|rest| rest.split(';').next()).unwrap().to_string();
    fleet.signal(libc::SIGHUP);
    fleet.wait_until("fleetd reloaded", std::time::Duration::from_secs(20), |f| {
        f.log().contains("Reloading configuration")
    });
    let resealed = fleet.ok(&["secret", "reseal"]);
    assert_eq!(resealed.stderr, format!("Sealed 2 secrets again under key {new_key} (0 were already)\n"));
    assert!(fleet.ok(&["secret", "reseal"]).stderr.contains("Sealed 0 secrets again"), "once is enough");
    assert!(rotate(&["-drop-old-keys"]).contains(&format!("it holds {new_key}\n")));
    fleet.signal(libc::SIGHUP);
    fleet.wait_until("fleetd reloaded again", std::time::Duration::from_secs(20), |f| {
        f.log().matches("Reloading configuration").count() == 2
    });
    let dir = tempfile::tempdir().unwrap();
    let reader = write_unit(
        dir.path(),
        "rotated.service",
        "[Service]\nExecStart=/bin/sh -c 'sha256sum \"$CREDENTIALS_DIRECTORY/two\"; exec sleep 100027'\n[X-Fleet]\nSecret=two\n",
    );
    fleet.ok(&["start", &reader]);
    let expected = fleet_e2e::sha256_hex(VALUE);
    fleet.wait_until("the unit has the value under the new key", std::time::Duration::from_secs(20), |f| {
        f.fleetctl(&["journal", "rotated.service"]).stdout.contains(&expected)
    });
}

/// A unit of `rot@.service` (instance `%i`) that appends `PID start-ms` to `<out>/%i.starts`
/// when it starts, fails at once when its credential says `bad`, and keeps `PID value` of
/// what its credential holds in `<out>/%i.seen`.
fn rotating_units(out: &std::path::Path) -> String {
    let script = out.join("reader.sh");
    std::fs::write(
        &script,
        "out=\"$1\"; i=\"$2\"\n\
         echo \"$$ $(date +%s%3N)\" >> \"$out/$i.starts\"\n\
         while :; do\n\
           v=$(cat \"$CREDENTIALS_DIRECTORY/DB\")\n\
           [ \"$v\" = bad ] && exit 1\n\
           printf '%s %s\\n' \"$$\" \"$v\" > \"$out/$i.seen.new\" && mv \"$out/$i.seen.new\" \"$out/$i.seen\"\n\
           sleep 0.2\n\
         done\n",
    )
    .expect("the script");
    write_unit(
        out,
        "rot@.service",
        &format!("[Service]\nExecStart=/bin/sh {} {} %i\n[X-Fleet]\nSecret=db:DB\n", script.display(), out.display()),
    )
}

/// What instance `i` last saw: its PID and the credential's value.
fn seen(out: &std::path::Path, i: u32) -> Option<(String, String)> {
    let text = std::fs::read_to_string(out.join(format!("{i}.seen"))).ok()?;
    let (pid, value) = text.trim_end().split_once(' ')?;
    Some((pid.to_string(), value.to_string()))
}

/// When instance `i` started, in milliseconds since the epoch, each time it did.
fn starts(out: &std::path::Path, i: u32) -> Vec<u64> {
    let text = std::fs::read_to_string(out.join(format!("{i}.starts"))).unwrap_or_default();
    text.lines().filter_map(|line| line.split_once(' ')?.1.parse().ok()).collect()
}

/// Waits until every instance sees `value`; their PIDs then.
fn all_see(fleet: &Fleetd, out: &std::path::Path, value: &str) -> Vec<String> {
    fleet.wait_until(&format!("every unit sees {value}"), std::time::Duration::from_secs(90), |_| {
        (1..=3).all(|i| seen(out, i).is_some_and(|(_, seen)| seen == value))
    });
    (1..=3).map(|i| seen(out, i).map(|(pid, _)| pid).unwrap_or_default()).collect()
}

#[test]
fn a_new_value_restarts_its_units_in_waves_or_reaches_them_without_a_restart() {
    let fleet = Fleetd::start("e2e0secrets00006", &[("unit_manager", "native")]);
    let out = tempfile::tempdir().unwrap();
    let template = rotating_units(out.path());
    assert_eq!(fleetctl_with_input(&fleet, &["secret", "set", "db"], b"one").code, 0);
    fleet.ok(&["submit", &template]);
    fleet.ok(&["start", "rot@1.service", "rot@2.service", "rot@3.service"]);
    let before = all_see(&fleet, out.path(), "one");

    // One unit at a time, each staying up 2 s before the next goes.
    let set = fleetctl_with_input(
        &fleet,
        &["secret", "set", "db", "--max-unavailable", "1", "--min-ready", "2s", "--deadline", "60s"],
        b"two",
    );
    assert_eq!(set.code, 0, "{set:?}");
    assert!(set.stderr.contains("fleetctl rollout status secret-db"), "{set:?}");
    // What the rollout records, read while it runs: never two units in flight, each one
    // ready (held for min-ready) before it is done. How long min-ready lasts is
    // rollout.rs's unit tests' to check: the units' own clocks are the machine's load's.
    let mut samples = Vec::new();
    fleet.wait_until("the rollout is done", std::time::Duration::from_secs(90), |f| {
        let answer = f.api("GET", "/fleet/v1/rollouts/secret-db", "");
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let rollout: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let steps: Vec<String> = rollout["units"]
            .as_array()
            .map(|units| units.iter().map(|unit| unit["step"].as_str().unwrap_or("?").to_string()).collect())
            .unwrap_or_default();
        samples.push(steps);
        rollout["state"] == "done"
    });
    assert_eq!(samples.last().map(Vec::len), Some(3), "the rollout shows its units: {samples:?}");
    for steps in &samples {
        let in_flight = steps.iter().filter(|step| *step == "replacing" || *step == "ready").count();
        assert!(in_flight <= 1, "one unit at a time: {steps:?} in {samples:?}");
    }
    let waited = fleet.fleetctl(&["rollout", "status", "secret-db", "--wait"]);
    assert_eq!(waited.code, 0, "the rollout is done: {waited:?}");
    let after = all_see(&fleet, out.path(), "two");
    for i in 0..3 {
        assert_ne!(before[i], after[i], "rot@{} was restarted with the new value", i + 1);
        let starts = starts(out.path(), i as u32 + 1);
        assert_eq!(starts.len(), 2, "rot@{} started twice: {starts:?}", i + 1);
    }
    let rollout = fleet.api("GET", "/fleet/v1/rollouts/secret-db", "");
    assert!(rollout.contains("\"secret\":\"db\"") && rollout.contains("\"secretVersion\":2"), "{rollout}");

    // Without a restart: the same processes read the new value where they read the old.
    let set = fleetctl_with_input(&fleet, &["secret", "set", "db", "--no-restart"], b"three");
    assert_eq!(set.code, 0, "{set:?}");
    assert!(set.stderr.contains("Written where 3 unit(s) read it; none restarted"), "{set:?}");
    let kept = all_see(&fleet, out.path(), "three");
    assert_eq!(kept, after, "no unit was restarted");
    assert!((1..=3).all(|i| starts(out.path(), i).len() == 2));
    let refused = fleetctl_with_input(&fleet, &["secret", "set", "db", "--no-restart", "--max-unavailable", "1"], b"x");
    assert_eq!(refused.code, 2, "--no-restart takes no rollout settings: {refused:?}");
}

#[test]
fn a_value_that_breaks_its_units_is_taken_back_by_itself() {
    let fleet = Fleetd::start("e2e0secrets00007", &[("unit_manager", "native")]);
    let out = tempfile::tempdir().unwrap();
    let template = rotating_units(out.path());
    assert_eq!(fleetctl_with_input(&fleet, &["secret", "set", "db"], b"good").code, 0);
    fleet.ok(&["submit", &template]);
    fleet.ok(&["start", "rot@1.service", "rot@2.service", "rot@3.service"]);
    let before = all_see(&fleet, out.path(), "good");

    let set = fleetctl_with_input(
        &fleet,
        &["secret", "set", "db", "--max-unavailable", "1", "--min-ready", "1s", "--auto-revert"],
        b"bad",
    );
    assert_eq!(set.code, 0, "{set:?}");
    fleet.wait_until("the rollout reverted itself", std::time::Duration::from_secs(90), |f| {
        f.api("GET", "/fleet/v1/rollouts/secret-db?units=false", "").contains("\"state\":\"reverted\"")
    });
    let after = all_see(&fleet, out.path(), "good");
    let restarted: Vec<u32> = (1..=3).filter(|&i| starts(out.path(), i).len() > 1).collect();
    assert_eq!(restarted.len(), 1, "only the first wave met the bad value: {restarted:?}");
    for i in 1..=3usize {
        if !restarted.contains(&(i as u32)) {
            assert_eq!(before[i - 1], after[i - 1], "rot@{i} was never restarted");
        }
    }
    let listed = fleet.ok(&["secret", "list", "-o", "json"]).stdout;
    assert!(
        listed.contains("\"version\": 2") && listed.contains("\"kept\": [\n      1\n    ]"),
        "the old value is kept: {listed}"
    );

    // A good value after that rolls out from where the units are.
    let set = fleetctl_with_input(&fleet, &["secret", "set", "db", "--max-unavailable", "100%"], b"better");
    assert_eq!(set.code, 0, "{set:?}");
    assert_eq!(fleet.fleetctl(&["rollout", "status", "secret-db", "--wait"]).code, 0);
    all_see(&fleet, out.path(), "better");
    let listed = fleet.api("GET", "/fleet/v1/secrets", "");
    assert!(listed.contains("\"version\":3") && listed.contains("\"kept\":[1]"), "{listed}");
}
