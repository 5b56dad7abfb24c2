//! Fetching git sources, the I/O edge of desired state from git: a repository at a branch
//! or a revision, fetched into a bare cache of its own, and the files under some paths at
//! that commit. What the files mean is `fleet_core::source`'s business.
//!
//! Blocking (gix's client is): callers run it on a blocking thread.

use std::path::Path;
use std::sync::atomic::AtomicBool;

/// The largest file read: bigger ones are named as problems, not read.
pub const FILE_MAX_BYTES: u64 = 1 << 20;
/// The most files a source may hold under its paths.
pub const FILES_MAX: usize = 200_000;
/// The most bytes of files one read of a source keeps in memory (unit files and desired-state
/// files only: the others are not read at all).
pub const READ_MAX_BYTES: u64 = 64 << 20;

/// Where to fetch from and what to read.
#[derive(Clone, Debug)]
pub struct FetchRequest<'a> {
    /// `https://…` or `file://…`.
    pub repo: &'a str,
    pub branch: Option<&'a str>,
    pub revision: Option<&'a str>,
    /// Directories read (recursively); the whole tree when empty.
    pub paths: &'a [String],
    pub credentials: Option<&'a Credentials>,
    /// The commit whose files the caller holds already: if the fetch lands on it, the files
    /// are not read again ([`Fetched::unchanged`]).
    pub known_commit: Option<&'a str>,
}

/// A user name and password (or token) for https. Its `Debug` shows neither.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(…)")
    }
}

impl Credentials {
    /// Reads a credentials file's text: `USER:PASSWORD`, or a token alone (sent as the
    /// password of user `git`, which the common forges accept).
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().map(str::trim).find(|line| !line.is_empty() && !line.starts_with('#'))?;
        Some(match line.split_once(':') {
            Some((username, password)) => Self { username: username.to_string(), password: password.to_string() },
            None => Self { username: "git".to_string(), password: line.to_string() },
        })
    }
}

/// The source at one commit: its files under the paths, `(path, text)`, and the files that
/// could not be read (too big, not text), `(path, why)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    pub commit: String,
    pub files: Vec<(String, String)>,
    pub unreadable: Vec<(String, String)>,
    /// The commit is the request's `known_commit`: `files` and `unreadable` are left empty.
    pub unchanged: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot fetch {repo}: {reason}")]
    Fetch { repo: String, reason: String },
    #[error("the repository has no {what} {name:?}")]
    NoSuchReference { what: &'static str, name: String },
    #[error("the repository holds over {FILES_MAX} files under the source's paths")]
    TooManyFiles,
    #[error("the unit and desired-state files under the source's paths hold over {READ_MAX_BYTES} bytes")]
    TooLarge,
    #[error("the fetched repository cannot be read: {0}")]
    Read(String),
}

fn fetch_error(repo: &str, error: impl std::fmt::Display) -> SourceError {
    SourceError::Fetch { repo: repo.to_string(), reason: error.to_string() }
}

fn read_error(error: impl std::fmt::Display) -> SourceError {
    SourceError::Read(error.to_string())
}

/// The local ref a branch is fetched into.
const FETCHED: &str = "refs/fleet/fetched";

