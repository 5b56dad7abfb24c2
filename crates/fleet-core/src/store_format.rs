//! The format of a store: which layout of keys and records it holds. Each store records its
//! format (etcd: one key under the prefix; embedded: a table); a fleetd reads it before anything
//! else and decides here whether to run on it, migrate it first, or stay out.
//!
//! The policy, which gives a version skew of one between the members of a cluster: a migration
//! to format N keeps the store usable by fleetds of format N - 1 (checked by
//! `every_migration_keeps_the_previous_format_running`), so while a cluster is upgraded member
//! by member, the members still on the previous release keep running on the migrated store. A
//! fleetd older than that, or one whose store is of a format it knows nothing of, says so and
//! stays out before it writes anything.

use serde::{Deserialize, Serialize};

/// The format this build reads and writes. Format 1 is the layout of fleet 0.1 (which recorded
/// no format) and 0.2 (the first to record it).
pub const CURRENT: u32 = 1;

/// The migrations this build knows, in order: each takes a store of format `to - 1` to `to`.
pub const MIGRATIONS: &[Migration] = &[];

/// A store's recorded format, and the oldest fleetd format that may still run on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFormat {
    pub format: u32,
    pub oldest_fleetd: u32,
}

impl StoredFormat {
    /// A store that records no format: written by fleet 0.1, format 1.
    pub const UNRECORDED: StoredFormat = StoredFormat { format: 1, oldest_fleetd: 1 };
}

/// One step of a store's layout, named for the logs and the CHANGELOG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// The format it leaves the store in.
    pub to: u32,
    pub name: &'static str,
    /// The oldest fleetd format that still runs on the store once migrated.
    pub oldest_fleetd: u32,
}

/// What a fleetd does with the store it opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run on it as it is.
    Run,
    /// Apply these migrations (none: only record the format), then record `then` and run.
    Migrate { steps: Vec<Migration>, then: StoredFormat },
    /// Stay out, writing nothing.
    Refuse(Refusal),
}

/// Why a fleetd stays out of a store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the store is of format {stored}, which fleetds of format {oldest_fleetd} or later run on; this fleetd \
         is of format {current}: upgrade it to the version the other members run (fleetd --version says each \
         one's format)"
    )]
    TooOld { stored: u32, oldest_fleetd: u32, current: u32 },
    #[error(
        "the store is of format {stored}, older than this fleetd (format {current}) can migrate; upgrade \
         through a release of format {oldest_migrated} first"
    )]
    TooNew { stored: u32, current: u32, oldest_migrated: u32 },
}

/// What a fleetd of format `current`, knowing `migrations`, does with a store recording
/// `stored` (`None`: nothing recorded).
pub fn decide(stored: Option<StoredFormat>, current: u32, migrations: &[Migration]) -> Decision {
    let recorded = stored.unwrap_or(StoredFormat::UNRECORDED);
    if recorded.format > current {
        return if recorded.oldest_fleetd <= current {
            Decision::Run
        } else {
            Decision::Refuse(Refusal::TooOld {
                stored: recorded.format,
                oldest_fleetd: recorded.oldest_fleetd,
                current,
            })
        };
    }
    let steps: Vec<Migration> =
        migrations.iter().filter(|step| step.to > recorded.format && step.to <= current).copied().collect();
    let reachable = (recorded.format + 1..=current).all(|format| steps.iter().any(|step| step.to == format));
    if !reachable {
        let oldest_migrated = migrations.first().map_or(current, |first| first.to - 1);
        return Decision::Refuse(Refusal::TooNew { stored: recorded.format, current, oldest_migrated });
    }
    match (stored, steps.last()) {
        (Some(_), None) => Decision::Run,
        (None, None) => Decision::Migrate { steps, then: recorded },
        (_, Some(last)) => {
            let then = StoredFormat { format: current, oldest_fleetd: last.oldest_fleetd };
            Decision::Migrate { steps, then }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: Migration = Migration { to: 2, name: "two", oldest_fleetd: 1 };
    const THREE: Migration = Migration { to: 3, name: "three", oldest_fleetd: 2 };

    #[test]
    fn an_unrecorded_store_is_format_one_and_gets_its_format_recorded() {
        let decided = decide(None, 1, &[]);
        assert_eq!(decided, Decision::Migrate { steps: vec![], then: StoredFormat { format: 1, oldest_fleetd: 1 } });
        assert_eq!(decide(Some(StoredFormat::UNRECORDED), 1, &[]), Decision::Run);
    }

    #[test]
    fn an_older_store_is_migrated_step_by_step() {
        let decided = decide(None, 3, &[TWO, THREE]);
        assert_eq!(
            decided,
            Decision::Migrate { steps: vec![TWO, THREE], then: StoredFormat { format: 3, oldest_fleetd: 2 } }
        );
        let from_two = decide(Some(StoredFormat { format: 2, oldest_fleetd: 1 }), 3, &[TWO, THREE]);
        assert_eq!(
            from_two,
            Decision::Migrate { steps: vec![THREE], then: StoredFormat { format: 3, oldest_fleetd: 2 } }
        );
    }

    /// The skew of one: the previous release runs on a store the current one migrated; one
    /// older still stays out, naming both formats.
    #[test]
    fn a_fleetd_of_the_previous_format_runs_and_an_older_one_stays_out() {
        assert_eq!(decide(Some(StoredFormat { format: 3, oldest_fleetd: 2 }), 2, &[TWO]), Decision::Run);
        let refused = decide(Some(StoredFormat { format: 3, oldest_fleetd: 2 }), 1, &[]);
        assert_eq!(refused, Decision::Refuse(Refusal::TooOld { stored: 3, oldest_fleetd: 2, current: 1 }));
        let Decision::Refuse(refusal) = refused else { unreachable!() };
        assert!(refusal.to_string().contains("format 3") && refusal.to_string().contains("format 1"), "{refusal}");
    }

    #[test]
    fn a_store_older_than_the_migrations_known_is_refused() {
        let decided = decide(Some(StoredFormat { format: 1, oldest_fleetd: 1 }), 3, &[THREE]);
        assert_eq!(decided, Decision::Refuse(Refusal::TooNew { stored: 1, current: 3, oldest_migrated: 2 }));
    }

    #[test]
    fn every_migration_keeps_the_previous_format_running() {
        for (index, step) in MIGRATIONS.iter().enumerate() {
            assert_eq!(step.to, index as u32 + 2, "migrations are consecutive from format 1: {step:?}");
            assert!(step.oldest_fleetd < step.to, "{} must keep format {} running", step.name, step.to - 1);
        }
        assert_eq!(MIGRATIONS.last().map_or(1, |last| last.to), CURRENT, "the migrations end at CURRENT");
    }
}
