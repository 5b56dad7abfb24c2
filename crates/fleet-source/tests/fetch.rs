//! Fetching from real repositories made with the git command line: branches, revisions by
//! abbreviated hash and by tag, paths, files too big to read, references that do not exist.

use std::process::Command;

use fleet_source::{FetchRequest, SourceError, fetch};

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@fleet.invalid", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn commit(dir: &std::path::Path, files: &[(&str, &str)]) -> String {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        std::fs::write(path, text).expect("write");
    }
    git(dir, &["add", "--all"]);
    git(dir, &["commit", "--quiet", "-m", "x"]);
    git(dir, &["rev-parse", "HEAD"])
}

#[test]
fn branches_revisions_tags_and_paths() {
    let repo = tempfile::tempdir().expect("a repo");
    git(repo.path(), &["init", "--quiet", "--initial-branch=main"]);
    let first = commit(repo.path(), &[("units/a.service", "A1"), ("other/b.service", "B")]);
    git(repo.path(), &["tag", "v1"]);
    let big = "x".repeat(usize::try_from(fleet_source::fetch::FILE_MAX_BYTES).unwrap_or(1 << 20) + 1);
    let second = commit(repo.path(), &[("units/a.service", "A2"), ("units/big.service", &big)]);
    let url = format!("file://{}", repo.path().display());
    let cache = tempfile::tempdir().expect("a cache");
    let paths = vec!["units".to_string()];
    let request = FetchRequest {
        repo: &url,
        branch: Some("main"),
        revision: None,
        paths: &paths,
        credentials: None,
        known_commit: None,
    };
    let fetched = fetch(&cache.path().join("s"), &request).expect("fetch main");
    assert_eq!(fetched.commit, second);
    assert_eq!(fetched.files, vec![("units/a.service".to_string(), "A2".to_string())]);
    assert_eq!(fetched.unreadable.len(), 1, "{:?}", fetched.unreadable);
    assert!(!fetched.unchanged);
    // Fetched again onto the commit the caller holds: the files are not read again.
    let again = FetchRequest { known_commit: Some(second.as_str()), ..request.clone() };
    let unchanged = fetch(&cache.path().join("s"), &again).expect("fetch main again");
    assert!(unchanged.unchanged && unchanged.files.is_empty() && unchanged.commit == second, "{unchanged:?}");
    for revision in ["v1", &first[..10]] {
        let request = FetchRequest { revision: Some(revision), branch: None, ..request.clone() };
        let fetched = fetch(&cache.path().join("s"), &request).expect("fetch a revision");
        assert_eq!((fetched.commit.as_str(), fetched.files.len()), (first.as_str(), 1), "{revision}");
    }
    let everything = FetchRequest { paths: &[], branch: None, ..request.clone() };
    assert_eq!(fetch(&cache.path().join("t"), &everything).expect("the default branch").files.len(), 2);
    let missing = FetchRequest { branch: Some("nope"), ..request.clone() };
    assert!(matches!(
        fetch(&cache.path().join("s"), &missing),
        Err(SourceError::Fetch { .. } | SourceError::NoSuchReference { .. })
    ));
    let unknown = FetchRequest { revision: Some("v9"), branch: None, ..request };
    assert!(matches!(fetch(&cache.path().join("s"), &unknown), Err(SourceError::NoSuchReference { .. })));
}
