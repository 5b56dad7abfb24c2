//! What a source's fields may hold, checked where a source enters (the API).

/// The longest repository address taken.
const REPO_MAX: usize = 2048;
/// The most paths a source reads.
pub const PATHS_MAX: usize = 64;
/// The shortest and longest sync interval, in seconds.
pub const INTERVAL_SECONDS: std::ops::RangeInclusive<u64> = 1..=86_400;

/// A source's name: 1–63 lowercase letters, digits and `-`, starting with a letter or digit
/// (it is a key in the store and a directory name on the syncing machines).
pub fn check_source_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-');
    if fine { Ok(()) } else { Err(format!("invalid source name {name:?}: use 1-63 of a-z, 0-9 and -")) }
}

/// An `https://` or `file://` address without credentials in it (they belong in a
/// credentials file, which the store never holds).
pub fn check_repo(repo: &str) -> Result<(), String> {
    if repo.len() > REPO_MAX || repo.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("invalid repository address: at most {REPO_MAX} characters, no spaces"));
    }
    let Some((scheme, rest)) = repo.split_once("://") else {
        return Err(format!("invalid repository address {repo:?}: expected https://… or file://…"));
    };
    match scheme {
        "https" => {
            let authority = rest.split('/').next().unwrap_or("");
            if authority.contains('@') {
                return Err("the repository address must not hold credentials: name a credentials file instead".into());
            }
            if authority.is_empty() {
                return Err(format!("invalid repository address {repo:?}: no host"));
            }
            Ok(())
        }
        "file" if rest.starts_with('/') => Ok(()),
        "file" => Err(format!("invalid repository address {repo:?}: a file:// address takes an absolute path")),
        _ => Err(format!("unsupported repository scheme {scheme:?}: use https:// or file://")),
    }
}

/// A branch, tag or commit as git allows it in a reference, and nothing an option could be
/// mistaken for.
pub fn check_reference(what: &str, reference: &str) -> Result<(), String> {
    let fine = !reference.is_empty()
        && reference.len() <= 255
        && !reference.starts_with(['-', '/', '.'])
        && !reference.ends_with(['/', '.'])
        && !reference.contains("..")
        && !reference.contains("@{")
        && !reference.ends_with(".lock")
        && reference.chars().all(|c| !c.is_control() && !" ~^:?*[\\".contains(c));
    if fine { Ok(()) } else { Err(format!("invalid {what} {reference:?}")) }
}

/// A directory of the repository: relative, without `..`.
pub fn check_path(path: &str) -> Result<(), String> {
    let fine = !path.is_empty()
        && path.len() <= 1024
        && !path.starts_with('/')
        && path.split('/').all(|part| part != ".." && !part.chars().any(char::is_control));
    if fine {
        Ok(())
    } else {
        Err(format!("invalid path {path:?}: a directory of the repository, relative, without .."))
    }
}

/// The name of a credentials file: a plain file name, so that it can only name a file in the
/// credentials directory the operator configured.
pub fn check_credentials_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "invalid credentials name {name:?}: a file name of the credentials directory (A-Z, a-z, 0-9, . _ -)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_addresses_references_paths_and_credentials() {
        assert!(check_source_name("web-apps").is_ok());
        assert!(
            check_source_name("Web").is_err() && check_source_name("").is_err() && check_source_name("-a").is_err()
        );
        assert!(check_repo("https://git.example/org/units.git").is_ok());
        assert!(check_repo("file:///srv/git/units").is_ok());
        assert!(check_repo("https://user:secret@git.example/x").unwrap_err().contains("must not hold credentials"));
        assert!(check_repo("http://git.example/x").unwrap_err().contains("unsupported repository scheme"));
        assert!(check_repo("ssh://git.example/x").is_err() && check_repo("file://relative").is_err());
        assert!(check_reference("branch", "release/1.2").is_ok());
        for bad in ["--upload-pack=x", "a..b", "a b", "x.lock", "", "a:b"] {
            assert!(check_reference("branch", bad).is_err(), "{bad}");
        }
        assert!(check_path("units/web").is_ok());
        assert!(check_path("../etc").is_err() && check_path("/etc").is_err() && check_path("a/../../b").is_err());
        assert!(check_credentials_name("github-token").is_ok());
        assert!(check_credentials_name("../../etc/shadow").is_err() && check_credentials_name(".hidden").is_err());
    }
}
