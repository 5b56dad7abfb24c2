//! Talking to a manager: joining with a registration token and renewing the machine
//! certificate. Every connection is opened by the agent (HTTPS, honouring `HTTPS_PROXY`).

use std::collections::BTreeMap;
use std::time::Duration;

/// How often an agent pings its manager's connection unless told otherwise
/// ([`Manager::with_heartbeat`]), and the longest an answer may take: a manager gone without
/// a word (its machine, its network) is left within two heartbeats.
const HEARTBEAT: Duration = Duration::from_secs(20);
/// The least an agent waits for an answer from its manager ([`Manager::patience`]).
const SHORTEST_PATIENCE: Duration = Duration::from_secs(10);
/// How often an idle agent beats on its change stream unless told otherwise
/// ([`Manager::with_idle_heartbeat`]; fleetd's `agent_heartbeat`): its connection's kernels
/// watch it in between.
pub const DEFAULT_IDLE_HEARTBEAT: Duration = Duration::from_secs(300);
/// How long a connection to the manager is kept with no request on it. (An agent that moves
/// to a change stream lets its connection go at once.)
const IDLE_CONNECTION: Duration = Duration::from_secs(30);

use fleet_api_schema::{AgentCertificate, AgentJoinRequest, AgentRenewRequest, ErrorBody};
use fleet_core::peer_probing::Probing;
use rcgen::{CertificateParams, DistinguishedName, KeyPair};

use crate::credentials::MachineCredentials;
use crate::tls::{ClientTls, Speaks};

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The manager answered with a refusal (a bad, used-up or revoked token, a machine ID in
    /// use...): trying again as is will not help.
    #[error("the manager refused: {status}: {message}")]
    Refused { status: u16, message: String },
    /// No answer: try again later.
    #[error("cannot reach the manager: {0}")]
    Unreachable(String),
    #[error("unusable answer from the manager: {0}")]
    BadAnswer(String),
    #[error("{0}")]
    Setup(String),
}

/// The managers of a cluster (`https://a:4002,https://b:4002`: any of them serves any agent),
/// trusted through `server_ca` (PEM) or the system's roots.
#[derive(Clone)]
pub struct Manager {
    bases: Vec<String>,
    server_ca: Option<Vec<u8>>,
    timeout: Duration,
    heartbeat: Duration,
    idle_heartbeat: Duration,
}

/// A new key pair and a certificate signing request over it (its subject is left to the CA).
fn key_and_request() -> Result<(KeyPair, String), ManagerError> {
    let setup = |error: rcgen::Error| ManagerError::Setup(format!("cannot make a key pair: {error}"));
    let key = KeyPair::generate().map_err(setup)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let request = params.serialize_request(&key).map_err(setup)?.pem().map_err(setup)?;
    Ok((key, request))
}

