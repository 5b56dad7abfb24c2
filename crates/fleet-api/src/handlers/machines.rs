//! `/machines`: list, and runtime metadata changes through PATCH.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use fleet_core::access::Role;
use fleet_core::drain::Drain;
use fleet_registry::{MetadataChange, PageRequest};
use serde_json::Value;

use crate::api_state::ApiState;
use crate::error::{ApiError, json_response};
use crate::query::{flag, page_token};
use crate::schema::{Machine, MachinePage};

/// The machines, their drains naming only the units `role` sees; with `?outOfTouch=true`,
/// the machines out of touch that units wait for after them, on the last page.
pub async fn list(state: &ApiState, query: &[(String, String)], role: &Role) -> Result<Response, ApiError> {
    let token = page_token(query, state.page_size.get())?;
    let (start, limit) = token.window();
    let listing = "machines";
    let after = state.page_cursors.after(listing, start);
    let request = PageRequest { start, limit, admits: Arc::new(|_: &str| true), after };
    let page = state.registry.machines_page(request).await?;
    let leader = state.registry.engine_leader().await?;
    let drained: Vec<(String, Drain)> =
        page.items.iter().filter_map(|machine| Some((machine.id.clone(), machine.drain.clone()?))).collect();
    let mut drains = crate::handlers::drains::statuses(state, &drained).await?;
    let machines: Vec<Machine> = page
        .items
        .into_iter()
        .map(|machine| Machine {
            engine_leader: leader.as_ref() == Some(&machine.id),
            connection: machine.connection.word().to_string(),
            capacity: machine.capacity.map(Into::into),
            drain: drains.remove(&machine.id).map(|drain| crate::handlers::drains::seen_by(drain, role)),
            taints: fleet_core::taint::written(&machine.taints),
            id: machine.id,
            metadata: machine.metadata,
            primary_ip: machine.public_ip,
            out_of_touch_since: String::new(),
            version: machine.version,
        })
        .collect();
    let mut machines = machines;
    if !page.more && flag(query, "outOfTouch", false)? {
        machines.extend(
            crate::out_of_touch::machines(&*state.registry).await?.into_iter().map(crate::out_of_touch::listed_machine),
        );
    }
    let (machines, encoded, next) = token.page_encoded(machines, page.more);
    if let (Some(_), Some(last)) = (&next, machines.last()) {
        state.page_cursors.remember(listing, start + machines.len(), last.id.clone());
    }
    Ok(json_response(StatusCode::OK, &MachinePage { machines: encoded, next_page_token: next.map(|t| t.encode()) }))
}

/// A field of a JSON object, its name matched case-insensitively as the original's decoder does.
fn field<'a>(object: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).or_else(|| object.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, v)| v))
}

/// What an operation's path names: a machine's metadata key or (our addition) its taint.
enum Target {
    Metadata,
    Taint,
}

/// `/<machine>/metadata/<key>` or `/<machine>/taints/<key>`, where the key is made of
/// `[A-Za-z0-9_.-]`.
fn metadata_path(path: &str) -> Option<(String, Target, String)> {
    let rest = path.strip_prefix('/')?;
    let (machine, target, key) = match rest.split_once("/metadata/") {
        Some((machine, key)) => (machine, Target::Metadata, key),
        None => {
            let (machine, key) = rest.split_once("/taints/")?;
            (machine, Target::Taint, key)
        }
    };
    let valid_key = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    (!machine.is_empty() && !machine.contains('/') && valid_key).then(|| (machine.to_string(), target, key.to_string()))
}

/// Reads one operation; the value may be `"x"` (documented) or `{"value":"x"}` (the
/// original's actual wire form).
fn operation(value: &Value) -> Result<MetadataChange, ApiError> {
    let object = value.as_object().ok_or_else(|| ApiError::bad_request("unable to decode body: expected an object"))?;
    let text = |name: &str| field(object, name).and_then(Value::as_str).unwrap_or("").to_string();
    let op = text("op");
    if !["add", "remove", "replace"].contains(&op.as_str()) {
        return Err(ApiError::bad_request("invalid op: expect add, remove, or replace"));
    }
    let (machine_id, target, key) =
        metadata_path(&text("path")).ok_or_else(|| ApiError::bad_request("machine metadata path invalid"))?;
    let value = match field(object, "value") {
        Some(Value::String(value)) => value.clone(),
        Some(Value::Object(nested)) => field(nested, "value").and_then(Value::as_str).unwrap_or("").to_string(),
        _ => String::new(),
    };
    if let Target::Taint = target {
        // A taint is written after its key: `yes`, `yes:evict`, `:evict`, or nothing.
        let taint = match op.as_str() {
            "remove" => None,
            _ => Some(
                fleet_core::taint::parse_after_key(&key, &value)
                    .map_err(|error| ApiError::bad_request(format!("invalid taint: {error}")))?,
            ),
        };
        let (key, value) = fleet_core::taint::override_entry(&key, taint.as_ref());
        return Ok(match taint {
            Some(_) => MetadataChange::Set { machine_id, key, value },
            None => MetadataChange::Remove { machine_id, key },
        });
    }
    if op == "remove" {
        return Ok(MetadataChange::Remove { machine_id, key });
    }
    if value.is_empty() {
        return Err(ApiError::bad_request("invalid value: add and replace require a value"));
    }
    Ok(MetadataChange::Set { machine_id, key, value })
}

pub async fn patch(state: &ApiState, body: &[u8]) -> Result<Response, ApiError> {
    let operations: Vec<Value> = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("unable to decode body: {error}")))?;
    let changes = operations.iter().map(operation).collect::<Result<Vec<_>, _>>()?;
    let machines = state.registry.machines().await?;
    for change in &changes {
        let (MetadataChange::Set { machine_id, .. } | MetadataChange::Remove { machine_id, .. }) = change;
        if !machines.iter().any(|machine| &machine.id == machine_id) {
            return Err(ApiError::not_found(format!("machine {machine_id:?} does not exist")));
        }
    }
    state.registry.change_metadata(&changes).await?;
    Ok((StatusCode::NO_CONTENT, [(header::CONTENT_TYPE, "application/json")]).into_response())
}
