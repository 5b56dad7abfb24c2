//! A value that must never be printed: passwords and other credentials. Its `Debug` and
//! `Display` show only whether it is set, so a configuration or options struct can derive
//! `Debug` and be logged without leaking it.

use std::fmt;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that hands it to whoever checks it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "Secret(unset)" } else { "Secret(redacted)" })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "" } else { "(redacted)" })
    }
}

/// Equality that takes the same time wherever the inputs differ (for comparing credential
/// hashes).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// The item among `items` whose hash (as `hash_of` reads it) is `digest`, compared in
/// constant time against every item (no early exit).
pub fn find_by_hash<T>(items: impl IntoIterator<Item = T>, digest: &str, hash_of: impl Fn(&T) -> &str) -> Option<T> {
    let mut found = None;
    for item in items {
        if constant_time_eq(hash_of(&item).as_bytes(), digest.as_bytes()) {
            found = Some(item);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_never_printed() {
        let secret = Secret::new("hunter2");
        assert!(!format!("{secret:?} {secret}").contains("hunter2"));
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