impl Manager {
    /// `urls`: one manager URL or several, comma-separated.
    pub fn new(urls: &str, server_ca: Option<Vec<u8>>, timeout: Duration) -> Result<Self, ManagerError> {
        let bases: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| url.trim_end_matches('/').to_string())
            .collect();
        if bases.is_empty() {
            return Err(ManagerError::Setup("no manager URL".into()));
        }
        if let Some(url) = bases.iter().find(|url| !url.starts_with("https://")) {
            return Err(ManagerError::Setup(format!("a manager URL must start with https://: {url:?}")));
        }
        Ok(Self { bases, server_ca, timeout, heartbeat: HEARTBEAT, idle_heartbeat: DEFAULT_IDLE_HEARTBEAT })
    }

    /// Pings the manager's connection every `every` (HTTP/2 keepalive): the agent's
    /// heartbeat, by which it leaves a manager gone without a word. A pull fleetd beats three
    /// times in its `agent_ttl`; its manager pings an idle connection every half of its own.
    pub fn with_heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every.max(Duration::from_millis(100));
        self
    }

    /// Beats on the change stream only every `every` while nothing the agent runs needs its
    /// presence proven (never more often than [`Manager::heartbeat`]).
    pub fn with_idle_heartbeat(mut self, every: Duration) -> Self {
        self.idle_heartbeat = every;
        self
    }

    /// How often the agent beats on its change stream while idle.
    pub fn idle_heartbeat(&self) -> Duration {
        self.idle_heartbeat.max(self.heartbeat)
    }

    /// The managers' base URLs, in the order given.
    pub fn bases(&self) -> &[String] {
        &self.bases
    }

    /// How often the agent beats (HTTP/2 pings, change stream heartbeats).
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// How long the agent waits for an answer from the manager it is connected to (to a
    /// request, a heartbeat, a handshake): a heartbeat period, at least [`SHORTEST_PATIENCE`].
    /// A loaded manager is slow, not gone, and holds the agent's presence for three periods
    /// (`agent_ttl`) from when it last heard it; an agent that gives up sooner throws away
    /// what the manager did for it (the answer comes, to no one) and adds its retry to the load
    /// that made the manager slow. (When the agent leaves a manager for another: `leaving`.)
    pub fn patience(&self) -> Duration {
        self.heartbeat.max(SHORTEST_PATIENCE)
    }

    /// The TLS of `identity` (a machine certificate, or none) towards these managers: make
    /// one per certificate, and every client made from it resumes the sessions the others began.
    pub(crate) fn tls(&self, identity: Option<&MachineCredentials>) -> Result<ClientTls, ManagerError> {
        ClientTls::new(self.server_ca.as_deref(), identity).map_err(|error| ManagerError::Setup(error.to_string()))
    }

    /// An HTTPS client for the manager, speaking `tls`; a request gives up after the agent's
    /// [`Manager::patience`], and so does connecting (its TLS handshake included: one a
    /// loaded manager is slow to finish is waited for, not begun again). A connection with no
    /// request for [`IDLE_CONNECTION`] is closed: an agent that follows a change stream needs
    /// none between its changes.
    pub(crate) fn client(&self, tls: &ClientTls) -> Result<reqwest::Client, ManagerError> {
        // A long poll holds its connection for minutes: a manager gone without a word is found
        // by HTTP/2 pings, and the agent tries another within seconds. HTTP/2 is spoken from
        // the first byte (every manager offers it), so that requests sent together before the
        // connection is up wait for that one connection: where HTTP/2 was only learnt from the
        // handshake, each opened a connection of its own, and all but one were dropped after
        // their TLS handshakes (10,000 agents starting together cost their manager 14,577 full
        // handshakes).
        let builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls.config(Speaks::Requests))
            .http2_prior_knowledge()
            .timeout(self.patience())
            .connect_timeout(self.patience())
            .pool_idle_timeout(IDLE_CONNECTION)
            .http2_keep_alive_interval(Some(self.heartbeat))
            .http2_keep_alive_timeout(self.heartbeat)
            .http2_keep_alive_while_idle(true);
        builder.build().map_err(|error| ManagerError::Setup(error.to_string()))
    }

    /// An HTTP/1.1 client for the change stream, speaking `tls`: its one request is switched
    /// to the stream, which lasts as long as the manager answers its heartbeats and its
    /// kernel hears the manager's: a manager gone without a word is found by keepalive probes
    /// within a heartbeat and a half of when it was last heard, whether the agent beats or not.
    pub(crate) fn stream_client(&self, tls: &ClientTls) -> Result<reqwest::Client, ManagerError> {
        let probing = Probing::for_keep_alive(self.heartbeat);
        let builder = self
            .single_request_builder(tls, None)
            .connect_timeout(self.patience().max(self.timeout))
            .tcp_keepalive(Duration::from_secs(probing.idle_seconds.into()))
            .tcp_keepalive_interval(Duration::from_secs(probing.interval_seconds.into()))
            .tcp_keepalive_retries(probing.count)
            .tcp_user_timeout(probing.detects_within());
        builder.build().map_err(|error| ManagerError::Setup(error.to_string()))
    }

    /// An HTTP/1.1 client whose connection carries one request and is closed after it (no
    /// timeout with `None`): a join or a renewal is an agent's only request on a connection
    /// of its own, and HTTP/2's setup (settings both ways, its buffers on the manager) would
    /// cost both sides more than the request itself.
    fn single_request_client(
        &self,
        tls: &ClientTls,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Client, ManagerError> {
        self.single_request_builder(tls, timeout).build().map_err(|error| ManagerError::Setup(error.to_string()))
    }

    fn single_request_builder(&self, tls: &ClientTls, timeout: Option<Duration>) -> reqwest::ClientBuilder {
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls.config(Speaks::Http1))
            .http1_only()
            .connect_timeout(self.timeout)
            .pool_max_idle_per_host(0);
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        builder
    }

    /// Posts to the first manager that answers.
    async fn post(
        &self,
        client: &reqwest::Client,
        path: &str,
        token: Option<&str>,
        body: String,
    ) -> Result<AgentCertificate, ManagerError> {
        let mut last = ManagerError::Unreachable("no manager".into());
        // From a manager of the list at random, so that agents joining at once are signed by
        // all the managers, not all by the first.
        for base in tried_from(&self.bases, crate::jitter::random_sample() as usize) {
            match self.post_to(client, base, path, token, body.clone()).await {
                Err(error @ ManagerError::Unreachable(_)) => last = error,
                answered => return answered,
            }
        }
        Err(last)
    }

    async fn post_to(
        &self,
        client: &reqwest::Client,
        base: &str,
        path: &str,
        token: Option<&str>,
        body: String,
    ) -> Result<AgentCertificate, ManagerError> {
        let mut request = client.post(format!("{base}{path}")).header("Content-Type", "application/json").body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|error| ManagerError::Unreachable(without_url(&error)))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|error| ManagerError::Unreachable(without_url(&error)))?;
        if !status.is_success() {
            let message =
                serde_json::from_slice::<ErrorBody>(&bytes).map(|body| body.error.message).unwrap_or_default();
            // A manager that cannot reach its store now may later: only a 4xx is a refusal.
            if status.is_server_error() {
                return Err(ManagerError::Unreachable(format!("{status}: {message}")));
            }
            return Err(ManagerError::Refused { status: status.as_u16(), message });
        }
        serde_json::from_slice(&bytes).map_err(|error| ManagerError::BadAnswer(error.to_string()))
    }

    /// Joins as `machine_id` with a registration `token`: a key pair made here, a certificate
    /// from the agent CA over it, and the metadata the token gives the machine.
    pub async fn join(
        &self,
        token: &str,
        machine_id: &str,
    ) -> Result<(MachineCredentials, BTreeMap<String, String>), ManagerError> {
        let (key, csr) = key_and_request()?;
        let body = serde_json::to_string(&AgentJoinRequest { machine_id: machine_id.to_string(), csr })
            .map_err(|error| ManagerError::Setup(error.to_string()))?;
        let answer = self
            .post(
                &self.single_request_client(&self.tls(None)?, Some(self.timeout))?,
                "/fleet/v1/agents/join",
                Some(token),
                body,
            )
            .await?;
        if answer.machine_id != machine_id {
            return Err(ManagerError::BadAnswer(format!("a certificate for {:?}", answer.machine_id)));
        }
        let mut credentials =
            MachineCredentials::new(answer.machine_id, answer.certificate, key.serialize_pem(), answer.ca_certificate)
                .map_err(|error| ManagerError::BadAnswer(error.to_string()))?;
        credentials.metadata = answer.metadata.clone();
        Ok((credentials, answer.metadata))
    }

    /// A new certificate over a new key pair, proven by the current certificate.
    pub async fn renew(&self, current: &MachineCredentials) -> Result<MachineCredentials, ManagerError> {
        let (key, csr) = key_and_request()?;
        let body = serde_json::to_string(&AgentRenewRequest { csr })
            .map_err(|error| ManagerError::Setup(error.to_string()))?;
        let answer = self
            .post(
                &self.single_request_client(&self.tls(Some(current))?, Some(self.timeout))?,
                "/fleet/v1/agents/renew",
                None,
                body,
            )
            .await?;
        if answer.machine_id != current.machine_id {
            return Err(ManagerError::BadAnswer(format!("a certificate for {:?}", answer.machine_id)));
        }
        let mut renewed =
            MachineCredentials::new(answer.machine_id, answer.certificate, key.serialize_pem(), answer.ca_certificate)
                .map_err(|error| ManagerError::BadAnswer(error.to_string()))?;
        renewed.metadata = current.metadata.clone();
        Ok(renewed)
    }
}

