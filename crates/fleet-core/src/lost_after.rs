//! `[X-Fleet] LostAfter=`: how long a unit's machine may be out of touch before the unit is
//! placed elsewhere. A machine is out of touch from its last renewal of its presence; the
//! cluster sees it gone `agent_ttl` later. So `LostAfter=` below `agent_ttl` cannot be kept (the
//! API refuses it) and `agent_ttl` itself is what a unit without the option gets: it moves as
//! soon as its machine is seen gone. `never`: the unit waits for its machine, however long.

use std::time::Duration;

use crate::service_values::parse_timespan;
use crate::unit_file::{UnitOption, last_value};

/// The option's name in `[X-Fleet]`.
pub const KEY: &str = "LostAfter";

/// The longest span `LostAfter=` takes; beyond it, `never` says what is meant.
pub const LONGEST: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a unit's machine may be out of touch before the unit moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LostAfter {
    /// No `LostAfter=`: as soon as the machine is seen gone (`agent_ttl` after its last renewal).
    #[default]
    AgentTtl,
    /// Once the machine has been out of touch this long.
    After(Duration),
    /// Never: the unit waits for its machine to come back.
    Never,
}

impl LostAfter {
    /// How long after the cluster first sees the machine gone the unit stays, given
    /// `agent_ttl`: the span less the `agent_ttl` already gone by; `None` for ever.
    pub fn stay_after_seen_gone(self, agent_ttl: Duration) -> Option<Duration> {
        match self {
            LostAfter::AgentTtl => Some(Duration::ZERO),
            LostAfter::After(span) => Some(span.saturating_sub(agent_ttl)),
            LostAfter::Never => None,
        }
    }

    /// How a unit file writes it (`10min`, `never`); `None` when it is not set.
    pub fn written(self) -> Option<String> {
        match self {
            LostAfter::AgentTtl => None,
            LostAfter::After(span) => Some(crate::duration::short_span(span)),
            LostAfter::Never => Some("never".to_string()),
        }
    }

    /// Whether this is shorter than `agent_ttl`, which the cluster cannot keep: it sees a
    /// machine gone only `agent_ttl` after its last renewal.
    pub fn shorter_than(self, agent_ttl: Duration) -> bool {
        matches!(self, LostAfter::After(span) if span < agent_ttl)
    }
}

/// The unit's `LostAfter=` (the last one given): a systemd time span from 1s to
/// [`LONGEST`], or `never`.
pub fn lost_after_of(options: &[UnitOption]) -> Result<LostAfter, String> {
    let Some(value) = last_value(options, crate::unit_file::X_FLEET, KEY) else {
        return Ok(LostAfter::AgentTtl);
    };
    let refused = |why: &str| format!("invalid value {value:?} for [X-Fleet] {KEY}: {why}");
    let trimmed = value.trim();
    if trimmed == "never" {
        return Ok(LostAfter::Never);
    }
    match parse_timespan(trimmed) {
        Ok(Some(span)) if span >= Duration::from_secs(1) && span <= LONGEST => Ok(LostAfter::After(span)),
        Ok(_) => Err(refused("expected a time span from 1s to 30d, or never")),
        Err(error) => Err(refused(&format!("{error}; expected a time span such as 10min, or never"))),
    }
}

/// The API's check of `LostAfter=` against its cluster's `agent_ttl`.
pub fn check_against_agent_ttl(options: &[UnitOption], agent_ttl: Duration) -> Result<(), String> {
    match lost_after_of(options)? {
        lost if lost.shorter_than(agent_ttl) => Err(format!(
            "invalid value {:?} for [X-Fleet] {KEY}: shorter than this cluster's agent_ttl ({}), after which a machine is first seen gone",
            last_value(options, crate::unit_file::X_FLEET, KEY).unwrap_or_default(),
            crate::duration::short_span(agent_ttl)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_file::UnitFile;

    fn read(x_fleet: &str) -> Result<LostAfter, String> {
        let file = UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).expect("a unit");
        lost_after_of(file.options())
    }

    #[test]
    fn spans_and_never_are_read_and_the_rest_refused_naming_the_option() {
        assert_eq!(read(""), Ok(LostAfter::AgentTtl));
        assert_eq!(read("LostAfter=10min\n"), Ok(LostAfter::After(Duration::from_secs(600))));
        assert_eq!(read("LostAfter=90\n"), Ok(LostAfter::After(Duration::from_secs(90))));
        assert_eq!(read("LostAfter=1h\nLostAfter=never\n"), Ok(LostAfter::Never), "the last one counts");
        assert_eq!(read("LostAfter=30d\n"), Ok(LostAfter::After(LONGEST)));
        for bad in
            ["LostAfter=31d", "LostAfter=0", "LostAfter=500ms", "LostAfter=soon", "LostAfter=infinity", "LostAfter="]
        {
            let error = read(&format!("{bad}\n")).expect_err(bad);
            assert!(error.starts_with("invalid value") && error.contains("[X-Fleet] LostAfter"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_span_shorter_than_agent_ttl_is_refused_and_the_stay_counts_agent_ttl_gone() {
        let ttl = Duration::from_secs(30);
        let file = UnitFile::parse("[X-Fleet]\nLostAfter=10s\n").expect("a unit");
        let error = check_against_agent_ttl(file.options(), ttl).expect_err("10s < 30s");
        assert!(error.contains("shorter than this cluster's agent_ttl (30s)"), "{error}");
        let file = UnitFile::parse("[X-Fleet]\nLostAfter=30s\n").expect("a unit");
        assert_eq!(check_against_agent_ttl(file.options(), ttl), Ok(()));
        assert_eq!(LostAfter::AgentTtl.stay_after_seen_gone(ttl), Some(Duration::ZERO));
        assert_eq!(
            LostAfter::After(Duration::from_secs(600)).stay_after_seen_gone(ttl),
            Some(Duration::from_secs(570))
        );
        assert_eq!(LostAfter::Never.stay_after_seen_gone(ttl), None);
        assert_eq!(LostAfter::After(Duration::from_secs(600)).written().as_deref(), Some("10m"));
    }
}
