//! `fleetctl token create|list|revoke`: the API's bearer tokens.

use fleet_api_schema::{Token, TokenRequest};
use fleet_core::civil_time::CivilTime;
use fleet_core::duration::parse_go_duration;

use crate::context::Context;
use crate::table::tab_table;
use crate::{Outcome, TokenCommand};

pub async fn run(context: &Context, command: TokenCommand) -> Outcome {
    match command {
        TokenCommand::Create { role, units, secrets, ttl, name } => {
            create(context, TokenRequest { name, role, units, secrets, ttl_seconds: None }, ttl.as_deref()).await
        }
        TokenCommand::List { no_legend } => list(context, no_legend).await,
        TokenCommand::Revoke { name } => revoke(context, &name).await,
    }
}

async fn create(context: &Context, request: TokenRequest, ttl: Option<&str>) -> Outcome {
    let ttl_seconds = match ttl.map(parse_go_duration).transpose() {
        Ok(ttl) => ttl.map(|ttl| ttl.as_secs().max(1)),
        Err(error) => {
            eprintln!("Invalid --ttl {:?}: {error}", ttl.unwrap_or_default());
            return Outcome::Usage;
        }
    };
    let request = TokenRequest { ttl_seconds, ..request };
    match context.client.create_token(&request).await {
        Ok(Token { token: Some(token), name, expires, .. }) => {
            println!("{token}");
            let until = expires.map_or("never expires".to_string(), |at| format!("expires {}", time(at)));
            eprintln!("Token {name} created ({until}). It is shown only now: store it.");
            Outcome::Success
        }
        Ok(_) => {
            eprintln!("Error creating token: the API returned no token");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error creating token: {error}");
            Outcome::Failure
        }
    }
}

pub fn time(seconds: u64) -> String {
    CivilTime::from_unix(seconds).rfc3339()
}

async fn list(context: &Context, no_legend: bool) -> Outcome {
    let tokens = match context.client.tokens().await {
        Ok(tokens) => tokens,
        Err(error) => {
            eprintln!("Error listing tokens: {error}");
            return Outcome::Failure;
        }
    };
    let mut rows = Vec::with_capacity(tokens.len() + 1);
    if !no_legend {
        rows.push(["NAME", "ROLE", "UNITS", "SECRETS", "CREATED", "EXPIRES"].map(str::to_string).to_vec());
    }
    for token in tokens {
        rows.push(vec![
            token.name,
            token.role,
            token.units.unwrap_or_else(|| "-".into()),
            token.secrets.unwrap_or_else(|| "-".into()),
            time(token.created),
            token.expires.map_or("-".to_string(), time),
        ]);
    }
    print!("{}", tab_table(&rows));
    Outcome::Success
}

async fn revoke(context: &Context, name: &str) -> Outcome {
    match context.client.revoke_token(name).await {
        Ok(true) => {
            eprintln!("Revoked token {name}");
            Outcome::Success
        }
        Ok(false) => {
            eprintln!("Token {name} does not exist");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error revoking token {name}: {error}");
            Outcome::Failure
        }
    }
}
