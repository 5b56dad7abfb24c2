//! The README's steps as a newcomer follows them, taken from README.md itself: its minimal
//! fleet.conf files for one machine, for members of an etcd cluster and for a pull agent, the
//! TLS lines `fleetd -make-certificates` prints, and its fleetctl lines. Only this test's
//! addresses and paths are put in (each replaced text must be there), so a README that drifts
//! from what fleet does fails here. The quick start script has its own test (`quickstart.rs`).

use std::process::Command;
use std::time::Duration;

use fleet_e2e::pull::PullFleetd;
use fleet_e2e::{EtcdServer, Fleetd, Ran, binary, examples_dir};

fn readme() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The text of the README's fenced block of `kind` whose first line is `first`.
fn block(readme: &str, kind: &str, first: &str) -> String {
    let fence = format!("```{kind}\n{first}\n");
    let start = readme.find(&fence).unwrap_or_else(|| panic!("the README has no {kind} block starting {first:?}"));
    let body = &readme[start + format!("```{kind}\n").len()..];
    body[..body.find("```").expect("a closed block")].to_string()
}

/// `text` with each `(from, to)` put in; every `from` must be there.
fn put_in(text: &str, replacements: &[(&str, &str)]) -> String {
    replacements.iter().fold(text.to_string(), |text, (from, to)| {
        assert!(text.contains(from), "{from:?} is not in the README's text:\n{text}");
        text.replace(from, to)
    })
}

/// The `key = value` lines of a fleet.conf text, comments left out.
fn settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("not a fleet.conf line: {line}"));
            (key.trim().to_string(), value.trim().to_string())
        })
        .collect()
}

fn start(machine_id: &str, settings: &[(String, String)]) -> Fleetd {
    let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Fleetd::start(machine_id, &pairs)
}

/// `list-machines` rows of `machine,metadata,connection,leader`, sorted.
fn machines(fleetd: &Fleetd) -> Vec<String> {
    let listed =
        fleetd.ok(&["list-machines", "--full", "--no-legend", "--fields", "machine,metadata,connection,leader"]);
    let mut rows: Vec<String> =
        listed.stdout.lines().map(|row| row.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    rows.sort();
    rows
}

use fleet_testkit::free_port;

#[test]
fn one_machine_and_three_etcd_members_run_on_the_readme_s_fleet_conf() {
    let readme = readme();
    let one = start("e2e0readme000001", &settings(&block(&readme, "ini", "# one machine")));
    let hello = examples_dir().join("hello.service").display().to_string();
    one.ok(&["start", &hello]);
    assert_eq!(machines(&one), ["e2e0readme000001 role=web embedded engine"]);

    let etcd = EtcdServer::start();
    let member =
        block(&readme, "ini", "# a member of an etcd cluster (every member the same etcd, each its own machine ID)");
    let ids = ["e2e0readme000011", "e2e0readme000012", "e2e0readme000013"];
    let members: Vec<Fleetd> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| {
            let ip = format!("127.0.0.{}", index + 1);
            let servers = "http://10.0.0.5:2379,http://10.0.0.6:2379,http://10.0.0.7:2379";
            let text = put_in(&member, &[(servers, &etcd.endpoint()), ("10.0.0.21", &ip)]);
            start(id, &settings(&text))
        })
        .collect();
    members[2].wait_until("every member is listed with its leader", Duration::from_secs(20), |fleetd| {
        let rows = machines(fleetd);
        rows.len() == 3 && rows.iter().any(|row| row.ends_with(" engine"))
    });
    let rows = machines(&members[2]);
    for (row, id) in rows.iter().zip(ids) {
        assert!(row.starts_with(&format!("{id} region=eu,role=web etcd ")), "{rows:?}");
    }
    assert_eq!(rows.iter().filter(|row| row.ends_with(" engine")).count(), 1, "one engine leads: {rows:?}");
    members[0].ok(&["start", &hello]);
    members[1].wait_until("hello runs on the cluster", Duration::from_secs(20), |fleetd| {
        fleetd.ok(&["list-units", "--no-legend", "--fields", "unit,active"]).stdout.contains("hello.service\tactive")
    });
}

