//! ARCHITECTURE.md kept true: each invariant names the tests that check it, and the rules it
//! states of the crates' dependencies and of `fleet-core` are checked here from the tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

/// The "Architecture invariant:" lines of ARCHITECTURE.md.
fn invariants() -> Vec<String> {
    let text = read(&root().join("ARCHITECTURE.md"));
    text.lines().filter(|line| line.starts_with("Architecture invariant:")).map(str::to_string).collect()
}

/// The `crate/path.rs::name` references after "Checked by" in `invariant`.
fn checks(invariant: &str) -> Vec<(String, String)> {
    let Some((_, cited)) = invariant.split_once("Checked by") else { return Vec::new() };
    cited
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|reference| reference.split_once("::"))
        .map(|(file, name)| (file.to_string(), name.to_string()))
        .collect()
}

/// Whether `source` defines test `name`: as a function, or as a name a test macro expands.
fn defines(source: &str, name: &str) -> bool {
    let word = |line: &str| line.trim().trim_end_matches(',') == name;
    source.contains(&format!("fn {name}(")) || source.contains(&format!("fn {name}<")) || source.lines().any(word)
}

#[test]
fn every_invariant_names_the_tests_that_check_it() {
    let invariants = invariants();
    assert!(invariants.len() >= 20, "ARCHITECTURE.md lost its invariants: {}", invariants.len());
    for invariant in &invariants {
        let checks = checks(invariant);
        assert!(!checks.is_empty(), "names no test (\"Checked by `crate/file.rs::test`\"): {invariant}");
        for (file, name) in checks {
            let path = root().join("crates").join(&file);
            assert!(path.exists(), "{file} does not exist, named by: {invariant}");
            assert!(defines(&read(&path), &name), "{file} has no test {name}, named by: {invariant}");
        }
    }
}

/// The most an invariant's sentence may hold: a rule a reader takes in at once.
const SENTENCE_MAX_CHARS: usize = 200;

#[test]
fn every_invariant_is_one_sentence_on_a_line_of_its_own() {
    let text = read(&root().join("ARCHITECTURE.md"));
    let lines: Vec<&str> = text.lines().collect();
    for (number, line) in lines.iter().enumerate() {
        if !line.starts_with("Architecture invariant:") {
            // Only the form's own name, quoted, may stand inside other text.
            let unquoted = line.replace("\"Architecture invariant:\"", "");
            assert!(
                !unquoted.contains("Architecture invariant:"),
                "line {}: an invariant begins its own line: {line}",
                number + 1
            );
            continue;
        }
        let blank = |at: Option<&&str>| at.is_none_or(|line| line.trim().is_empty());
        assert!(
            blank(number.checked_sub(1).and_then(|before| lines.get(before))) && blank(lines.get(number + 1)),
            "line {}: an invariant is a paragraph of one line: {line}",
            number + 1
        );
        let claim = line.trim_start_matches("Architecture invariant:").trim();
        let (sentence, _) = claim
            .split_once(" Checked by ")
            .unwrap_or_else(|| panic!("line {}: the sentence is followed by \"Checked by\": {line}", number + 1));
        assert!(sentence.ends_with('.'), "line {}: the sentence ends with a full stop: {sentence}", number + 1);
        let inner = &sentence[..sentence.len() - 1];
        assert!(
            !inner.contains(". ") && !inner.contains("; "),
            "line {}: one sentence, not several: {sentence}",
            number + 1
        );
        assert!(
            sentence.chars().count() <= SENTENCE_MAX_CHARS,
            "line {}: a sentence of at most {SENTENCE_MAX_CHARS} characters: {sentence}",
            number + 1
        );
    }
}

/// The `[dependencies]` of one crate (not its dev-dependencies), with what each line says.
fn dependencies(manifest: &str) -> BTreeMap<String, String> {
    let mut section = "";
    let mut found = BTreeMap::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[dependencies]"
            && let Some((key, value)) = line.split_once('=')
        {
            let name = key.trim().trim_end_matches(".workspace").trim();
            found.insert(name.to_string(), value.trim().to_string());
        }
    }
    found
}

/// Every crate of the workspace, by package name, with its normal dependencies.
fn workspace() -> BTreeMap<String, BTreeMap<String, String>> {
    let mut crates = BTreeMap::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let manifest = entry.expect("an entry").path().join("Cargo.toml");
        if manifest.exists() {
            let text = read(&manifest);
            let name = text
                .lines()
                .find_map(|line| line.strip_prefix("name = "))
                .map(|name| name.trim_matches('"').to_string())
                .expect("a package name");
            crates.insert(name, dependencies(&text));
        }
    }
    crates
}

#[test]
fn clients_and_reconcilers_depend_on_no_store_backend() {
    const FORBIDDEN: [&str; 6] =
        ["fleet-store-etcd", "fleet-store-embedded", "etcd-client", "redb", "zbus", "zbus_systemd"];
    let crates = workspace();
    let roots = [
        "fleetctl",
        "fleet-client",
        "fleet-api",
        "fleet-tls",
        "fleet-engine",
        "fleet-agent",
        "fleet-pull-agent",
        "fleet-leader",
        "fleet-source",
    ];
    // Everything they reach inside the workspace, each checked alike.
    let mut reached: BTreeSet<String> = BTreeSet::new();
    let mut next: Vec<String> = roots.iter().map(|name| name.to_string()).collect();
    while let Some(name) = next.pop() {
        if !reached.insert(name.clone()) {
            continue;
        }
        let dependencies = crates.get(&name).unwrap_or_else(|| panic!("no crate {name}"));
        // An optional dependency is off: no crate reached turns a feature on (checked below).
        for (dependency, how) in dependencies.iter().filter(|(_, how)| !how.contains("optional = true")) {
            assert!(
                !FORBIDDEN.contains(&dependency.as_str()),
                "{name} depends on {dependency} (reached from a client)"
            );
            if dependency == "fleet-unit-manager" {
                assert!(!how.contains("features"), "{name} turns on a unit manager: {how}");
            }
            if crates.contains_key(dependency) {
                next.push(dependency.clone());
            }
        }
    }
    assert!(reached.contains("fleet-registry") && reached.contains("fleet-core"), "{reached:?}");
    // The workspace's own entry leaves the unit managers off.
    let manifest = read(&root().join("Cargo.toml"));
    let entry = manifest.lines().find(|line| line.starts_with("fleet-unit-manager =")).expect("the workspace entry");
    assert!(entry.contains("default-features = false"), "{entry}");
}

