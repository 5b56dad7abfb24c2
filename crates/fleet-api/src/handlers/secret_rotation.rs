//! The writes of a secret's rotation (`fleet_core::secret_rotation` plans it): who may move
//! the units that name it, the pins, and the rollout (`secret-<name>`) that restarts the
//! running ones in waves, stepped by the engine leader's rollout driver like any other.

use axum::http::StatusCode;
use fleet_core::DesiredState;
use fleet_core::access::{Access, Action, Role, decide};
use fleet_core::rollout::{Gates, MaxUnavailable, Rollout, RolloutState, RolloutUnit, Step, check_wait};
use fleet_core::secret_rotation::NamingUnit;
use fleet_core::secrets::SecretPins;
use fleet_registry::{RolledSecret, RolloutRecord, UnitView};

use crate::api_state::ApiState;
use crate::auth::tokens::now_unix;
use crate::error::ApiError;
use crate::schema::SecretValue;

/// How many units at most a rotation restarts at once when the set does not say: a quarter.
const DEFAULT_MAX_UNAVAILABLE: MaxUnavailable = MaxUnavailable::Percent(25);
const DEFAULT_MIN_READY: u64 = 10;
const DEFAULT_DEADLINE: u64 = 120;

/// How a rotation's rollout goes, as a set asks for it: checked before anything is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waves {
    max_unavailable: MaxUnavailable,
    min_ready: u64,
    deadline: u64,
    gates: Gates,
}

impl Waves {
    pub fn of(request: &SecretValue) -> Result<Self, ApiError> {
        let bad = |message: String| ApiError::bad_request(message);
        let asks_waves = request.max_unavailable.is_some()
            || request.min_ready_seconds.is_some()
            || request.deadline_seconds.is_some()
            || request.canary.is_some()
            || request.bake_seconds.is_some()
            || request.auto_revert;
        if request.no_restart && asks_waves {
            return Err(bad("noRestart restarts nothing: it takes no rollout settings".into()));
        }
        let max_unavailable = match &request.max_unavailable {
            Some(text) => MaxUnavailable::parse(text).map_err(bad)?,
            None => DEFAULT_MAX_UNAVAILABLE,
        };
        let gates = Gates::parse(request.canary.as_deref(), request.bake_seconds, request.auto_revert).map_err(bad)?;
        let min_ready =
            check_wait("minReadySeconds", request.min_ready_seconds.unwrap_or(DEFAULT_MIN_READY)).map_err(bad)?;
        let deadline =
            check_wait("deadlineSeconds", request.deadline_seconds.unwrap_or(DEFAULT_DEADLINE)).map_err(bad)?;
        Ok(Self { max_unavailable, min_ready, deadline, gates })
    }
}

/// The name of the rollout of a secret's new value: `secret-<name>` where the secret's name
/// is a rollout's (lower case, digits and `-`, short enough), else that with the rest made so
/// and a short hash of the name, which keeps two secrets' rollouts apart.
pub fn rollout_name(secret: &str) -> String {
    let plain = format!("secret-{secret}");
    if fleet_core::source::checks::check_source_name(&plain).is_ok() {
        return plain;
    }
    let kept: String =
        secret.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(40).collect();
    let digest = fleet_core::secrets::version_identity(secret, 0).to_string();
    format!("secret-{}-{}", kept.trim_matches('-'), &digest[..8])
}

/// A unit that names the secret, as its rotation plans it.
pub fn naming_unit(unit: &UnitView) -> NamingUnit {
    NamingUnit { name: unit.name.clone(), pins: unit.secrets.clone(), running: unit.desired == DesiredState::Launched }
}

/// A new value restarts or changes every unit that names the secret: `role` must be allowed
/// to write each of them.
pub fn check_may_move(role: &Role, secret: &str, units: &[UnitView]) -> Result<(), ApiError> {
    match units.iter().find(|unit| decide(role, Action::WriteUnit(&unit.name)) != Access::Allowed) {
        Some(unit) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{role} may not change unit {}, which names secret {secret}", unit.name),
        )),
        None => Ok(()),
    }
}

/// One rotation of a secret at a time: refused while its rollout runs or is paused.
pub async fn check_no_rollout_runs(state: &ApiState, rollout: &str, secret: &str) -> Result<(), ApiError> {
    let running = state.registry.rollouts().await?.into_iter().find(|record| record.name == rollout);
    match running.filter(|record| record.rollout.state != RolloutState::Done) {
        Some(record) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "secret {secret} is still being rolled out (rollout {rollout} is {}): wait for it, or undo it",
                record.rollout.state_word()
            ),
        )),
        None => Ok(()),
    }
}