/// Fetches `request.repo` into the bare repository at `cache` (made when missing; the caller
/// keeps one per source) and reads the files at the commit it names.
pub fn fetch(cache: &Path, request: &FetchRequest<'_>) -> Result<Fetched, SourceError> {
    // https needs the process's TLS provider; another part of the process may have set it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let repo =
        if cache.join("HEAD").exists() { gix::open(cache) } else { gix::init_bare(cache) }.map_err(read_error)?;
    let refspecs: Vec<String> = match (request.branch, request.revision) {
        (Some(branch), _) => vec![format!("+refs/heads/{branch}:{FETCHED}")],
        (None, None) => vec![format!("+HEAD:{FETCHED}")],
        // A revision may be any commit or tag: every branch and tag, resolved after.
        (None, Some(_)) => vec!["+refs/heads/*:refs/remotes/origin/*".into(), "+refs/tags/*:refs/tags/*".into()],
    };
    let remote = repo
        .remote_at(request.repo)
        .map_err(|error| fetch_error(request.repo, error))?
        .with_refspecs(refspecs.iter().map(String::as_str), gix::remote::Direction::Fetch)
        .map_err(|error| fetch_error(request.repo, error))?;
    let connection = remote.connect(gix::remote::Direction::Fetch).map_err(|error| fetch_error(request.repo, error))?;
    let credentials = request.credentials.cloned();
    let connection = connection.with_credentials(move |action| match (action, &credentials) {
        (gix::credentials::helper::Action::Get(context), Some(credentials)) => {
            Ok(Some(gix::credentials::protocol::Outcome {
                identity: gix::sec::identity::Account {
                    username: credentials.username.clone(),
                    password: credentials.password.clone(),
                    oauth_refresh_token: None,
                },
                next: context.into(),
            }))
        }
        _ => Ok(None),
    });
    let interrupt = AtomicBool::new(false);
    connection
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|error| fetch_error(request.repo, error))?
        .receive(gix::progress::Discard, &interrupt)
        .map_err(|error| fetch_error(request.repo, error))?;
    let commit = match request.revision {
        Some(revision) => repo
            .rev_parse_single(revision)
            .map_err(|_| SourceError::NoSuchReference { what: "revision", name: revision.to_string() })?
            .object()
            .map_err(read_error)?
            .peel_to_commit()
            .map_err(read_error)?,
        None => {
            let missing =
                || SourceError::NoSuchReference { what: "branch", name: request.branch.unwrap_or("HEAD").to_string() };
            let mut reference = repo.find_reference(FETCHED).map_err(|_| missing())?;
            reference.peel_to_commit().map_err(|_| missing())?
        }
    };
    if request.known_commit == Some(commit.id.to_string().as_str()) {
        return Ok(Fetched { commit: commit.id.to_string(), unchanged: true, ..Fetched::default() });
    }
    let tree = commit.tree().map_err(read_error)?;
    let mut recorder = gix::traverse::tree::Recorder::default();
    tree.traverse().breadthfirst(&mut recorder).map_err(read_error)?;
    let mut fetched = Fetched { commit: commit.id.to_string(), ..Fetched::default() };
    let wanted = |path: &str| {
        request.paths.is_empty()
            || request.paths.iter().any(|dir| {
                let dir = dir.trim_end_matches('/');
                path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
            })
    };
    // Only what a source is made of is read: unit files and desired-state files.
    let read_by_sources = |path: &str| {
        let base = path.rsplit('/').next().unwrap_or(path);
        base == fleet_core::source::DESIRED_FILE || fleet_core::unit_name::validate_name(base).is_ok()
    };
    let (mut seen, mut bytes) = (0, 0);
    for entry in recorder.records.iter().filter(|entry| entry.mode.is_blob()) {
        let path = entry.filepath.to_string();
        if !wanted(&path) {
            continue;
        }
        seen += 1;
        if seen > FILES_MAX {
            return Err(SourceError::TooManyFiles);
        }
        if !read_by_sources(&path) {
            continue;
        }
        let header = repo.find_header(entry.oid).map_err(read_error)?;
        if header.size() > FILE_MAX_BYTES {
            fetched.unreadable.push((path, format!("over {FILE_MAX_BYTES} bytes")));
            continue;
        }
        bytes += header.size();
        if bytes > READ_MAX_BYTES {
            return Err(SourceError::TooLarge);
        }
        let blob = repo.find_object(entry.oid).map_err(read_error)?.detach();
        match String::from_utf8(blob.data) {
            Ok(text) => fetched.files.push((path, text)),
            Err(_) => fetched.unreadable.push((path, "not UTF-8 text".to_string())),
        }
    }
    Ok(fetched)
}
