//! `/fleet/v1/secrets` (our addition): cluster secrets. A value is sealed under the cluster's
//! secrets key before it reaches the store, and never leaves through this API: lists show
//! names, versions, sizes, who set them and when. Units name secrets (`[X-Fleet] Secret=`),
//! which [`check_named`] checks where units are submitted.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fleet_core::UnitFile;
use fleet_core::access::Role;
use fleet_core::secret_rotation::{NamingUnit, plan_rotation};
use fleet_core::secrets::{name_problem, references, value_problem};
use fleet_core::unit_name::UnitNameInfo;
use fleet_registry::{PageRequest, SecretRecord, UnitView};

use crate::api_state::ApiState;
use crate::auth::Identity;
use crate::auth::tokens::now_unix;
use crate::error::{ApiError, json_response};
use crate::handlers::secret_rotation::{self, Waves};
use crate::schema::{SecretInfo, SecretList, SecretValue, SecretsResealed};

/// How many times a set is tried again when another set of the same secret came in between.
const SET_ATTEMPTS: usize = 5;

fn info(record: SecretRecord) -> SecretInfo {
    SecretInfo {
        name: record.name,
        version: record.version,
        size: record.size,
        set_by: record.set_by,
        set_at: record.set_at,
        kept: record.kept.keys().copied().collect(),
        rollout: None,
        moved: None,
    }
}

pub async fn list(state: &ApiState) -> Result<Response, ApiError> {
    let secrets = state.registry.secrets().await?.into_iter().map(info).collect();
    Ok(json_response(StatusCode::OK, &SecretList { secrets }))
}

/// `PUT /fleet/v1/secrets/{name}`: sets the secret's value (a new version), sealed here, and
/// takes it to the units that name it (`secret_rotation`): the running ones restarted in
/// waves by a rollout, or, with `noRestart`, given it where they run.
pub async fn put(state: &ApiState, identity: &Identity, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    if let Some(problem) = name_problem(name) {
        return Err(ApiError::bad_request(problem));
    }
    // Never echoes the body: serde's message could quote the value.
    let request: SecretValue = serde_json::from_slice(body).map_err(|_| {
        ApiError::bad_request(
            "invalid secret: expected {\"value\": \"<base64>\"} and the rollout's settings (maxUnavailable, minReadySeconds, deadlineSeconds, canary, bakeSeconds, autoRevert) or noRestart",
        )
    })?;
    let value = STANDARD
        .decode(request.value.as_bytes())
        .map_err(|_| ApiError::bad_request("invalid secret: value is not base64"))?;
    if let Some(problem) = value_problem(&value) {
        return Err(ApiError::bad_request(problem));
    }
    let waves = Waves::of(&request)?;
    let keys = state.secret_keys.get().map_err(|why| {
        tracing::warn!("cannot set secret {name}: {why}");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("this fleetd holds no secrets key: {why}"))
    })?;
    let rollout_name = secret_rotation::rollout_name(name);
    for _ in 0..SET_ATTEMPTS {
        let stored = state.registry.secret(name).await?;
        let previous = stored.as_ref().map(|stored| stored.version);
        let version = previous.map_or(1, |version| version + 1);
        // A template runs nowhere: its instances are units of their own.
        let mut naming = naming_units(state, name).await?;
        naming.retain(|unit| !UnitNameInfo::new(&unit.name).is_template());
        secret_rotation::check_may_move(&identity.role, name, &naming)?;
        secret_rotation::check_no_rollout_runs(state, &rollout_name, name).await?;
        let units: Vec<NamingUnit> = naming.iter().map(secret_rotation::naming_unit).collect();
        let plan = plan_rotation(name, previous, version, &units, request.no_restart);
        // Every running unit is held on the version it runs before a newer one exists.
        secret_rotation::write_pins(state, &plan.hold).await?;
        let sealed = fleet_secrets::seal(&keys, name, version, &value)
            .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?;
        let kept = plan
            .kept
            .iter()
            .filter_map(|&older| {
                let sealed = stored.as_ref()?.sealed_version(older)?;
                Some((older, sealed.to_string()))
            })
            .collect();
        let record = SecretRecord {
            name: name.to_string(),
            version,
            size: value.len(),
            set_by: identity.name.clone(),
            set_at: now_unix(),
            sealed,
            kept,
        };
        if !state.registry.put_secret(&record, previous).await? {
            continue;
        }
        secret_rotation::write_pins(state, &plan.moved).await?;
        let rollout =
            secret_rotation::start_rollout(state, &rollout_name, name, plan.rolled, plan.versions, &waves, &naming)
                .await?;
        tracing::info!(secret = name, version, rolled = ?rollout, moved = plan.moved.len(), "secret set");
        let status = if previous.is_none() { StatusCode::CREATED } else { StatusCode::OK };
        let shown = SecretInfo { rollout, moved: Some(plan.moved.len()), ..info(record) };
        return Ok(json_response(status, &shown));
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        format!("secret {name} is being set by others at the same time; try again"),
    ))
}

