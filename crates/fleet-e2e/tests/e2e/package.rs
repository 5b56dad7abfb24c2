//! The Debian package (issue 69): scripts/deb.sh builds it from the binaries the tests use,
//! dpkg installs it into a clean root without a chroot (its maintainer scripts honour
//! DPKG_ROOT; no system systemd is booted), and the test checks what is where, with which
//! modes, the fleet group, that a member of that group reaches the API socket and a stranger
//! does not, and that a purge leaves only what the operator made.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_e2e::{Ran, binary_dir, poll_until};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(command: &mut Command) -> Ran {
    Ran::from(command.output().expect("run"))
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|error| panic!("{}: {error}", path.display())).permissions().mode()
        & 0o7777
}

/// A root dpkg can install into: its database, and the account files the group goes in.
fn clean_root(root: &Path) {
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "etc"] {
        std::fs::create_dir_all(root.join(dir)).expect("dir");
    }
    for (file, text) in [
        ("var/lib/dpkg/status", ""),
        ("var/lib/dpkg/available", ""),
        ("etc/group", "root:x:0:\n"),
        ("etc/gshadow", "root:*::\n"),
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/shadow", "root:*:19000:0:99999:7:::\n"),
    ] {
        std::fs::write(root.join(file), text).expect("file");
    }
}

fn dpkg(root: &Path, args: &[&str]) -> Ran {
    let ran = run(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args(["--force-script-chrootless", "--log=/dev/null"])
        .args(args));
    assert_eq!(ran.code, 0, "dpkg {args:?}: {ran:?}");
    ran
}

fn group_id(root: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(root.join("etc/group"))
        .expect("etc/group")
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:x:"))?.split(':').next()?.parse().ok())
}