/// A transport error's text without the URL (which holds nothing secret, but keeps the
/// message short) and never the request's headers.
pub(crate) fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "the manager");
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Every one of `bases`, from the one at `start` (modulo their count) round to the one before it.
fn tried_from(bases: &[String], start: usize) -> impl Iterator<Item = &String> {
    let first = if bases.is_empty() { 0 } else { start % bases.len() };
    bases[first..].iter().chain(&bases[..first])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_manager_is_tried_once_from_the_one_drawn() {
        let bases: Vec<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
        let order = |start| tried_from(&bases, start).map(String::as_str).collect::<Vec<_>>();
        assert_eq!(order(0), ["a", "b", "c"]);
        assert_eq!(order(1), ["b", "c", "a"]);
        assert_eq!(order(5), ["c", "a", "b"], "a draw past the count wraps");
        assert_eq!(tried_from(&[], 7).count(), 0);
    }

    #[test]
    fn an_agent_waits_a_heartbeat_for_its_managers_answer_and_never_less_than_ten_seconds() {
        let manager =
            |heartbeat| Manager::new("https://a", None, Duration::from_secs(10)).unwrap().with_heartbeat(heartbeat);
        // agent_ttl 5 minutes (a heartbeat of 100 s): a loaded manager is given 100 s.
        assert_eq!(manager(Duration::from_secs(100)).patience(), Duration::from_secs(100));
        // The default agent_ttl, 30 s, and shorter ones: 10 s, as before patience grew with it.
        assert_eq!(manager(Duration::from_secs(10)).patience(), SHORTEST_PATIENCE);
        assert_eq!(manager(Duration::from_millis(700)).patience(), SHORTEST_PATIENCE);
    }
}