/// The units that name the secret `name`.
async fn naming_units(state: &ApiState, name: &str) -> Result<Vec<UnitView>, ApiError> {
    // From the API's copy where the store keeps one: every unit's file, read from it, not etcd.
    Ok(state
        .registry
        .units_page(PageRequest::everything())
        .await?
        .items
        .into_iter()
        .filter(|unit| references(&unit.file).is_ok_and(|named| named.iter().any(|named| named.secret == name)))
        .collect())
}

/// `DELETE /fleet/v1/secrets/{name}`: refused while a unit names it (it could not start again).
pub async fn delete(state: &ApiState, name: &str) -> Result<Response, ApiError> {
    let naming: Vec<String> = naming_units(state, name).await?.into_iter().map(|unit| unit.name).collect();
    if !naming.is_empty() {
        let shown: Vec<&str> = naming.iter().take(10).map(String::as_str).collect();
        let more = if naming.len() > shown.len() {
            format!(" and {} more", naming.len() - shown.len())
        } else {
            String::new()
        };
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("secret {name} is named by {}{more}: destroy them or drop their Secret= first", shown.join(", ")),
        ));
    }
    if state.registry.remove_secret(name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("secret does not exist"))
    }
}

/// `POST /fleet/v1/secrets-reseal` (administrators): every value sealed again under the key
/// that now seals, after a rotation of the cluster's secrets key; versions stay.
pub async fn reseal(state: &ApiState) -> Result<Response, ApiError> {
    let keys = state.secret_keys.get().map_err(|why| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("this fleetd holds no secrets key: {why}"))
    })?;
    let sealing = keys.sealing().id().to_string();
    let (mut resealed, mut already) = (0, 0);
    for record in state.registry.secrets().await? {
        let sealed_now = |sealed: &String| fleet_secrets::sealed_with(sealed) == Some(sealing.as_str());
        if sealed_now(&record.sealed) && record.kept.values().all(sealed_now) {
            already += 1;
            continue;
        }
        let reseal = |version: u64, sealed: &str| {
            let opened = fleet_secrets::open(&keys, &record.name, version, sealed).map_err(|error| {
                ApiError::new(StatusCode::CONFLICT, format!("secret {} cannot be sealed again: {error}", record.name))
            })?;
            fleet_secrets::seal(&keys, &record.name, version, opened.expose())
                .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))
        };
        let sealed = reseal(record.version, &record.sealed)?;
        let kept = record
            .kept
            .iter()
            .map(|(&version, sealed)| Ok((version, reseal(version, sealed)?)))
            .collect::<Result<_, ApiError>>()?;
        let again = SecretRecord { sealed, kept, ..record.clone() };
        // A value set meanwhile was sealed under the new key by its set.
        if state.registry.put_secret(&again, Some(record.version)).await? {
            resealed += 1;
        } else {
            already += 1;
        }
    }
    tracing::info!(resealed, already, sealing_key = sealing, "secrets sealed again");
    Ok(json_response(StatusCode::OK, &SecretsResealed { resealed, already, sealing_key: sealing }))
}

