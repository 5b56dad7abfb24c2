//! Fuzz targets: each takes arbitrary bytes, feeds them to one decoder of outside input the
//! way fleet meets it, and panics only on a real defect: a decoder that panics, or one whose
//! accepted output does not survive its own round trip.
//!
//! Two drivers run them: `tests/fuzz.rs` on stable (the checked-in corpus, then a bounded
//! property-based run; what CI runs), and `fuzz/` with cargo-fuzz and libFuzzer on a nightly
//! toolchain, for long coverage-guided runs (FUZZING.md).
#![forbid(unsafe_code)]

mod api_request;
mod api_unverified;
mod tls_stream;

use std::collections::BTreeMap;
use std::path::Path;

use fleet_core::service_values::{
    KillMode, RestartPolicy, ServiceType, check_service_directives, parse_signal, parse_systemd_bool, parse_timespan,
};
use fleet_core::{Requirements, UnitFile};
use fleet_registry::codec::{MetadataOverrides, Options, decode, encode};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use api_request::api_request;
pub use api_unverified::api_unverified;
pub use tls_stream::tls_stream;

/// A fuzz target: arbitrary bytes in, a panic only on a defect.
pub type Target = fn(&[u8]);

/// Every target, by the name its corpus directory has.
pub const TARGETS: &[(&str, Target)] = &[
    ("unit_file", unit_file),
    ("service_directives", service_directives),
    ("fleet_conf", fleet_conf),
    ("api_request", api_request),
    ("api_unverified", api_unverified),
    ("page_token", page_token),
    ("etcd_records", etcd_records),
    ("tls_stream", tls_stream),
    ("relayed_journal", relayed_journal),
    ("calendar", calendar),
];

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// The unit-file lexer, its normalised text and everything read from a parsed unit.
pub fn unit_file(data: &[u8]) {
    let Ok(file) = UnitFile::parse(&text(data)) else { return };
    let serialized = file.serialize();
    let again = UnitFile::parse(&serialized).expect("the normalised text of a parsed unit parses");
    assert_eq!(again.serialize(), serialized, "normalisation is stable");
    assert_eq!(again.hash(), file.hash());
    let _ = file.check_writable();
    let _ = check_service_directives(&file);
    let requirements = Requirements::from_unit("fuzz@1.service", &file);
    let _ = requirements.validate();
}

/// A calendar expression (`[X-Fleet] Schedule=`): its normalized form reads back as the same
/// expression, and its elapses from a few moments are in order, after those moments.
pub fn calendar(data: &[u8]) {
    use fleet_core::calendar::CalendarSpec;
    let Ok(spec) = CalendarSpec::parse(&text(data)) else { return };
    let normalized = spec.to_string();
    let again = CalendarSpec::parse(&normalized).expect("the normalized form of an expression reads");
    assert_eq!(again, spec, "{normalized:?} reads back as itself");
    for base in [-1, 0, 1_796_342_400_000_000, 1_806_195_900_000_000, 7_258_118_399_999_999, i64::MAX] {
        let elapses = spec.elapses_after(base, 3);
        assert!(elapses.windows(2).all(|pair| pair[0] < pair[1]), "{normalized:?} from {base}: {elapses:?}");
        assert!(elapses.iter().all(|elapse| *elapse > base), "{normalized:?} from {base}: {elapses:?}");
        assert_eq!(again.elapses_after(base, 3), elapses);
    }
    let _ = spec.check_interval();
}

/// `[Service]` values and the native supervisor's reading of a whole unit.
pub fn service_directives(data: &[u8]) {
    let value = text(data);
    let _ = parse_timespan(&value);
    let _ = parse_signal(&value);
    let _ = parse_systemd_bool(&value);
    let _ = value.parse::<ServiceType>();
    let _ = value.parse::<RestartPolicy>();
    let _ = value.parse::<KillMode>();
    let unit = format!("[Service]\nExecStart=/bin/true\n{value}\n");
    if let Ok(file) = UnitFile::parse(&unit) {
        let accepted = check_service_directives(&file).is_ok();
        let read = fleet_unit_manager::native::ServiceConfig::from_unit("fuzz.service", &file);
        // What the API accepts, the supervisor can run or refuses with a reason; never more.
        if accepted && let Err(error) = &read {
            assert!(
                !matches!(error, fleet_unit_manager::native::ServiceError::BadValue { key, .. }
                    if ["RestartSec", "TimeoutStartSec", "TimeoutStopSec", "TimeoutSec", "Type", "Restart", "KillMode", "KillSignal", "RemainAfterExit"].contains(key)),
                "a value the API accepted is refused by the supervisor: {error}"
            );
        }
    }
}