#[test]
fn the_package_installs_into_a_clean_root_serves_the_fleet_group_and_purges_clean() {
    let work = tempfile::tempdir().expect("dir");
    let built = run(Command::new(repository().join("scripts/deb.sh"))
        .env("FLEET_BINARIES", binary_dir())
        .env("OUT_DIR", work.path().join("out"))
        .env("DEB_COMPRESSION", "none"));
    assert_eq!(built.code, 0, "{built:?}");
    let deb = built.stdout.trim().to_string();
    assert!(deb.ends_with(&format!("fleet_{}_amd64.deb", env!("CARGO_PKG_VERSION"))), "{deb}");

    let root = work.path().join("root");
    clean_root(&root);
    // The clean root has no libc6 or passwd package of its own: the host's serve.
    dpkg(&root, &["--force-depends", "-i", &deb]);
    for (path, expected) in [
        ("usr/bin/fleetd", 0o755),
        ("usr/bin/fleetctl", 0o755),
        ("etc/fleet", 0o700),
        ("etc/fleet/fleet.conf", 0o600),
        ("lib/systemd/system/fleet.service", 0o644),
        ("lib/systemd/system/fleet.socket", 0o644),
        ("usr/share/man/man8/fleetd.8.gz", 0o644),
        ("usr/share/man/man1/fleetctl.1.gz", 0o644),
        ("usr/share/bash-completion/completions/fleetctl", 0o644),
        ("usr/share/zsh/vendor-completions/_fleetctl", 0o644),
        ("usr/share/fish/vendor_completions.d/fleetctl.fish", 0o644),
        ("usr/share/doc/fleet/changelog.gz", 0o644),
    ] {
        assert_eq!(mode(&root.join(path)), expected, "{path}");
    }
    let socket_unit = std::fs::read_to_string(root.join("lib/systemd/system/fleet.socket")).expect("fleet.socket");
    assert!(socket_unit.contains("SocketGroup=fleet\n") && socket_unit.contains("SocketMode=0660\n"), "{socket_unit}");
    let service = std::fs::read_to_string(root.join("lib/systemd/system/fleet.service")).expect("fleet.service");
    assert!(service.contains("ExecStart=/usr/bin/fleetd\n"), "{service}");
    let conffiles = run(Command::new("dpkg-query")
        .arg(format!("--admindir={}", root.join("var/lib/dpkg").display()))
        .args(["-W", "-f=${Conffiles}", "fleet"]));
    assert!(conffiles.stdout.contains("/etc/fleet/fleet.conf "), "a conffile: {conffiles:?}");
    let gid = group_id(&root, "fleet").expect("the fleet group");

    // The installed fleetd on the installed fleet.conf, its socket made as fleet.socket makes
    // it (root:fleet 0660), in a directory others may pass through.
    let served = work.path().join("served");
    std::fs::create_dir_all(&served).expect("dir");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).expect("mode");
    std::fs::set_permissions(&served, std::fs::Permissions::from_mode(0o755)).expect("mode");
    let socket = served.join("fleet.sock");
    let mut config = std::fs::read_to_string(root.join("etc/fleet/fleet.conf")).expect("fleet.conf");
    config.push_str(&format!(
        "\nmachine_id = e2e0package000001\nstate_dir = {}\napi_listen = unix://{}\nunit_manager = native\n",
        work.path().join("state").display(),
        socket.display()
    ));
    let config_path = work.path().join("fleet.conf");
    std::fs::write(&config_path, config).expect("fleet.conf");
    let fleetd = Command::new(root.join("usr/bin/fleetd")).arg("-config").arg(&config_path).spawn().expect("fleetd");
    let _stop = KillOnDrop(fleetd);
    poll_until("fleetd makes its socket", Duration::from_secs(30), || socket.exists(), String::new);
    std::os::unix::fs::chown(&socket, Some(0), Some(gid)).expect("chown");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660)).expect("mode");
    let as_user = |groups: &str| {
        run(Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", &format!("--groups={groups}"), "--inh-caps=-all"])
            .arg(root.join("usr/bin/fleetctl"))
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .args(["list-machines", "--no-legend", "--full", "--fields", "machine"])
            .env_remove("FLEETCTL_ENDPOINT"))
    };
    let listed_as_root =
        || {
            run(Command::new(root.join("usr/bin/fleetctl"))
                .arg(format!("--endpoint=unix://{}", socket.display()))
                .args(["list-machines", "--no-legend", "--full", "--fields", "machine"]))
            .stdout
        };
    poll_until(
        "fleetd lists its machine",
        Duration::from_secs(30),
        || listed_as_root().contains("e2e0package"),
        String::new,
    );
    let member = as_user(&gid.to_string());
    assert_eq!(member.code, 0, "a member of the fleet group: {member:?}");
    assert_eq!(member.stdout, "e2e0package000001\n");
    let stranger = as_user("65534");
    assert_ne!(stranger.code, 0, "{stranger:?}");
    assert!(stranger.stderr.to_lowercase().contains("permission denied"), "{stranger:?}");
    drop(_stop);

    // What the operator made stays; what the package and fleetd made goes.
    std::fs::create_dir_all(root.join("etc/fleet/tls")).expect("dir");
    std::fs::write(root.join("etc/fleet/tls/api-ca.pem"), "the operator's").expect("file");
    std::fs::create_dir_all(root.join("var/lib/fleet")).expect("dir");
    std::fs::write(root.join("var/lib/fleet/registry.redb"), "a store").expect("file");
    dpkg(&root, &["--purge", "fleet"]);
    for gone in [
        "usr/bin/fleetd",
        "usr/bin/fleetctl",
        "etc/fleet/fleet.conf",
        "lib/systemd/system/fleet.socket",
        "var/lib/fleet",
    ] {
        assert!(!root.join(gone).exists(), "{gone} is left");
    }
    assert_eq!(group_id(&root, "fleet"), None, "the group is gone");
    assert!(root.join("etc/fleet/tls/api-ca.pem").exists(), "the operator's file stays");
    let left: Vec<String> = walk(&root)
        .into_iter()
        .filter(|path| !path.starts_with("var/lib/dpkg") && !path.starts_with("etc/fleet"))
        .filter(|path| {
            !["etc", "var", "var/lib", "etc/group", "etc/gshadow", "etc/passwd", "etc/shadow"].contains(&path.as_str())
        })
        // The account tools' own backups of what they changed.
        .filter(|path| !["etc/group-", "etc/gshadow-"].contains(&path.as_str()))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "nothing else is left");
}

/// Every path under `root`, relative to it.
fn walk(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("dir").flatten() {
            let path = entry.path();
            found.push(path.strip_prefix(root).expect("under root").display().to_string());
            if path.is_dir() && !path.is_symlink() {
                pending.push(path);
            }
        }
    }
    found.sort();
    found
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}
