//! A client for the fleet HTTP API v1, over a Unix socket or HTTP.

#![forbid(unsafe_code)]

mod event_stream;
pub mod original_registry;
mod unreachable;
pub use event_stream::EventQuery;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleet_api_schema::{
    DrainRequest, ErrorBody, Journal, Machine, MachineDrain, MachinePage, RegistrationToken, RegistrationTokenList,
    RegistrationTokenRequest, Rollout, RolloutList, RolloutRequest, SecretInfo, SecretList, SecretValue, Source,
    SourceList, Token, TokenList, TokenRequest, Unit, UnitBatchResult, UnitBatchResults, UnitPage, UnitState,
    UnitStatePage,
};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint cannot be used (no scheme, a Unix URL with a host...).
    #[error("{0}")]
    Endpoint(String),
    /// The API answered with an error; shown as the original's Go client shows it, and when
    /// fleetd says it cannot reach etcd, with where to look (the original's message names no
    /// address, nor should an answer to any client).
    #[error("googleapi: Error {code}: {message}{}", store_hint(*code, message))]
    Api { code: u16, message: String },
    #[error("{0}")]
    Transport(String),
    #[error("unreadable answer from the fleet API: {0}")]
    Decode(String),
}

impl ClientError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Api { code: 404, .. })
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// The page size lists ask for (`pageSize`, fleetd's addition): 100,000 units come in 20
/// requests, not the 1,000 of the original's 100 a page (`bench-lists` in BENCHMARKS.md).
pub const PAGE_SIZE: u16 = 5_000;

/// The message with which fleetd answers while it cannot reach its store (the original's).
const STORE_UNREACHABLE: &str = "fleet server unable to communicate with etcd";

fn store_hint(code: u16, message: &str) -> &'static str {
    if code == 503 && message == STORE_UNREACHABLE {
        "\n(fleetd cannot reach etcd: is etcd running at the etcd_servers of fleetd's configuration? fleetd's log names the address it tries)"
    } else {
        ""
    }
}

/// How many times in all a batch of units is sent while fleetd answers that it cannot
/// reach its store, and the first wait between two sends (doubling after each).
pub const BATCH_ATTEMPTS: u32 = 5;
pub const BATCH_RETRY: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// The endpoint as given, for what an unreachable fleetd's error says.
    endpoint: String,
    /// `?takeOver=true` on unit writes (see [`ClientOptions::take_over`]).
    take_over: bool,
    /// The plan index the first unit write is made on (see [`ClientOptions::if_unchanged`]),
    /// and whether a write took it already.
    if_unchanged: Option<u64>,
    condition_taken: Arc<AtomicBool>,
    /// How long one request may take; a batch of units gets this per hundred units.
    timeout: Duration,
}

/// How long a journal request waits at least: fleetd's relay waits 10 s for the machine.
const JOURNAL_RELAY_PATIENCE: Duration = Duration::from_secs(15);

/// How long a plan of a source's sync waits at least: fleetd fetches the source first, and
/// gives a fetch 300 s.
const SOURCE_FETCH_PATIENCE: Duration = Duration::from_secs(310);

/// Units of a batch per [`Client`] request timeout it is given.
const UNITS_PER_TIMEOUT: usize = 100;

/// Where to reach the API, read from an endpoint URL.
#[derive(Debug, PartialEq, Eq)]
enum Endpoint {
    Unix(String),
    Http(String),
}

fn parse_endpoint(endpoint: &str) -> Result<Endpoint> {
    let first = endpoint.split(',').next().unwrap_or("").trim();
    let Some((scheme, rest)) = first.split_once("://") else {
        return Err(ClientError::Endpoint(unreachable::missing_scheme(first)));
    };
    match scheme {
        "unix" | "file" => {
            if !rest.starts_with('/') {
                let host = rest.split('/').next().unwrap_or("");
                return Err(ClientError::Endpoint(format!(
                    "unable to connect to host {host:?} with scheme {scheme:?}"
                )));
            }
            Ok(Endpoint::Unix(rest.to_string()))
        }
        "http" | "https" => Ok(Endpoint::Http(first.trim_end_matches('/').to_string())),
        other => Err(ClientError::Endpoint(format!("unable to connect to host {rest:?} with scheme {other:?}"))),
    }
}

