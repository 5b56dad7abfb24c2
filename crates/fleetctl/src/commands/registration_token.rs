//! `fleetctl registration-token create|list|revoke`: the tokens pull agents join with.

use fleet_api_schema::{RegistrationToken, RegistrationTokenRequest};
use fleet_core::duration::parse_go_duration;
use fleet_core::machine::parse_metadata;

use super::token::time;
use crate::context::Context;
use crate::table::tab_table;
use crate::{Outcome, RegistrationTokenCommand};

pub async fn run(context: &Context, command: RegistrationTokenCommand) -> Outcome {
    match command {
        RegistrationTokenCommand::Create { ttl, max_uses, metadata, machine_ids, name } => {
            create(context, ttl.as_deref(), max_uses, &metadata, machine_ids, name).await
        }
        RegistrationTokenCommand::List { no_legend } => list(context, no_legend).await,
        RegistrationTokenCommand::Revoke { name } => revoke(context, &name).await,
    }
}

async fn create(
    context: &Context,
    ttl: Option<&str>,
    max_uses: Option<u32>,
    metadata: &str,
    machine_ids: Option<String>,
    name: String,
) -> Outcome {
    let ttl_seconds = match ttl.map(parse_go_duration).transpose() {
        Ok(ttl) => ttl.map(|ttl| ttl.as_secs().max(1)),
        Err(error) => {
            eprintln!("Invalid --ttl {:?}: {error}", ttl.unwrap_or_default());
            return Outcome::Usage;
        }
    };
    let request =
        RegistrationTokenRequest { name, ttl_seconds, max_uses, metadata: parse_metadata(metadata), machine_ids };
    match context.client.create_registration_token(&request).await {
        Ok(RegistrationToken { token: Some(token), name, expires, .. }) => {
            println!("{token}");
            let until = expires.map_or("never expires".to_string(), |at| format!("expires {}", time(at)));
            eprintln!("Registration token {name} created ({until}). It is shown only now: store it.");
            Outcome::Success
        }
        Ok(_) => {
            eprintln!("Error creating registration token: the API returned no token");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error creating registration token: {error}");
            Outcome::Failure
        }
    }
}

async fn list(context: &Context, no_legend: bool) -> Outcome {
    let tokens = match context.client.registration_tokens().await {
        Ok(tokens) => tokens,
        Err(error) => {
            eprintln!("Error listing registration tokens: {error}");
            return Outcome::Failure;
        }
    };
    let mut rows = Vec::with_capacity(tokens.len() + 1);
    if !no_legend {
        rows.push(["NAME", "USES", "EXPIRES", "METADATA"].map(str::to_string).to_vec());
    }
    for token in tokens {
        let uses = match token.max_uses {
            Some(max) => format!("{}/{max}", token.uses),
            None => token.uses.to_string(),
        };
        let metadata: Vec<String> = token.metadata.iter().map(|(key, value)| format!("{key}={value}")).collect();
        let metadata = if metadata.is_empty() { "-".to_string() } else { metadata.join(",") };
        rows.push(vec![token.name, uses, token.expires.map_or("-".to_string(), time), metadata]);
    }
    print!("{}", tab_table(&rows));
    Outcome::Success
}

async fn revoke(context: &Context, name: &str) -> Outcome {
    match context.client.revoke_registration_token(name).await {
        Ok(true) => {
            eprintln!("Revoked registration token {name}");
            Outcome::Success
        }
        Ok(false) => {
            eprintln!("Registration token {name} does not exist");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error revoking registration token {name}: {error}");
            Outcome::Failure
        }
    }
}