#[test]
fn fleet_core_does_no_io_and_reads_no_clock() {
    let crates = workspace();
    // jiff for calendars: its zone database compiled in, never the machine's, never its clock.
    let allowed = BTreeSet::from(["jiff", "serde", "sha1", "thiserror"]);
    let dependencies: BTreeSet<&str> = crates["fleet-core"].keys().map(String::as_str).collect();
    assert!(dependencies.is_subset(&allowed), "fleet-core depends on {dependencies:?}");
    const FORBIDDEN: [&str; 14] = [
        "jiff::tz::db",
        "Timestamp::now",
        "Zoned::now",
        "TimeZone::system",
        "from_dir",
        "std::fs",
        "std::net",
        "std::process",
        "std::thread",
        "tokio",
        "SystemTime::now",
        "Instant::now",
        "async fn",
        "std::env",
    ];
    for path in rust_files(&root().join("crates/fleet-core/src")) {
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if name == "tests.rs" {
            continue;
        }
        let source = read(&path);
        // What a file's tests do is theirs: only the code above its test module counts.
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        for word in FORBIDDEN {
            assert!(!code.contains(word), "{} uses {word}", path.display());
        }
    }
}

#[test]
fn one_tls_crypto_provider() {
    let lock = read(&root().join("Cargo.lock"));
    let packages: BTreeSet<&str> =
        lock.lines().filter_map(|line| line.strip_prefix("name = ")).map(|name| name.trim_matches('"')).collect();
    assert!(packages.contains("ring") && packages.contains("rustls"), "ring provides rustls's cryptography");
    for other in ["aws-lc-rs", "aws-lc-sys", "openssl", "openssl-sys", "native-tls"] {
        assert!(!packages.contains(other), "{other} is in the tree: only ring may provide TLS cryptography");
    }
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).expect("a directory").map(|entry| entry.expect("an entry").path()));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
    found
}

#[test]
fn every_crate_without_unsafe_code_forbids_it() {
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let dir = entry.expect("an entry").path();
        let files = rust_files(&dir.join("src"));
        let has_unsafe = files.iter().any(|file| {
            let source = read(file);
            source.contains("unsafe {") || source.contains("unsafe fn") || source.contains("unsafe impl")
        });
        let crate_root = ["src/lib.rs", "src/main.rs"].iter().map(|root| dir.join(root)).find(|root| root.exists());
        let Some(crate_root) = crate_root else { continue };
        if !has_unsafe {
            assert!(
                read(&crate_root).contains("#![forbid(unsafe_code)]"),
                "{} has no unsafe code and does not forbid it",
                crate_root.display()
            );
        }
    }
}

/// The pull agent's loops run on fleet-runtime under fleetd's one lifecycle: neither its
/// crate nor fleetd's pull mode spawns a task of its own, but for `following.rs::start`, the
/// follower of a registry that has no fleetd around it (tests, benchmarks).
#[test]
fn the_pull_agent_spawns_no_loop_outside_the_runtime() {
    let mut files = rust_files(&root().join("crates/fleet-pull-agent/src"));
    files.push(root().join("crates/fleetd/src/pull.rs"));
    for path in files.into_iter().filter(|path| !path.ends_with("tests.rs")) {
        let source = read(&path);
        // What a file's tests do is theirs: only the code above its test module counts.
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let spawns = code.matches("tokio::spawn(").count() + code.matches(".spawn(async").count();
        let allowed = usize::from(path.ends_with("fleet-pull-agent/src/following.rs"));
        assert_eq!(spawns, allowed, "{} spawns a task outside fleet-runtime", path.display());
    }
}

/// The simulation runs the engine, the agents and the leader's drivers on tokio's paused
/// clock: a decision timed by std's clock runs differently on a loaded machine, and a seed no
/// longer replays (seed 796593883 failed once in CI that way).
#[test]
fn the_crates_the_simulation_runs_read_tokios_clock() {
    for krate in ["fleet-engine", "fleet-agent", "fleet-registry", "fleet-runtime", "fleet-leader", "fleet-sim"] {
        for path in rust_files(&root().join("crates").join(krate).join("src")) {
            let shown = path.display().to_string();
            if shown.contains("/bin/") || path.file_name().is_some_and(|name| name == "tests.rs") {
                continue;
            }
            let source = read(&path);
            let code = source.split("#[cfg(test)]").next().unwrap_or_default();
            assert!(!code.contains("std::time::Instant::now"), "{shown} reads std's clock");
            let std_instant =
                code.lines().any(|line| line.trim_start().starts_with("use std::time::") && line.contains("Instant"));
            assert!(
                !(std_instant && code.contains("Instant::now")),
                "{shown} reads std's clock (its Instant is std's)"
            );
        }
    }
}