#[test]
fn tls_made_in_one_step_and_a_pull_agent_join_as_the_readme_says() {
    let readme = readme();
    let dir = tempfile::tempdir().expect("dir");
    let tls = dir.path().join("tls").display().to_string();
    let made = Ran::from(
        Command::new(binary("fleetd"))
            .args(["-make-certificates", &tls, "-hosts", "localhost"])
            .output()
            .expect("run fleetd"),
    );
    assert_eq!(made.code, 0, "{made:?}");
    // The README's fleet.conf lines are the ones the command prints, in the README's directory.
    let server = block(&readme, "ini", "# fleet.conf of a fleetd serving the API over HTTPS");
    let server = put_in(&server, &[("/etc/fleet/tls", &tls)]);
    for line in server.lines().filter(|line| !line.starts_with('#')) {
        assert!(made.stdout.lines().any(|printed| printed == line), "{line:?} is not printed:\n{}", made.stdout);
    }
    let port = free_port();
    let listen = format!("unix://{{socket}},https://127.0.0.1:{port}");
    let server = put_in(&server, &[("unix:///var/run/fleet.sock,https://0.0.0.0:4002", &listen)]);
    let manager = start("e2e0readme000021", &settings(&server));

    let admin = block(
        &readme,
        "sh",
        "fleetctl --endpoint https://manager.example.com:4002 --ca-file /etc/fleet/tls/api-ca.pem --cert-file /etc/fleet/tls/admin.pem --key-file /etc/fleet/tls/admin-key.pem list-machines",
    );
    let admin = put_in(&admin, &[("manager.example.com:4002", &format!("localhost:{port}")), ("/etc/fleet/tls", &tls)]);
    let flags: Vec<&str> = admin.split_whitespace().skip(1).filter(|word| *word != "list-machines").collect();
    let fleetctl = |args: &[&str]| {
        Ran::from(
            Command::new(binary("fleetctl"))
                .args(&flags)
                .args(args)
                .env_remove("FLEETCTL_ENDPOINT")
                .env_remove("FLEETCTL_TOKEN")
                .output()
                .expect("run fleetctl"),
        )
    };
    let listed = fleetctl(&["list-machines", "--full"]);
    assert!(listed.code == 0 && listed.stdout.contains("e2e0readme000021"), "{listed:?}");

    // The README's registration token, made over HTTPS as the administrator.
    let create = "fleetctl registration-token create --ttl 24h --max-uses 10 --metadata rack=r1 rack1";
    assert!(readme.contains(&format!("`{create}`")), "the README shows {create:?}");
    let created = fleetctl(&create.split_whitespace().skip(1).collect::<Vec<_>>());
    assert_eq!(created.code, 0, "{created:?}");
    let token = created.stdout.trim();

    let agent_dir = tempfile::tempdir().expect("dir");
    let pull = block(&readme, "ini", "# a pull agent behind NAT (see \"Machines behind NAT\" for the manager's side)");
    let pull = put_in(
        &pull,
        &[
            ("https://manager.example.com:4002", &format!("https://localhost:{port}")),
            ("/etc/fleet/tls", &tls),
            ("fleetreg_…", token),
        ],
    );
    let config = format!(
        "machine_id = readme-edge-1\nstate_dir = {}\nunit_manager = native\n{pull}",
        agent_dir.path().join("state").display()
    );
    let agent = PullFleetd::start_configured(agent_dir, &config, &[], &[]);
    manager.wait_until("the pull agent joined", Duration::from_secs(20), |manager| {
        machines(manager).iter().any(|row| row.starts_with("readme-edge-1 "))
    });
    let rows = machines(&manager);
    assert!(rows.contains(&"readme-edge-1 rack=r1 pull -".to_string()), "{rows:?}\n{}", agent.log());
    drop(agent);
}

