//! What a metadata key may be: the one rule machines' metadata, taints and tolerations and
//! `SpreadBy=` keys share.

/// Whether `key` can be a metadata key: 1 to 64 letters, digits, `_`, `.` and `-`.
pub fn valid_metadata_key(key: &str) -> bool {
    (1..=64).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}