/// How to reach the API beyond its address: the request timeout and the credentials.
#[derive(Clone, Default)]
pub struct ClientOptions {
    pub timeout: Duration,
    /// The CA that signed an `https://` endpoint's certificate (PEM); the system's roots
    /// otherwise.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and its key (PEM), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// A bearer token, sent with every request.
    pub token: Option<String>,
    /// Connect through this Unix socket whatever the endpoint (the local end of an SSH
    /// tunnel); TLS and the Host header still name the endpoint.
    pub through_socket: Option<PathBuf>,
    /// Unit writes take over units a git source manages (they become units made by hand).
    pub take_over: bool,
    /// The first unit write (one unit, or the first batch) is made only if the cluster is
    /// still as the plan of this index saw it (`?ifUnchanged=`); the writes after it are the
    /// command's own and carry nothing.
    pub if_unchanged: Option<u64>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("token", &self.token.as_ref().map(|_| "(redacted)"))
            .field("through_socket", &self.through_socket)
            .field("take_over", &self.take_over)
            .finish()
    }
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|error| ClientError::Endpoint(format!("cannot read {what} {}: {error}", path.display())))
}

/// Adds the TLS settings of `options` to `builder`.
pub(crate) fn with_tls(mut builder: reqwest::ClientBuilder, options: &ClientOptions) -> Result<reqwest::ClientBuilder> {
    if let Some(path) = &options.ca_file {
        let certificates = reqwest::Certificate::from_pem_bundle(&read_file(path, "CA file")?)
            .map_err(|error| ClientError::Endpoint(format!("invalid CA file {}: {error}", path.display())))?;
        builder = builder.tls_certs_only(certificates);
    }
    match (&options.cert_file, &options.key_file) {
        (Some(cert), Some(key)) => {
            let mut pem = read_file(cert, "certificate file")?;
            pem.push(b'\n');
            pem.extend(read_file(key, "key file")?);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|error| {
                ClientError::Endpoint(format!("invalid client certificate {} or key: {error}", cert.display()))
            })?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => return Err(ClientError::Endpoint("a client certificate needs both --cert-file and --key-file".into())),
    }
    Ok(builder)
}

