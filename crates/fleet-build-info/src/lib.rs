//! What a fleet binary is: the project's version (one for every crate), the git commit it was
//! built from, and the store format it reads and writes. `fleetd --version`, `fleetctl
//! version` and fleetd's `fleet_build_info` metric say it the same way.

#![forbid(unsafe_code)]

/// The project's version (semver; CHANGELOG.md says what each changed).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("FLEET_COMMIT");

/// `fleetd version 0.2.0` and, below, the commit and the store format: the first line is the
/// original's, for scripts that read it.
pub fn describe(program: &str) -> String {
    let format = fleet_core::store_format::CURRENT;
    format!("{program} version {VERSION}\ncommit {COMMIT}\nstore format {format}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_line_is_the_originals_and_the_rest_says_commit_and_format() {
        let text = super::describe("fleetd");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("fleetd version {}", super::VERSION));
        assert!(lines[1].starts_with("commit ") && lines[1].len() > "commit ".len(), "{text}");
        assert!(lines[2].starts_with(&format!("store format {}", fleet_core::store_format::CURRENT)), "{text}");
    }
}