/// Checks the secrets the units in `files` name: `role` may name each (403), and each
/// exists (400). Read once for all of them.
pub async fn check_named<'a>(
    state: &ApiState,
    role: &Role,
    files: impl IntoIterator<Item = (&'a str, &'a UnitFile)>,
) -> Result<(), ApiError> {
    let mut named: Vec<(&str, String)> = Vec::new();
    for (unit, file) in files {
        let references = references(file).map_err(|error| ApiError::bad_request(format!("unit {unit}: {error}")))?;
        for reference in references {
            if !role.holds_secret(&reference.secret) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!("{role} may not name secret {} (unit {unit})", reference.secret),
                ));
            }
            named.push((unit, reference.secret));
        }
    }
    if named.is_empty() {
        return Ok(());
    }
    let stored: BTreeSet<String> = state.registry.secrets().await?.into_iter().map(|secret| secret.name).collect();
    match named.iter().find(|(_, secret)| !stored.contains(secret)) {
        Some((unit, secret)) => Err(ApiError::bad_request(format!(
            "unit {unit} names secret {secret}, which does not exist: set it first (fleetctl secret set {secret})"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fleet_registry::CredentialRegistry;
    use fleet_store_embedded::EmbeddedRegistry;

    use super::*;
    use crate::auth::Auth;

    async fn state_with(secrets: &[&str]) -> (ApiState, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
        for name in secrets {
            let record = SecretRecord {
                name: name.to_string(),
                version: 1,
                size: 1,
                set_by: "test".into(),
                set_at: 0,
                sealed: String::new(),
                kept: Default::default(),
            };
            assert!(registry.put_secret(&record, None).await.unwrap());
        }
        (ApiState::new(Arc::new(registry.clone()), Auth::new(Arc::new(registry), None)), dir)
    }

    fn unit(secrets: &[&str]) -> UnitFile {
        let lines: String = secrets.iter().map(|secret| format!("Secret={secret}\n")).collect();
        UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{lines}")).unwrap()
    }

    #[tokio::test]
    async fn a_unit_names_only_secrets_that_exist_and_its_writer_holds() {
        let (state, _dir) = state_with(&["web-db", "billing-key"]).await;
        let scoped = Role::parse("operator", Some("web-*")).unwrap().with_secrets(Some("web-*")).unwrap();
        let web = unit(&["web-db:DB"]);
        assert!(check_named(&state, &scoped, [("web-1.service", &web)]).await.is_ok());
        assert!(check_named(&state, &Role::Admin, [("web-1.service", &unit(&["billing-key"]))]).await.is_ok());

        let billing = unit(&["billing-key"]);
        let refused = check_named(&state, &scoped, [("web-1.service", &billing)]).await.unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.message);
        let unscoped = Role::parse("operator", None).unwrap();
        let refused = check_named(&state, &unscoped, [("web-1.service", &web)]).await.unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "an operator without a secret pattern names none");

        let missing = unit(&["web-cache"]);
        let refused = check_named(&state, &scoped, [("web-1.service", &missing)]).await.unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert!(refused.message.contains("names secret web-cache, which does not exist"), "{}", refused.message);
        let no_secrets = unit(&[]);
        assert!(check_named(&state, &Role::Viewer, [("a.service", &no_secrets)]).await.is_ok(), "nothing to check");
    }

    #[tokio::test]
    async fn a_value_is_sealed_before_the_store_and_never_answered() {
        let (mut state, dir) = state_with(&[]).await;
        state.secret_keys = Arc::new(crate::secret_keys::SecretKeys::own_at(dir.path().join("secrets.key")));
        let identity = Identity {
            name: "token:ci".into(),
            role: Role::Admin,
            via: crate::auth::Via::UnixSocket,
            key_sha256: None,
        };
        let body = br#"{"value":"aHVudGVyMi1wbGFpbnRleHQ="}"#; // hunter2-plaintext
        let answer = put(&state, &identity, "db", body).await.unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        let stored = state.registry.secret("db").await.unwrap().unwrap();
        assert_eq!((stored.version, stored.size, stored.set_by.as_str()), (1, 17, "token:ci"));
        assert!(!stored.sealed.contains("hunter2"));
        let keys = state.secret_keys.get().unwrap();
        assert_eq!(fleet_secrets::open(&keys, "db", 1, &stored.sealed).unwrap().expose(), b"hunter2-plaintext");
        assert_eq!(put(&state, &identity, "db", body).await.unwrap().status(), StatusCode::OK, "a new version");
        assert_eq!(state.registry.secret("db").await.unwrap().unwrap().version, 2);
        let listed = list(&state).await.unwrap();
        let bytes = axum::body::to_bytes(listed.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("\"name\":\"db\"") && !text.contains("sealed") && !text.contains("aHVudGVy"), "{text}");

        for (bad, says) in [
            (&br#"{"value":"!!"}"#[..], "not base64"),
            (br#"{"value":""}"#, "may not be empty"),
            (br#"{"value":"aGk=","extra":1}"#, "expected {"),
            (br#"hunter2"#, "expected {"),
        ] {
            let refused = put(&state, &identity, "db", bad).await.unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_REQUEST);
            assert!(refused.message.contains(says), "{}", refused.message);
            assert!(!refused.message.contains("hunter2"), "never echoes the value");
        }
        let big = format!(r#"{{"value":"{}"}}"#, STANDARD.encode(vec![b'x'; fleet_core::secrets::MAX_VALUE_BYTES + 1]));
        assert!(put(&state, &identity, "db", big.as_bytes()).await.unwrap_err().message.contains("at most 65536"));
        assert!(put(&state, &identity, "../db", body).await.unwrap_err().message.contains("is not 1 to 128"));
        assert_eq!(state.registry.secret("db").await.unwrap().unwrap().version, 2, "nothing stored by a bad request");
    }
}