impl Client {
    /// A client for `endpoint` (`unix:///var/run/fleet.sock`, `http://host:port`); every
    /// request gives up after `timeout`.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self> {
        Self::with_options(endpoint, &ClientOptions { timeout, ..ClientOptions::default() })
    }

    /// A client for `endpoint` (`unix:///…`, `http://…`, `https://…`) with credentials.
    pub fn with_options(endpoint: &str, options: &ClientOptions) -> Result<Self> {
        // The tree's one crypto provider, which reqwest needs even for plain HTTP; installing
        // it again is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = options.timeout;
        let mut builder = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout);
        if let Some(token) = &options.token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|_| ClientError::Endpoint("the token holds characters no header can carry".into()))?;
            value.set_sensitive(true);
            let headers = reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, value)]);
            builder = builder.default_headers(headers);
        }
        let (builder, base) = match (parse_endpoint(endpoint)?, &options.through_socket) {
            (Endpoint::Unix(_), Some(socket)) => (builder.unix_socket(socket.clone()), "http://localhost".to_string()),
            (Endpoint::Unix(socket), None) => (builder.unix_socket(socket), "http://localhost".to_string()),
            (Endpoint::Http(base), Some(socket)) => (with_tls(builder.unix_socket(socket.clone()), options)?, base),
            (Endpoint::Http(base), None) => (with_tls(builder, options)?, base),
        };
        let http = builder.build().map_err(|error| ClientError::Transport(error.to_string()))?;
        let endpoint = endpoint.split(',').next().unwrap_or_default().trim().to_string();
        let (if_unchanged, condition_taken) = (options.if_unchanged, Arc::default());
        Ok(Self { http, base, endpoint, take_over: options.take_over, if_unchanged, condition_taken, timeout })
    }

    async fn send(&self, method: Method, path: &str, body: Option<String>) -> Result<(StatusCode, Vec<u8>)> {
        self.send_within(method, path, body, self.timeout).await
    }

    async fn send_within(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        timeout: Duration,
    ) -> Result<(StatusCode, Vec<u8>)> {
        let url = format!("{}/fleet/v1/{path}", self.base);
        // A plan is asked for by POST and changes nothing.
        let asks_a_change = !matches!(method, Method::GET | Method::HEAD) && path != "plans";
        let explain = if asks_a_change { unreachable::explain_change } else { unreachable::explain };
        let mut request = self.http.request(method, url).timeout(timeout);
        if let Some(body) = body {
            request = request.header("Content-Type", "application/json").body(body);
        }
        let response = request.send().await.map_err(|error| {
            let failure = unreachable::failure(&error);
            ClientError::Transport(explain(&self.endpoint, failure, timeout, &describe_transport(&error)))
        })?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|error| ClientError::Transport(error.to_string()))?;
        if status.is_client_error() || status.is_server_error() {
            let message =
                serde_json::from_slice::<ErrorBody>(&bytes).map(|body| body.error.message).unwrap_or_default();
            return Err(ClientError::Api { code: status.as_u16(), message });
        }
        Ok((status, bytes.to_vec()))
    }

    /// A snapshot of the embedded store (`GET /fleet/v1/backup`), written to `into` as it
    /// comes; its size. The whole transfer may take an hour (a big store over a slow link).
    pub async fn backup(&self, into: &mut impl std::io::Write) -> Result<u64> {
        let url = format!("{}/fleet/v1/backup", self.base);
        let limit = Duration::from_secs(3600);
        let mut response = self.http.get(url).timeout(limit).send().await.map_err(|error| {
            let failure = unreachable::failure(&error);
            ClientError::Transport(unreachable::explain(&self.endpoint, failure, limit, &describe_transport(&error)))
        })?;
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            let bytes = response.bytes().await.map_err(|error| ClientError::Transport(error.to_string()))?;
            let message =
                serde_json::from_slice::<ErrorBody>(&bytes).map(|body| body.error.message).unwrap_or_default();
            return Err(ClientError::Api { code: status.as_u16(), message });
        }
        let expected = response.content_length();
        let mut written = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(|error| ClientError::Transport(error.to_string()))? {
            into.write_all(&chunk).map_err(|error| ClientError::Transport(format!("writing the backup: {error}")))?;
            written += chunk.len() as u64;
        }
        if expected.is_some_and(|expected| expected != written) {
            return Err(ClientError::Transport(format!(
                "the backup ended after {written} of {} bytes",
                expected.unwrap_or_default()
            )));
        }
        Ok(written)
    }

    /// Deletes what `path` names; `false` when there was nothing.
    async fn delete(&self, path: &str) -> Result<bool> {
        match self.send(Method::DELETE, path, None).await {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let (_, bytes) = self.send(Method::GET, path, None).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Follows page tokens to the end, asking for pages of [`PAGE_SIZE`] (a server that does
    /// not know `pageSize`, the original's, answers pages of its own size, which the tokens
    /// carry).
    async fn all_pages<P: DeserializeOwned, T>(
        &self,
        path: &str,
        split: impl Fn(P) -> (Vec<T>, Option<String>),
    ) -> Result<Vec<T>> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        let separator = if path.contains('?') { '&' } else { '?' };
        let path = format!("{path}{separator}pageSize={PAGE_SIZE}");
        loop {
            let url = match &token {
                Some(token) => format!("{path}&nextPageToken={}", encode_component(token)),
                None => path.clone(),
            };
            let (page, next) = split(self.get::<P>(&url).await?);
            items.extend(page);
            match next.filter(|next| !next.is_empty()) {
                Some(next) => token = Some(next),
                None => return Ok(items),
            }
        }
    }

    /// Makes a bearer token; the answer holds the token itself, shown this once.
    pub async fn create_token(&self, request: &TokenRequest) -> Result<Token> {
        let body = serde_json::to_string(request).map_err(|error| ClientError::Decode(error.to_string()))?;
        let (_, bytes) = self.send(Method::POST, "tokens", Some(body)).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    pub async fn tokens(&self) -> Result<Vec<Token>> {
        self.get::<TokenList>("tokens").await.map(|list| list.tokens)
    }

    /// Revokes a token; `false` when there was none.
    pub async fn revoke_token(&self, name: &str) -> Result<bool> {
        self.delete(&format!("tokens/{}", encode_component(name))).await
    }

    /// Sets a secret's value (a new version), taken to the units that name it as `how` says
    /// (a rollout's settings, or `noRestart`; its `value` is replaced by `value`); what the
    /// cluster now shows of it.
    pub async fn set_secret(&self, name: &str, value: &[u8], how: SecretValue) -> Result<SecretInfo> {
        use base64::Engine;
        let request = SecretValue { value: base64::engine::general_purpose::STANDARD.encode(value), ..how };
        let body = serde_json::to_string(&request).map_err(|error| ClientError::Decode(error.to_string()))?;
        let (_, bytes) = self.send(Method::PUT, &format!("secrets/{}", encode_component(name)), Some(body)).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Every secret, by name (never a value).
    pub async fn secrets(&self) -> Result<Vec<SecretInfo>> {
        self.get::<SecretList>("secrets").await.map(|list| list.secrets)
    }

    /// Seals every secret's value again under the key that now seals (after a rotation).
    pub async fn reseal_secrets(&self) -> Result<fleet_api_schema::SecretsResealed> {
        let (_, bytes) = self.send(Method::POST, "secrets-reseal", None).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Removes a secret; `false` when there was none.
    pub async fn remove_secret(&self, name: &str) -> Result<bool> {
        self.delete(&format!("secrets/{}", encode_component(name))).await
    }

    /// Makes a registration token; the answer holds the token itself, shown this once.
    pub async fn create_registration_token(&self, request: &RegistrationTokenRequest) -> Result<RegistrationToken> {
        let body = serde_json::to_string(request).map_err(|error| ClientError::Decode(error.to_string()))?;
        let (_, bytes) = self.send(Method::POST, "registration-tokens", Some(body)).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    pub async fn registration_tokens(&self) -> Result<Vec<RegistrationToken>> {
        self.get::<RegistrationTokenList>("registration-tokens").await.map(|list| list.registration_tokens)
    }

    /// Revokes a registration token; `false` when there was none.
    pub async fn revoke_registration_token(&self, name: &str) -> Result<bool> {
        self.delete(&format!("registration-tokens/{}", encode_component(name))).await
    }

    /// Revokes a machine: its certificate is refused from now on and it leaves the cluster.
    pub async fn revoke_machine(&self, machine_id: &str) -> Result<()> {
        self.send(Method::POST, &format!("agents/{}/revoke", encode_component(machine_id)), None).await.map(drop)
    }

    /// Frees a revoked machine's ID for another key.
    pub async fn forget_machine(&self, machine_id: &str) -> Result<()> {
        self.send(Method::POST, &format!("agents/{}/forget", encode_component(machine_id)), None).await.map(drop)
    }

    /// Drains a machine (by ID or short ID), or changes the budget of its drain under way.
    pub async fn drain_machine(&self, machine_id: &str, request: &DrainRequest) -> Result<MachineDrain> {
        let body = serde_json::to_string(request).map_err(|error| ClientError::Decode(error.to_string()))?;
        let path = format!("machines/{}/drain", encode_component(machine_id));
        let (_, bytes) = self.send(Method::PUT, &path, Some(body)).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Where a machine's drain stands; `None` when the machine is not drained (or is unknown).
    pub async fn machine_drain(&self, machine_id: &str) -> Result<Option<MachineDrain>> {
        match self.get(&format!("machines/{}/drain", encode_component(machine_id))).await {
            Ok(drain) => Ok(Some(drain)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Sets taint `key` of machine `machine_id` (its full ID) to what is written after the key
    /// (`yes`, `yes:evict`, `:evict`, nothing), or removes it with `None`: one operation of
    /// `PATCH /machines`.
    pub async fn set_taint(&self, machine_id: &str, key: &str, after_key: Option<&str>) -> Result<()> {
        let path = format!("/{machine_id}/taints/{key}");
        let operation = match after_key {
            Some(value) => serde_json::json!([{"op": "add", "path": path, "value": value}]),
            None => serde_json::json!([{"op": "remove", "path": path}]),
        };
        self.send(Method::PATCH, "machines", Some(operation.to_string())).await.map(drop)
    }

    /// Ends a machine's drain; `false` when it was not drained.
    pub async fn undrain_machine(&self, machine_id: &str) -> Result<bool> {
        self.delete(&format!("machines/{}/drain", encode_component(machine_id))).await
    }

    pub async fn sources(&self) -> Result<Vec<Source>> {
        self.get::<SourceList>("sources").await.map(|list| list.sources)
    }

    pub async fn source(&self, name: &str) -> Result<Option<Source>> {
        match self.get(&format!("sources/{}", encode_component(name))).await {
            Ok(source) => Ok(Some(source)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Creates or replaces a source; `true` when it was created.
    pub async fn put_source(&self, source: &Source) -> Result<bool> {
        let body = serde_json::to_string(source).map_err(|error| ClientError::Decode(error.to_string()))?;
        let (status, _) =
            self.send(Method::PUT, &format!("sources/{}", encode_component(&source.name)), Some(body)).await?;
        Ok(status == StatusCode::CREATED)
    }

    /// Asks for a sync of a source now.
    pub async fn sync_source(&self, name: &str, force: bool) -> Result<()> {
        let force = if force { "?force=true" } else { "" };
        self.send(Method::POST, &format!("sources/{}/sync{force}", encode_component(name)), None).await.map(drop)
    }

    /// Removes a source, destroying its units unless `keep_units`; `false` when there was none.
    pub async fn remove_source(&self, name: &str, keep_units: bool) -> Result<bool> {
        self.delete(&format!("sources/{}?keepUnits={keep_units}", encode_component(name))).await
    }

    pub async fn rollouts(&self) -> Result<Vec<Rollout>> {
        self.get::<RolloutList>("rollouts").await.map(|list| list.rollouts)
    }

    pub async fn rollout(&self, name: &str) -> Result<Option<Rollout>> {
        self.rollout_read(&format!("rollouts/{}", encode_component(name))).await
    }

    /// A rollout with how many units are at each step (`steps`) but without the list of its
    /// units: what a client following it reads again and again. A fleetd from before `steps`
    /// lists the units anyway.
    pub async fn rollout_progress(&self, name: &str) -> Result<Option<Rollout>> {
        self.rollout_read(&format!("rollouts/{}?units=false", encode_component(name))).await
    }

    async fn rollout_read(&self, path: &str) -> Result<Option<Rollout>> {
        match self.get(path).await {
            Ok(rollout) => Ok(Some(rollout)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Starts a rollout.
    pub async fn start_rollout(&self, name: &str, request: &RolloutRequest) -> Result<Rollout> {
        let body = serde_json::to_string(request).map_err(|error| ClientError::Decode(error.to_string()))?;
        let (_, bytes) = self.send(Method::PUT, &format!("rollouts/{}", encode_component(name)), Some(body)).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// What `request`'s unit writes would do; nothing is written.
    pub async fn plan(&self, request: &fleet_api_schema::PlanRequest) -> Result<fleet_api_schema::Plan> {
        let body = serde_json::to_string(request).map_err(|error| ClientError::Decode(error.to_string()))?;
        // A plan of a source's sync fetches the source first, as the sync would.
        let timeout = match request.source_sync {
            Some(_) => self.timeout.max(SOURCE_FETCH_PATIENCE),
            None => self.timeout,
        };
        let (_, bytes) = self.send_within(Method::POST, "plans", Some(body), timeout).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Takes over the original fleet's units (`request.dry_run`: only reports what it would
    /// do). A whole registry may take minutes to write: it is given at least ten.
    pub async fn import(&self, request: &fleet_api_schema::ImportRequest) -> Result<fleet_api_schema::ImportReport> {
        let body = serde_json::to_string(request).map_err(|error| ClientError::Decode(error.to_string()))?;
        let timeout = self.timeout.max(Duration::from_secs(600));
        let (_, bytes) = self.send_within(Method::POST, "imports", Some(body), timeout).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Pauses, resumes or undoes a rollout.
    pub async fn rollout_action(&self, name: &str, action: &str) -> Result<Rollout> {
        let path = format!("rollouts/{}/{action}", encode_component(name));
        let (_, bytes) = self.send(Method::POST, &path, None).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    pub async fn units(&self) -> Result<Vec<Unit>> {
        self.all_pages("units", |page: UnitPage| (page.units, page.next_page_token)).await
    }

    pub async fn unit(&self, name: &str) -> Result<Option<Unit>> {
        match self.get(&format!("units/{}", encode_component(name))).await {
            Ok(unit) => Ok(Some(unit)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// A unit's calendar and runs (our addition); `None` when there is no such unit.
    pub async fn unit_runs(&self, name: &str) -> Result<Option<fleet_api_schema::UnitRuns>> {
        match self.get(&format!("units/{}/runs", encode_component(name))).await {
            Ok(runs) => Ok(Some(runs)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The versions of the unit `name` (`fleetctl history`); `None` when there is no such unit.
    pub async fn unit_history(&self, name: &str) -> Result<Option<fleet_api_schema::UnitHistory>> {
        match self.get(&format!("units/{}/history", encode_component(name))).await {
            Ok(history) => Ok(Some(history)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// One version of the unit `name` with its unit file (`fleetctl revert`): an error naming
    /// the versions kept when that one is not.
    pub async fn unit_version(&self, name: &str, version: u64) -> Result<fleet_api_schema::UnitVersion> {
        self.get(&format!("units/{}/history/{version}", encode_component(name))).await
    }

    /// Starts a run of `name` now (`fleetctl run`): the run claimed, which the engine places.
    pub async fn start_run(&self, name: &str) -> Result<fleet_api_schema::UnitRun> {
        let (_, bytes) = self.send(Method::POST, &format!("units/{}/runs", encode_component(name)), None).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Creates or replaces a unit (PUT with options).
    pub async fn put_unit(&self, unit: &Unit) -> Result<()> {
        let body = serde_json::to_string(unit).map_err(|error| ClientError::Decode(error.to_string()))?;
        self.send(Method::PUT, &self.unit_path(&unit.name), Some(body)).await.map(drop)
    }

    /// A unit's path for a write, taking it over when asked to.
    fn unit_path(&self, name: &str) -> String {
        format!("units/{}{}", encode_component(name), self.write_query())
    }

    /// The query of a unit write: `takeOver` when asked for, and the plan index the first
    /// write is conditioned on.
    fn write_query(&self) -> String {
        let mut query = Vec::new();
        if self.take_over {
            query.push("takeOver=true".to_string());
        }
        if let Some(index) = self.if_unchanged
            && !self.condition_taken.swap(true, Ordering::SeqCst)
        {
            query.push(format!("ifUnchanged={index}"));
        }
        if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) }
    }

    /// Writes many units in one request (`POST units`, fleetd's addition), each as its own
    /// [`Client::put_unit`] would, allowing the request timeout per hundred units; the answer
    /// per unit, in order. Units fleetd could not write for want of its store (503) are sent
    /// again, up to [`BATCH_ATTEMPTS`] times in all with waits doubling from [`BATCH_RETRY`]:
    /// a busy etcd refuses for a while, and a unit written twice lands once. `Ok(None)` when
    /// the server does not take batches (the original fleetd answers 405): write them one by
    /// one.
    pub async fn put_units(&self, units: &[Unit]) -> Result<Option<Vec<UnitBatchResult>>> {
        let mut answers: Vec<Option<UnitBatchResult>> = vec![None; units.len()];
        let mut pending: Vec<usize> = (0..units.len()).collect();
        let mut wait = BATCH_RETRY;
        for attempt in 1..=BATCH_ATTEMPTS {
            let last = attempt == BATCH_ATTEMPTS;
            let batch: Vec<&Unit> = pending.iter().map(|&index| &units[index]).collect();
            match self.send_batch(&batch).await {
                Ok(None) => return Ok(None),
                Ok(Some(results)) => {
                    let mut again = Vec::new();
                    for (index, result) in pending.iter().zip(results) {
                        if result.code == 503 && !last {
                            again.push(*index);
                        } else {
                            answers[*index] = Some(result);
                        }
                    }
                    pending = again;
                }
                Err(ClientError::Api { code: 503, .. }) if !last => {}
                Err(error) => return Err(error),
            }
            if pending.is_empty() {
                break;
            }
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
        Ok(Some(answers.into_iter().flatten().collect()))
    }

    /// One `POST units` of `units`; its answers, checked to be one per unit.
    async fn send_batch(&self, units: &[&Unit]) -> Result<Option<Vec<UnitBatchResult>>> {
        // Written straight from the units: through a `serde_json::Value` first, three
        // quarters of fleetctl's CPU went into building, printing and dropping that value.
        #[derive(serde::Serialize)]
        struct Batch<'a> {
            units: &'a [&'a Unit],
        }
        let body = serde_json::to_string(&Batch { units }).map_err(|error| ClientError::Decode(error.to_string()))?;
        let path = format!("units{}", self.write_query());
        let hundreds = u32::try_from(units.len().div_ceil(UNITS_PER_TIMEOUT).max(1)).unwrap_or(u32::MAX);
        match self.send_within(Method::POST, &path, Some(body), self.timeout.saturating_mul(hundreds)).await {
            Ok((_, bytes)) => {
                let results = serde_json::from_slice::<UnitBatchResults>(&bytes)
                    .map_err(|error| ClientError::Decode(error.to_string()))?
                    .units;
                if results.len() != units.len() {
                    return Err(ClientError::Decode(format!("{} answers for {} units", results.len(), units.len())));
                }
                Ok(Some(results))
            }
            Err(ClientError::Api { code: 405, .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    pub async fn set_desired_state(&self, name: &str, state: &str) -> Result<()> {
        let unit = Unit { name: name.to_string(), desired_state: Some(state.to_string()), ..Unit::default() };
        self.put_unit(&unit).await
    }

    /// Destroys a unit; `false` when there was none.
    pub async fn destroy_unit(&self, name: &str) -> Result<bool> {
        self.delete(&self.unit_path(name)).await
    }

    pub async fn unit_states(&self, unit: Option<&str>) -> Result<Vec<UnitState>> {
        self.unit_states_listed(unit, false).await
    }

    /// The unit states, and with `out_of_touch` the units that wait for a machine out of touch
    /// too, as `unknown` (`?outOfTouch=true`, our addition; the original ignores it).
    pub async fn unit_states_listed(&self, unit: Option<&str>, out_of_touch: bool) -> Result<Vec<UnitState>> {
        let mut query = Vec::new();
        if let Some(name) = unit {
            query.push(format!("unitName={}", encode_component(name)));
        }
        if out_of_touch {
            query.push("outOfTouch=true".to_string());
        }
        let path = if query.is_empty() { "state".to_string() } else { format!("state?{}", query.join("&")) };
        self.all_pages(&path, |page: UnitStatePage| (page.states, page.next_page_token)).await
    }

    pub async fn machines(&self) -> Result<Vec<Machine>> {
        self.machines_listed(false).await
    }

    /// The machines, and with `out_of_touch` those gone that units wait for too
    /// (`?outOfTouch=true`, our addition; the original ignores it).
    pub async fn machines_listed(&self, out_of_touch: bool) -> Result<Vec<Machine>> {
        let path = if out_of_touch { "machines?outOfTouch=true" } else { "machines" };
        self.all_pages(path, |page: MachinePage| (page.machines, page.next_page_token)).await
    }

    pub async fn journal(&self, name: &str, lines: usize) -> Result<Journal> {
        self.relayed_journal(&format!("journal/{}?lines={lines}", encode_component(name))).await
    }

    /// The journal with the unit manager's status report of the unit, if it has one.
    pub async fn status(&self, name: &str, lines: usize) -> Result<Journal> {
        self.relayed_journal(&format!("journal/{}?lines={lines}&status=true", encode_component(name))).await
    }

    /// A journal, which fleetd may relay from the machine that runs the unit: given the
    /// relay's own wait and more, whatever the request timeout (issue 68: the 3 s default
    /// gave up before the relay's 10 s).
    async fn relayed_journal(&self, path: &str) -> Result<Journal> {
        let (_, bytes) = self.send_within(Method::GET, path, None, self.timeout.max(JOURNAL_RELAY_PATIENCE)).await?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }
}

fn describe_transport(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Percent-encodes a path segment or query value.
fn encode_component(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'@' | b':' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// Issue 68: "unable to communicate with etcd" said nothing of where to look.
    #[test]
    fn an_unreachable_store_is_said_with_where_to_look_and_other_errors_as_the_original() {
        let unreachable = super::ClientError::Api { code: 503, message: super::STORE_UNREACHABLE.into() };
        let said = unreachable.to_string();
        assert!(said.starts_with("googleapi: Error 503: fleet server unable to communicate with etcd\n"), "{said}");
        assert!(said.contains("etcd_servers"), "{said}");
        let other = super::ClientError::Api { code: 404, message: "unit does not exist".into() };
        assert_eq!(other.to_string(), "googleapi: Error 404: unit does not exist");
    }

    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("unix:///var/run/fleet.sock").unwrap(), Endpoint::Unix("/var/run/fleet.sock".into()));
        assert_eq!(
            parse_endpoint("http://127.0.0.1:49153/,http://x").unwrap(),
            Endpoint::Http("http://127.0.0.1:49153".into())
        );
        let bare = parse_endpoint("/var/run/fleet.sock").unwrap_err().to_string();
        assert!(bare.starts_with("URL scheme undefined"), "the original's words first: {bare}");
        assert_eq!(
            parse_endpoint("unix://var/run/fleet.sock").unwrap_err().to_string(),
            "unable to connect to host \"var\" with scheme \"unix\""
        );
        assert_eq!(encode_component("a b/c=="), "a%20b%2Fc%3D%3D");
    }

    #[tokio::test]
    async fn an_unreachable_fleetd_is_named_with_what_to_check() {
        let missing = std::env::temp_dir().join(format!("fleet-client-test-{}.sock", std::process::id()));
        let endpoint = format!("unix://{}", missing.display());
        let client = Client::new(&endpoint, Duration::from_secs(5)).expect("a client");
        let said = client.units().await.expect_err("no fleetd").to_string();
        assert!(said.starts_with(&format!("cannot reach fleetd at {endpoint}: no such socket")), "{said}");
        assert!(said.contains("FLEETCTL_ENDPOINT"), "{said}");
        // A port nothing listens on: bound, then let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let client = Client::new(&endpoint, Duration::from_secs(5)).expect("a client");
        let said = client.units().await.expect_err("nothing listens").to_string();
        assert!(said.starts_with(&format!("cannot reach fleetd at {endpoint}: connection refused")), "{said}");
    }

    /// Answers one HTTP request with `status` and `body`; returns the request, head and body.
    async fn answer_once(listener: &tokio::net::TcpListener, status: &str, body: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut stream, _) = listener.accept().await.expect("a connection");
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        // The head, then as much body as it announces.
        while !String::from_utf8_lossy(&request).contains("\r\n\r\n") {
            let read = stream.read(&mut buffer).await.expect("the request");
            request.extend_from_slice(&buffer[..read]);
        }
        let text = String::from_utf8_lossy(&request).into_owned();
        let length: usize = text
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0);
        let head = text.find("\r\n\r\n").map_or(0, |at| at + 4);
        while request.len() < head + length {
            let read = stream.read(&mut buffer).await.expect("the body");
            request.extend_from_slice(&buffer[..read]);
        }
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(reply.as_bytes()).await.expect("the answer");
        String::from_utf8_lossy(&request).into_owned()
    }

    /// A listener on a free loopback port, and a client of it giving up after `timeout`.
    async fn listening(timeout: Duration) -> (tokio::net::TcpListener, Client) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        (listener, Client::new(&format!("http://{address}"), timeout).expect("a client"))
    }

    /// A change whose answer does not come may have been made: its error says so; a read's
    /// does not.
    #[tokio::test]
    async fn a_change_without_an_answer_says_it_may_have_been_made_and_a_read_does_not() {
        let (listener, client) = listening(Duration::from_millis(300)).await;
        // Takes every connection and answers none.
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let may_have_been_made = "the change may have been made all the same";
        let destroyed = client.destroy_unit("a.service").await.expect_err("no answer");
        assert!(destroyed.to_string().contains(may_have_been_made), "{destroyed}");
        let read = client.unit("a.service").await.expect_err("no answer");
        assert!(read.to_string().contains("no answer within"), "{read}");
        assert!(!read.to_string().contains(may_have_been_made), "{read}");
        silent.abort();
    }

    #[tokio::test]
    async fn a_server_without_batches_is_told_apart_from_a_refused_batch() {
        let units = [Unit { name: "a.service".into(), desired_state: Some("launched".into()), ..Unit::default() }];
        let (listener, client) = listening(Duration::from_secs(5)).await;
        // The original fleetd: /units takes GET only.
        let old = r#"{"error":{"code":405,"message":"only GET supported against this resource"}}"#;
        let (asked, answer) =
            tokio::join!(answer_once(&listener, "405 Method Not Allowed", old), client.put_units(&units));
        assert_eq!(asked.lines().next(), Some("POST /fleet/v1/units HTTP/1.1"));
        assert_eq!(answer.expect("not an error"), None, "so the caller writes one unit at a time");
        // A batch refused whole is an error; answers per unit come back in order.
        for (status, body, expected) in [
            ("400 Bad Request", r#"{"error":{"code":400,"message":"unit a.service: desiredState missing"}}"#, Err(400)),
            ("200 OK", r#"{"units":[{"name":"a.service","code":204}]}"#, Ok(Some(vec![204]))),
        ] {
            let (listener, client) = listening(Duration::from_secs(5)).await;
            let (_, answer) = tokio::join!(answer_once(&listener, status, body), client.put_units(&units));
            let answer = answer
                .map(|results| results.map(|results| results.iter().map(|result| result.code).collect::<Vec<_>>()))
                .map_err(|error| match error {
                    ClientError::Api { code, .. } => code,
                    other => panic!("{other}"),
                });
            assert_eq!(answer, expected);
        }
    }

    /// Units fleetd could not write for want of its store are sent again, alone; the others'
    /// answers are kept.
    #[tokio::test]
    async fn units_answered_503_are_sent_again_alone() {
        let unit = |name: &str| Unit { name: name.into(), desired_state: Some("launched".into()), ..Unit::default() };
        let units = [unit("a.service"), unit("b.service")];
        let (listener, client) = listening(Duration::from_secs(5)).await;
        let busy = r#"{"units":[{"name":"a.service","code":503,"message":"fleet server unable to communicate with etcd"},{"name":"b.service","code":204}]}"#;
        let server = async {
            let first = answer_once(&listener, "200 OK", busy).await;
            let second = answer_once(&listener, "200 OK", r#"{"units":[{"name":"a.service","code":204}]}"#).await;
            (first, second)
        };
        let ((first, second), answer) = tokio::join!(server, client.put_units(&units));
        assert!(first.contains("b.service"));
        assert!(second.contains("a.service") && !second.contains("b.service"), "only the refused unit again: {second}");
        let codes: Vec<(String, u16)> =
            answer.expect("written").expect("batches").into_iter().map(|result| (result.name, result.code)).collect();
        assert_eq!(codes, vec![("a.service".to_string(), 204), ("b.service".to_string(), 204)]);
    }

    /// Pages are followed to the end by their tokens, their items kept in order; a page that
    /// does not decode fails the list.
    #[tokio::test]
    async fn pages_are_followed_in_order_and_a_bad_page_fails_the_list() {
        let (listener, client) = listening(Duration::from_secs(5)).await;
        let page = |names: &[&str], next: Option<&str>| {
            let units: Vec<String> = names.iter().map(|name| format!(r#"{{"name":"{name}","options":[]}}"#)).collect();
            let token = next.map(|token| format!(r#","nextPageToken":"{token}""#)).unwrap_or_default();
            format!(r#"{{"units":[{}]{token}}}"#, units.join(","))
        };
        let server = async {
            let first = answer_once(&listener, "200 OK", &page(&["a.service", "b.service"], Some("t2"))).await;
            let second = answer_once(&listener, "200 OK", &page(&["c.service"], Some("t3"))).await;
            let third = answer_once(&listener, "200 OK", &page(&["d.service", "e.service"], None)).await;
            (first, second, third)
        };
        let ((first, second, third), listed) = tokio::join!(server, client.units());
        assert!(first.contains("pageSize=") && !first.contains("nextPageToken"), "{first}");
        assert!(second.contains("nextPageToken=t2") && third.contains("nextPageToken=t3"), "{second}{third}");
        let names: Vec<String> = listed.expect("listed").into_iter().map(|unit| unit.name).collect();
        assert_eq!(names, ["a.service", "b.service", "c.service", "d.service", "e.service"]);

        // A page that does not decode ends the list there.
        let bad = r#"{"units":[{"name":7}],"nextPageToken":"t2"}"#;
        let (_, listed) = tokio::join!(answer_once(&listener, "200 OK", bad), client.units());
        assert!(matches!(listed, Err(ClientError::Decode(_))), "{listed:?}");
    }
}