/// fleet.conf text and `FLEET_*` values.
pub fn fleet_conf(data: &[u8]) {
    let text = text(data);
    if let Ok(values) = fleetd::config::parse_file(Path::new("fuzz.conf"), &text) {
        let _ = fleetd::config::Config::from_values(&values);
    }
    let mut values = BTreeMap::new();
    for line in text.lines() {
        if let Some((name, value)) = line.split_once('=') {
            values.insert(name.trim().to_string(), value.to_string());
        }
    }
    let _ = fleetd::config::Config::from_values(&values);
}

/// Page tokens as clients send them back.
/// A journal another machine answers for a relay (a value read from etcd, or a pull agent's
/// POST): whatever it says, it is read or refused, and what is passed on stays within the
/// relay's bound, its newest lines whole.
pub fn relayed_journal(data: &[u8]) {
    use fleet_api::schema::{Journal, RelayedJournal};
    use fleet_core::journal_relay::{MOST_ANSWER_BYTES, newest_lines_within};
    let bound = data.first().map_or(0, |byte| usize::from(*byte) * 16);
    let whole = text(data);
    let (kept, cut) = newest_lines_within(&whole, bound);
    assert!(kept.len() <= bound || !cut, "kept within the bound");
    assert!(whole.ends_with(kept), "the newest lines");
    let Ok(answer) = serde_json::from_slice::<RelayedJournal>(data) else { return };
    if let RelayedJournal::Journal(journal) = answer {
        let bounded = fleet_api::within_relay_bound(journal.clone());
        let encoded = serde_json::to_vec(&bounded).expect("a journal encodes");
        assert!(encoded.len() <= MOST_ANSWER_BYTES || bounded.text.is_empty(), "within the relay's bound");
        assert!(journal.text.ends_with(&bounded.text), "the newest lines are kept");
        let _: Journal = serde_json::from_slice(&encoded).expect("what is passed on reads back");
    }
}

pub fn page_token(data: &[u8]) {
    let limit = data.first().map_or(100, |byte| u16::from(*byte).max(1));
    let token = text(data.get(1..).unwrap_or_default());
    let Ok(decoded) = fleet_api::pagination::PageToken::decode(&token, limit) else { return };
    let again = fleet_api::pagination::PageToken::decode(&decoded.encode(), limit).expect("an encoded token decodes");
    assert_eq!(again, decoded);
    let items: Vec<u8> = data.to_vec();
    let (page, next) = decoded.page(items, |_| 1);
    assert!(page.len() <= usize::from(limit));
    if let Some(next) = next {
        assert!(fleet_api::pagination::PageToken::decode(&next.encode(), limit).is_ok());
    }
}

/// A record that decodes must encode and decode again to the same JSON.
fn round_trip<T: Serialize + DeserializeOwned>(data: &[u8]) {
    let Ok(value) = decode::<T>("fuzz", data) else { return };
    let encoded = encode(&value);
    let again: T = decode("fuzz", &encoded).expect("an encoded record decodes");
    assert_eq!(encode(&again), encoded, "records survive their round trip");
}

/// Every kind of record the stores read back (etcd values are whatever etcd holds).
pub fn etcd_records(data: &[u8]) {
    round_trip::<fleet_registry::UnitRecord>(data);
    round_trip::<fleet_store_etcd::Assignment>(data);
    round_trip::<fleet_core::MachineState>(data);
    round_trip::<fleet_core::UnitState>(data);
    round_trip::<Options>(data);
    round_trip::<MetadataOverrides>(data);
}
