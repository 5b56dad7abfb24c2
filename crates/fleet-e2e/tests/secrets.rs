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
    fleet.ok(&["submit", &uses]);
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

/// The SHA-256 of `value`, in hex, as `sha256sum` prints it.
fn sha256_hex(value: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, value).as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
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
    let expected = sha256_hex(VALUE);
    fleet.wait_until("the unit printed its credential's hash", std::time::Duration::from_secs(20), |f| {
        f.ok(&["journal", "reader.service"]).stdout.contains(&expected)
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