/// Writes each unit's pins; a unit destroyed meanwhile is passed over.
pub async fn write_pins(state: &ApiState, pins: &[(String, SecretPins)]) -> Result<(), ApiError> {
    for (unit, pins) in pins {
        state.registry.set_secret_pins(unit, pins).await?;
    }
    Ok(())
}

/// Stores the rollout that moves `rolled` to the new version, when any is not there yet;
/// its name when it did.
pub async fn start_rollout(
    state: &ApiState,
    name: &str,
    secret: &str,
    rolled: Vec<RolloutUnit>,
    versions: Vec<u64>,
    waves: &Waves,
    naming: &[UnitView],
) -> Result<Option<String>, ApiError> {
    if rolled.iter().all(|unit| unit.step == Step::Done) {
        return Ok(None);
    }
    let machine_of = |unit: &RolloutUnit| {
        naming.iter().find(|view| view.name == unit.name).and_then(|view| view.machine_id.as_deref())
    };
    let (canary, units) = waves.gates.replacement_order(rolled, machine_of);
    let rollout = Rollout {
        canary,
        units,
        max_unavailable: waves.max_unavailable,
        min_ready: waves.min_ready,
        deadline: waves.deadline,
        state: RolloutState::Running,
        undo: false,
        auto_revert: waves.gates.auto_revert,
        reverted: None,
        held: None,
    };
    let record = RolloutRecord {
        name: name.to_string(),
        rollout,
        bodies: Default::default(),
        created: now_unix(),
        source_commit: None,
        secret: Some(RolledSecret { name: secret.to_string(), versions }),
        // A secret's rollout moves pins, which make no unit version.
        started_by: None,
    };
    state.registry.put_rollout(&record).await?;
    Ok(Some(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secrets_rollout_is_named_for_it_and_apart_from_any_other() {
        assert_eq!(rollout_name("db-password"), "secret-db-password");
        let upper = rollout_name("DB_PASSWORD");
        assert!(upper.starts_with("secret-db-password-") && upper.len() == "secret-db-password-".len() + 8);
        assert_ne!(upper, rollout_name("db.password"));
        let long = rollout_name(&"x".repeat(128));
        assert!(fleet_core::source::checks::check_source_name(&long).is_ok(), "{long}");
    }

    #[test]
    fn a_new_value_may_move_only_units_the_role_may_write() {
        let view = |name: &str| {
            let file = fleet_core::UnitFile::parse("[Service]\nExecStart=/bin/true\n[X-Fleet]\nSecret=db\n").unwrap();
            UnitView::from_records(
                name,
                fleet_registry::UnitRecord::by_hand(file.hash(), DesiredState::Launched),
                file,
                None,
                None,
                None,
            )
        };
        let web = Role::parse("operator", Some("web-*")).unwrap().with_secrets(Some("*")).unwrap();
        assert!(check_may_move(&web, "db", &[view("web-1.service")]).is_ok());
        let refused = check_may_move(&web, "db", &[view("web-1.service"), view("billing.service")]).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(
            refused.message.contains("may not change unit billing.service, which names secret db"),
            "{}",
            refused.message
        );
        assert!(check_may_move(&Role::Admin, "db", &[view("billing.service")]).is_ok());
    }

    #[test]
    fn no_restart_takes_no_rollout_settings_and_bad_settings_are_refused() {
        let request = |edit: &dyn Fn(&mut SecretValue)| {
            let mut request = SecretValue { value: "eA==".into(), ..SecretValue::default() };
            edit(&mut request);
            Waves::of(&request)
        };
        assert_eq!(request(&|_| {}).unwrap().max_unavailable, DEFAULT_MAX_UNAVAILABLE);
        assert!(request(&|r| r.no_restart = true).is_ok());
        assert!(
            request(&|r| {
                r.no_restart = true;
                r.max_unavailable = Some("1".into());
            })
            .is_err()
        );
        assert!(request(&|r| r.max_unavailable = Some("0".into())).is_err());
        assert!(request(&|r| r.bake_seconds = Some(5)).is_err(), "a bake needs a canary");
        assert!(request(&|r| r.deadline_seconds = Some(0)).is_err());
    }
}