/// A shell a newcomer types the README's lines into, in its own process group: what it
/// starts in the background is ended with it, whatever the test's outcome.
struct Typing {
    shell: std::process::Child,
    input: std::process::ChildStdin,
    output: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Typing {
    fn start(dir: &std::path::Path) -> Self {
        use std::os::unix::process::CommandExt;
        let output = dir.join("shell.out");
        let log = std::fs::File::create(&output).expect("the shell's output");
        let path = format!("{}:{}", fleet_e2e::binary_dir().display(), std::env::var("PATH").unwrap_or_default());
        let mut shell = Command::new("bash")
            .arg("-s")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .env("PATH", path)
            .env_remove("FLEETCTL_ENDPOINT")
            .env_remove("FLEETCTL_TOKEN")
            .stdin(std::process::Stdio::piped())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("bash");
        let input = shell.stdin.take().expect("the shell's input");
        Self { shell, input, output, dir: dir.to_path_buf() }
    }

    /// Types `lines`, then waits until the shell has run them: what they printed.
    fn run(&mut self, lines: &str) -> String {
        use std::io::Write;
        let before = self.said().len();
        let marker = format!("__typed_{before}__");
        writeln!(self.input, "{lines}\necho {marker}").expect("type into the shell");
        fleet_e2e::poll_until(
            "the shell ran the lines",
            Duration::from_secs(120),
            || self.said().contains(&marker),
            || self.said_and_logs(),
        );
        let said = self.said();
        said[before..said.find(&marker).unwrap_or(said.len())].to_string()
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    /// What the shell said, then the last lines of every log the walkthrough wrote under its
    /// directory: what a failure is read from.
    fn said_and_logs(&self) -> String {
        let mut text = self.said();
        let mut pending = vec![self.dir.clone()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for path in entries.flatten().map(|entry| entry.path()) {
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|extension| extension == "log") {
                    let log = std::fs::read_to_string(&path).unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    let tail = lines[lines.len().saturating_sub(60)..].join("\n");
                    text.push_str(&format!("\n--- {} ---\n{tail}\n", path.display()));
                }
            }
        }
        text
    }

    /// Types `exit`: the shell ends once it has run what it was given.
    fn exit(&mut self) {
        use std::io::Write;
        writeln!(self.input, "exit").expect("type into the shell");
    }

    /// Whether the shell, or anything it started, is still running.
    fn any_left(&mut self) -> bool {
        // An ended shell is a member of its group until it is waited for.
        let _ = self.shell.try_wait();
        let group = i32::try_from(self.shell.id()).expect("a pid");
        // SAFETY: signal 0 only asks whether the process group exists.
        unsafe { libc::kill(-group, 0) == 0 }
    }
}

impl Drop for Typing {
    fn drop(&mut self) {
        let group = i32::try_from(self.shell.id()).expect("a pid");
        // SAFETY: signals only the shell's own process group.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.shell.wait();
    }
}

/// Issue 68: "a cluster on one box", etcd, three members and a pull agent, typed into one
/// shell as the README has them; only this test's directory and ports are put in.
#[test]
fn a_cluster_on_one_box_as_the_readme_walks_through_it() {
    let readme = readme();
    let dir = tempfile::tempdir().expect("dir");
    let box_dir = dir.path().join("box").display().to_string();
    let (client, peer, manager) = (free_port().to_string(), free_port().to_string(), free_port().to_string());
    let members = put_in(
        &block(&readme, "sh", "# a cluster on one box: etcd, three members (the first a manager of pull agents too)"),
        &[("/tmp/fleet-box", &box_dir), ("2379", &client), ("2380", &peer), ("4002", &manager)],
    );
    let agent = put_in(
        &block(&readme, "sh", "# a pull agent, joining through the first member with a registration token"),
        &[("4002", &manager)],
    );
    let units = block(&readme, "sh", "# four machines, four units");
    let mut shell = Typing::start(dir.path());
    shell.run(&members);
    let machines_seen = || {
        let socket = format!("unix://{box_dir}/1/fleet.sock");
        let listed = Command::new(binary("fleetctl"))
            .args(["--endpoint", &socket, "list-machines", "--no-legend", "--full", "--fields", "machine,connection"])
            .output()
            .expect("fleetctl");
        String::from_utf8_lossy(&listed.stdout).into_owned()
    };
    fleet_e2e::poll_until(
        "the three members are listed",
        Duration::from_secs(60),
        || machines_seen().lines().count() == 3,
        || shell.said_and_logs(),
    );
    shell.run(&agent);
    fleet_e2e::poll_until(
        "the pull agent joined",
        Duration::from_secs(60),
        || machines_seen().contains("box-agent\tpull"),
        || shell.said_and_logs(),
    );
    let said = shell.run(&units);
    for n in 1..=4 {
        assert!(said.contains(&format!("Unit hello@{n}.service launched on ")), "{said}");
        assert!(
            said.lines()
                .any(|line| line.starts_with(&format!("hello@{n}.service\t")) && line.ends_with("\tactive\trunning")),
            "{said}"
        );
    }
    let wide = said.lines().filter(|line| line.starts_with("box-")).count();
    assert_eq!(wide, 4, "four machines in list-machines -o wide: {said}");
    assert!(said.contains("Hello from 1"), "the journal from member 3: {said}");
    // The README's way to end it ends everything it started, units too.
    let stop = "kill %1 %2 %3 %4 %5";
    assert!(readme.contains(&format!("`{stop}`")), "the README ends it with {stop:?}");
    shell.run(&format!("{stop}\nwait"));
    shell.exit();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while shell.any_left() {
        assert!(std::time::Instant::now() < deadline, "the walkthrough left processes running:\n{}", shell.said());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 69: "Upgrading" shows what `fleetd --version` prints, and "Backing up" backs a fleetd
/// up and restores it as its lines say (`systemctl` standing for this test's own stop and start,
/// and `-config` for the test's fleet.conf).
#[test]
fn the_version_and_a_backup_and_restore_as_the_readme_shows_them() {
    let readme = readme();
    let shown = block(&readme, "text", "fleetd version 0.2.0");
    let printed = Ran::from(Command::new(binary("fleetd")).arg("--version").output().expect("fleetd"));
    let shape = |text: &str| -> Vec<String> {
        text.lines().map(|line| line.rsplit_once(' ').map_or(line, |(head, _)| head).to_string()).collect()
    };
    assert_eq!(shape(&printed.stdout), shape(&shown), "{printed:?}");
    assert!(printed.stdout.starts_with(&format!("fleetd version {}\n", env!("CARGO_PKG_VERSION"))));
    assert!(
        shown.starts_with(&format!("fleetd version {}\n", env!("CARGO_PKG_VERSION"))),
        "the README names this release"
    );

    let mut fleet = Fleetd::start("e2e0readme000031", &[]);
    fleet.ok(&["start", &examples_dir().join("hello.service").display().to_string()]);
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("fleet.redb").display().to_string();
    let back_up = block(&readme, "sh", "# a snapshot of the embedded store while fleetd runs");
    let restore =
        block(&readme, "sh", "# restore: fleetd stopped, the snapshot put in its place, fleetd started again");
    for line in put_in(&back_up, &[("/var/backups/fleet.redb", &file)]).lines().filter(|line| !line.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "fleetctl", "{line}");
        fleet.ok(&words[1..]);
    }
    let hash = |fleet: &Fleetd| fleet.ok(&["list-unit-files", "--full", "--no-legend", "--fields", "unit,hash"]).stdout;
    let before = hash(&fleet);
    fleet.ok(&["destroy", "hello.service"]);
    for line in put_in(&restore, &[("/var/backups/fleet.redb", &file)]).lines().filter(|line| !line.starts_with('#')) {
        match line {
            "systemctl stop fleet" => {
                fleet.stop_with(libc::SIGTERM);
            }
            "systemctl start fleet" => fleet.launch(),
            _ => {
                let args: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(args[0], "fleetd", "{line}");
                let restored = Ran::from(
                    Command::new(binary("fleetd"))
                        .arg("-config")
                        .arg(fleet.config_path())
                        .args(&args[1..])
                        .output()
                        .expect("fleetd"),
                );
                assert_eq!(restored.code, 0, "{restored:?}");
            }
        }
    }
    assert_eq!(hash(&fleet), before, "the unit destroyed after the backup is back, with its hash");
}

#[test]
fn secrets_as_the_readme_sets_names_and_rotates_them() {
    let readme = readme();
    let credentials = tempfile::tempdir().expect("dir");
    let base = credentials.path().display().to_string();
    let fleet = Fleetd::start("e2e0readme000041", &[("credentials_dir", &base)]);
    let fleetctl = format!("{} --endpoint=unix://{}", binary("fleetctl").display(), fleet.socket().display());
    let run_shell = |lines: &str, env: &[(&str, &str)]| {
        let script = format!("set -e\nfleetctl() {{ {fleetctl} \"$@\"; }}\n{lines}");
        let ran = Ran::from(Command::new("sh").arg("-c").arg(&script).envs(env.iter().copied()).output().expect("sh"));
        assert_eq!(ran.code, 0, "{lines}\n{ran:?}");
        ran
    };
    let set = block(
        &readme,
        "sh",
        "# set a secret from standard input (never from an argument), list what there is (never a value)",
    );
    let listed = run_shell(&set, &[("DB_PASSWORD", "s3cret-from-the-readme")]);
    assert!(listed.stdout.contains("db-password\t1\t22\t"), "{listed:?}");

    let unit = block(
        &readme,
        "ini",
        "[Service]\nExecStart=/bin/sh -c 'exec /usr/bin/myapp --password-file \"$CREDENTIALS_DIRECTORY/db\"'",
    );
    let unit = put_in(&unit, &[("/usr/bin/myapp --password-file", "/usr/bin/sha256sum")]);
    let dir = tempfile::tempdir().expect("dir");
    let path = fleet_e2e::write_unit(dir.path(), "myapp.service", &unit);
    fleet.ok(&["start", "--no-block", &path]);
    let expected = fleet_e2e::sha256_hex(b"s3cret-from-the-readme");
    fleet.wait_until("the unit read its credential", std::time::Duration::from_secs(20), |f| {
        f.fleetctl(&["journal", "myapp.service"]).stdout.contains(&expected)
    });

    let rotation = block(
        &readme,
        "sh",
        "# a new key in front; copy the file to every member and reload them; seal every value again; drop the old key",
    );
    let key = fleet.state_dir().join("secrets.key").display().to_string();
    let mut reloads = 0;
    for line in put_in(&rotation, &[("/etc/fleet/tls/secrets.key", &key)]).lines().filter(|line| !line.starts_with('#'))
    {
        if line == "systemctl reload fleet" {
            fleet.signal(libc::SIGHUP);
            reloads += 1;
            fleet.wait_until("fleetd reloaded", std::time::Duration::from_secs(20), |f| {
                f.log().matches("Reloading configuration").count() == reloads
            });
        } else if let Some(args) = line.strip_prefix("fleetd ") {
            let args: Vec<&str> = args.split_whitespace().collect();
            let ran = Ran::from(Command::new(binary("fleetd")).args(&args).output().expect("fleetd"));
            assert_eq!(ran.code, 0, "{line}: {ran:?}");
        } else {
            let said = run_shell(line, &[]);
            assert!(said.stderr.contains("Sealed 1 secrets again"), "{said:?}");
        }
    }
    assert_eq!(fleet_secrets::ClusterKeys::load(std::path::Path::new(&key)).expect("the key").ids().len(), 1);
}
