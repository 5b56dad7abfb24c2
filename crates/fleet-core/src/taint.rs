//! Machines kept for some units: a machine's taints (`taints = gpu=yes` in fleet.conf,
//! `fleetctl machine taint`) and a unit's tolerations (`[X-Fleet] Tolerate=gpu=yes`, or
//! `Tolerate=gpu` for any value). A tainted machine takes only units that tolerate every taint
//! it has; a taint marked `:evict` also moves off the units already there that do not.
//!
//! Written `key`, `key=value`, each optionally followed by `:evict`; a key is a metadata key
//! (letters, digits, `_`, `.`, `-`; at most 64) and a value at most 64 of the same.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::metadata_key::valid_metadata_key;

/// One taint's value and whether it moves off the units already there that do not tolerate it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evict: bool,
}

/// A machine's taints, by key.
pub type Taints = BTreeMap<String, Taint>;

/// What a unit tolerates: a taint's key with one value, or with any (`None`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Toleration {
    pub key: String,
    pub value: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaintError {
    #[error("{0:?} is not a taint: expected key, key=value, each optionally followed by :evict")]
    Taint(String),
    #[error("{0:?} is not a toleration: expected key or key=value")]
    Toleration(String),
    #[error("a taint's or toleration's key is 1 to 64 letters, digits, '_', '.' and '-', not {0:?}")]
    Key(String),
    #[error("a taint's or toleration's value is at most 64 letters, digits, '_', '.' and '-', not {0:?}")]
    Value(String),
}

fn valid_value(value: &str) -> bool {
    value.len() <= 64 && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn key_and_value(text: &str) -> Result<(String, String), TaintError> {
    let (key, value) = text.split_once('=').unwrap_or((text, ""));
    if !valid_metadata_key(key) {
        return Err(TaintError::Key(key.to_string()));
    }
    if !valid_value(value) {
        return Err(TaintError::Value(value.to_string()));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Reads one taint: `gpu`, `gpu=yes`, `gpu=yes:evict`, `gpu:evict`.
pub fn parse_taint(text: &str) -> Result<(String, Taint), TaintError> {
    let text = text.trim();
    let (body, evict) = match text.rsplit_once(':') {
        Some((body, "evict")) => (body, true),
        Some(_) => return Err(TaintError::Taint(text.to_string())),
        None => (text, false),
    };
    let (key, value) = key_and_value(body)?;
    Ok((key, Taint { value, evict }))
}

/// Reads fleet.conf's `taints = gpu=yes,db:evict` (items separated by commas; a later one of
/// the same key wins; empty items ignored).
pub fn parse_taints(text: &str) -> Result<Taints, TaintError> {
    text.split(',').map(str::trim).filter(|item| !item.is_empty()).map(parse_taint).collect()
}

/// Reads one `Tolerate=` item: `gpu` (any value) or `gpu=yes`.
pub fn parse_toleration(text: &str) -> Result<Toleration, TaintError> {
    let text = text.trim();
    if text.contains(':') {
        return Err(TaintError::Toleration(text.to_string()));
    }
    let value = text.contains('=');
    let (key, found) = key_and_value(text)?;
    Ok(Toleration { key, value: value.then_some(found) })
}

/// Whether `tolerations` tolerate the taint `key` with `taint`'s value.
pub fn tolerated(tolerations: &[Toleration], key: &str, taint: &Taint) -> bool {
    tolerations
        .iter()
        .any(|toleration| toleration.key == key && toleration.value.as_ref().is_none_or(|v| *v == taint.value))
}

/// The first of `taints` (in key order) that `tolerations` do not tolerate; with `evicting`,
/// only among those marked `:evict` (what a unit already on the machine answers to).
pub fn first_untolerated<'a>(
    taints: &'a Taints,
    tolerations: &[Toleration],
    evicting: bool,
) -> Option<(&'a String, &'a Taint)> {
    taints.iter().filter(|(_, taint)| !evicting || taint.evict).find(|(key, taint)| !tolerated(tolerations, key, taint))
}

/// Reads the taint of `key` from what is written after the key: `yes`, `yes:evict`, `:evict`
/// or nothing (the API's and the override record's form).
pub fn parse_after_key(key: &str, rest: &str) -> Result<Taint, TaintError> {
    let text = if rest.is_empty() || rest.starts_with(':') { format!("{key}{rest}") } else { format!("{key}={rest}") };
    parse_taint(&text).map(|(_, taint)| taint)
}

/// How a taint is written (`gpu=yes:evict`), as fleet.conf, fleetctl and the API take it.
pub struct Written<'a>(pub &'a str, pub &'a Taint);

impl fmt::Display for Written<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Written(key, taint) = self;
        f.write_str(key)?;
        if !taint.value.is_empty() {
            write!(f, "={}", taint.value)?;
        }
        if taint.evict {
            f.write_str(":evict")?;
        }
        Ok(())
    }
}

/// What is written after taint `key`'s key: `yes:evict`, `:evict`, or nothing.
pub fn written_after_key(key: &str, taint: &Taint) -> String {
    let written = Written(key, taint).to_string();
    written[key.len()..].trim_start_matches('=').to_string()
}

/// Every taint of `taints` as written, in key order.
pub fn written(taints: &Taints) -> Vec<String> {
    taints.iter().map(|(key, taint)| Written(key, taint).to_string()).collect()
}

impl fmt::Display for Toleration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{}={value}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// The prefix of a runtime override's key that holds a taint rather than metadata (`:` is in
/// no metadata key, so the two never meet). Its value is `=` followed by the taint as written
/// after its key (`=yes:evict`, `=`), or empty when the taint is removed.
const OVERRIDE_PREFIX: &str = "taint:";

/// The runtime override that sets (`Some`) or removes (`None`) taint `key`: key and value of
/// the machine's override record.
pub fn override_entry(key: &str, taint: Option<&Taint>) -> (String, String) {
    let value = taint.map_or(String::new(), |taint| format!("={}", written_after_key(key, taint)));
    (format!("{OVERRIDE_PREFIX}{key}"), value)
}

/// What an override entry says of a taint, if it is one: its key, and the taint or `None`
/// (removed). An entry that cannot be read is `None` with its key, as a removal.
pub fn from_override<'a>(key: &'a str, value: &str) -> Option<(&'a str, Option<Taint>)> {
    let key = key.strip_prefix(OVERRIDE_PREFIX)?;
    let taint = value.strip_prefix('=').and_then(|rest| parse_after_key(key, rest).ok());
    Some((key, taint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_are_read_and_written_back_alike() {
        for text in ["gpu", "gpu=yes", "gpu=yes:evict", "gpu:evict", "db.role=primary"] {
            let (key, taint) = parse_taint(text).unwrap();
            assert_eq!(Written(&key, &taint).to_string(), text);
        }
        let taints = parse_taints(" gpu=yes , db:evict,,gpu=no").unwrap();
        assert_eq!(written(&taints), ["db:evict", "gpu=no"]);
    }

    #[test]
    fn malformed_taints_and_tolerations_are_refused_naming_the_part() {
        assert_eq!(parse_taint("gpu=yes:later"), Err(TaintError::Taint("gpu=yes:later".into())));
        assert_eq!(parse_taint("g pu=yes"), Err(TaintError::Key("g pu".into())));
        assert_eq!(parse_taint("=yes"), Err(TaintError::Key(String::new())));
        assert_eq!(parse_taint("gpu=a,b"), Err(TaintError::Value("a,b".into())));
        assert_eq!(parse_taint(&format!("gpu={}", "x".repeat(65))), Err(TaintError::Value("x".repeat(65))));
        assert_eq!(parse_toleration("gpu:evict"), Err(TaintError::Toleration("gpu:evict".into())));
        assert_eq!(parse_toleration("gpu/x"), Err(TaintError::Key("gpu/x".into())));
        assert!(parse_taints("gpu,bad key").is_err());
    }

    #[test]
    fn a_toleration_without_a_value_tolerates_any() {
        let (key, yes) = parse_taint("gpu=yes").unwrap();
        let any = [parse_toleration("gpu").unwrap()];
        let only_no = [parse_toleration("gpu=no").unwrap()];
        let only_yes = [parse_toleration("gpu=yes").unwrap()];
        assert!(tolerated(&any, &key, &yes));
        assert!(!tolerated(&only_no, &key, &yes));
        assert!(tolerated(&only_yes, &key, &yes));
        let (_, empty) = parse_taint("gpu").unwrap();
        assert!(tolerated(&any, &key, &empty));
        assert!(tolerated(&[parse_toleration("gpu=").unwrap()], &key, &empty));
        assert!(!tolerated(&only_yes, &key, &empty));
    }

    #[test]
    fn units_already_there_answer_only_to_taints_that_evict() {
        let taints = parse_taints("a=1,b=2:evict").unwrap();
        let none: [Toleration; 0] = [];
        assert_eq!(first_untolerated(&taints, &none, false).map(|(key, _)| key.as_str()), Some("a"));
        assert_eq!(first_untolerated(&taints, &none, true).map(|(key, _)| key.as_str()), Some("b"));
        let tolerates_b = [parse_toleration("b").unwrap()];
        assert_eq!(first_untolerated(&taints, &tolerates_b, true), None);
    }

    #[test]
    fn an_override_entry_carries_a_taint_or_its_removal() {
        for text in ["gpu", "gpu=yes", "gpu=yes:evict", "gpu:evict"] {
            let (key, taint) = parse_taint(text).unwrap();
            let (entry_key, entry_value) = override_entry(&key, Some(&taint));
            assert_eq!(from_override(&entry_key, &entry_value), Some(("gpu", Some(taint))), "{text}");
        }
        let (entry_key, entry_value) = override_entry("gpu", None);
        assert_eq!(entry_value, "");
        assert_eq!(from_override(&entry_key, &entry_value), Some(("gpu", None)));
        assert_eq!(from_override("region", "us"), None, "metadata is not a taint");
    }
}
