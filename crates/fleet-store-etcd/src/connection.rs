//! One etcd client with fleet's request timeout on every call, and etcd's errors turned into
//! [`RegistryError`]s.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, GetResponse, Identity, KvClient, PutOptions, TlsOptions, Txn,
    TxnOp, TxnResponse, WatchClient,
};

use crate::balanced_channel::TrustingEtcd;
use fleet_core::backoff::Backoff;
use fleet_registry::{RegistryError, Result};

/// How to reach etcd: the original's `etcd_*` options.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub key_prefix: String,
    pub request_timeout: Duration,
    pub username: String,
    pub password: fleet_core::secret::Secret,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    /// Where this fleetd records its machine lease, so that a fleetd restarted after a crash
    /// takes its own live lease over instead of being refused until the lease expires.
    pub lease_file: Option<std::path::PathBuf>,
    /// Where a manager records the lease its pull agents' presences hang on, so that a
    /// manager restarted while the lease lives holds them on it again, rewriting nothing.
    pub agent_lease_file: Option<std::path::PathBuf>,
    /// A manager of pull agents reads every machine's work from one watch-fed copy (one watch
    /// however many machines it serves) rather than a copy per machine.
    pub serve_many_machines: bool,
    /// How much of etcd's history the engine leader keeps when it compacts (default:
    /// five minutes).
    pub kept_history: Option<Duration>,
    /// How long the cluster's cache stays after an API read used it (`None`: ten minutes);
    /// a fleetd that serves no lists and does not lead holds only its own work.
    pub api_copy_idle: Option<Duration>,
}

/// etcd's default limit on operations per transaction (`--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;
/// Operations (nested unit transactions among them) per transaction that nests: etcd allows a
/// nested transaction only the operations its parent leaves unused of `--max-txn-ops`, so
/// eight are left for each unit's own (its compares, and at most eight writes).
pub const NESTED_PER_TXN: usize = MAX_TXN_OPS - 8;
/// Replies listing a whole collection can be large; etcd itself limits requests, not replies.
const MAX_REPLY_BYTES: usize = 512 * 1024 * 1024;

#[derive(Clone)]
pub struct Connection {
    client: Client,
    pub timeout: Duration,
}

/// How long to wait before sending a call again that could not connect.
const CONNECT_RETRY: Duration = Duration::from_millis(20);
/// How long to wait before sending a call again that etcd refused while too far behind in
/// applying what it committed: at first, then twice as long each time, up to the second.
const BEHIND_RETRY_MIN: Duration = Duration::from_millis(50);
const BEHIND_RETRY_MAX: Duration = Duration::from_secs(1);

/// Whether `error` says the request was never carried out: no connection could be made to the
/// member, or the member refused it for want of a leader (the require-leader check comes before
/// anything is done).
fn never_sent(error: &etcd_client::Error) -> bool {
    /// gRPC's code for "unavailable".
    const UNAVAILABLE: i32 = 14;
    matches!(error, etcd_client::Error::GRpcStatus(status)
        if i32::from(status.code()) == UNAVAILABLE
            && (status.message().contains("connect error") || status.message() == "etcdserver: no leader"))
}

/// Whether etcd refused `error`'s request because its apply is too far behind what it
/// committed (etcd 3.4's "too many requests"): refused before it is proposed, so nothing was
/// done, and the request is better sent again a little later than answered with an error that
/// sends the caller's whole batch back as single requests.
fn refused_while_behind(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.message() == "etcdserver: too many requests")
}

pub(crate) fn unavailable(error: impl std::fmt::Display) -> RegistryError {
    RegistryError::unavailable("etcd", error)
}

fn read_file(option: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|error| RegistryError::Unavailable(format!("cannot read {option} {path}: {error}")))
}

fn tls_options(options: &EtcdOptions) -> Result<Option<TlsOptions>> {
    let uses_tls = options.endpoints.iter().any(|endpoint| endpoint.starts_with("https://"));
    if !uses_tls && options.ca_file.is_empty() && options.cert_file.is_empty() {
        return Ok(None);
    }
    let mut tls = TlsOptions::new();
    if !options.ca_file.is_empty() {
        tls = tls.ca_certificate(Certificate::from_pem(read_file("etcd_cafile", &options.ca_file)?));
    }
    match (options.cert_file.is_empty(), options.key_file.is_empty()) {
        (false, false) => {
            let cert = read_file("etcd_certfile", &options.cert_file)?;
            let key = read_file("etcd_keyfile", &options.key_file)?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        (true, true) => {}
        _ => {
            return Err(RegistryError::Unavailable(
                "etcd_certfile and etcd_keyfile must be given together".to_string(),
            ));
        }
    }
    Ok(Some(tls))
}

impl Connection {
    /// Connects lazily: an etcd that is down now is reached when it comes back. With a user
    /// name, etcd must answer now, to hand out the token.
    pub async fn connect(options: &EtcdOptions) -> Result<Self> {
        if options.endpoints.is_empty() {
            return Err(RegistryError::Unavailable("etcd_servers lists no server".to_string()));
        }
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(5), options.request_timeout.max(Duration::from_secs(2)))
            // Only while calls or watches are open: etcd allows no ping on a connection without
            // one (its policy has no `PermitWithoutStream`), and closes one pinged so a fourth
            // time (`GOAWAY too_many_pings`, 20 s after its last call), failing what is sent on
            // it meanwhile. With several members, the connections to those no watch uses sit
            // idle. etcd's own client pings idle connections no more.
            .with_keep_alive_while_idle(false)
            // A member cut off from its cluster's leader refuses at once instead of answering
            // stale or not at all; above all it ends our watches on it, which would otherwise
            // stay open and silent for the whole partition (found by the minority-partition test).
            .with_require_leader(true);
        if let Some(tls) = tls_options(options)? {
            connect = connect.with_tls(tls);
        }
        if !options.username.is_empty() {
            // etcd's tokens expire (after 5 minutes idle by default): fetch a new one when refused.
            connect = connect
                .with_user(options.username.clone(), options.password.expose().to_string())
                .with_auto_token_refresh(true);
        }
        let client = tokio::time::timeout(
            options.request_timeout * 5,
            Client::connect_with_balanced_channel(&options.endpoints, Some(connect), TrustingEtcd),
        )
        .await
        .map_err(|_| unavailable("connecting timed out"))?
        .map_err(unavailable)?;
        Ok(Self { client, timeout: options.request_timeout })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn kv(&self) -> KvClient {
        self.client.kv_client().max_decoding_message_size(MAX_REPLY_BYTES)
    }

    pub fn watch_client(&self) -> WatchClient {
        self.client.watch_client().max_decoding_message_size(MAX_REPLY_BYTES)
    }

    /// Runs one etcd call of kind `operation` within `limit`, and counts it.
    pub async fn within<T>(
        &self,
        operation: &'static str,
        limit: Duration,
        call: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(limit, call)
            .await
            .map_err(|_| unavailable(format!("no answer within {limit:?}")))
            .and_then(|answer| answer.map_err(unavailable));
        fleet_metrics::metrics().store.observe("etcd", operation, started.elapsed(), result.is_err());
        result
    }

    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.sent_once("txn", self.timeout, || {
            let (mut kv, txn) = (self.kv(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// A transaction that may carry many operations or large replies: a longer limit.
    pub async fn big_txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.sent_once("txn", self.timeout * 10, || {
            let (mut kv, txn) = (self.kv(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Sets (`Some`, under `lease`) or removes (`None`) each key in one request: a
    /// lone change as a plain put or delete, more as one transaction. etcd 3.4 opens a read
    /// view for every transaction, writes included, and that view copies every write it has
    /// not yet committed to its backend; a put or a delete skips it. An agent's state
    /// reports are mostly a single key, one per unit, so at thousands of machines this is
    /// most of what etcd is asked. Answers the revision etcd wrote them at (0 when it did
    /// not say).
    pub async fn write(&self, changes: &[(String, Option<Vec<u8>>)], lease: i64) -> Result<i64> {
        let put_options = || Some(PutOptions::new().with_lease(lease));
        let revision = |header: Option<&etcd_client::ResponseHeader>| header.map_or(0, |header| header.revision());
        match changes {
            [] => Ok(0),
            [(key, Some(value))] => self
                .sent_once("put", self.timeout, || {
                    let (mut kv, key, value) = (self.kv(), key.clone(), value.clone());
                    async move { kv.put(key, value, put_options()).await }
                })
                .await
                .map(|reply| revision(reply.header())),
            [(key, None)] => self
                .sent_once("delete", self.timeout, || {
                    let (mut kv, key) = (self.kv(), key.clone());
                    async move { kv.delete(key, None).await }
                })
                .await
                .map(|reply| revision(reply.header())),
            _ => {
                let ops: Vec<TxnOp> = changes
                    .iter()
                    .map(|(key, value)| match value {
                        Some(value) => TxnOp::put(key.as_str(), value.clone(), put_options()),
                        None => TxnOp::delete(key.as_str(), None),
                    })
                    .collect();
                self.txn(Txn::new().and_then(ops)).await.map(|reply| revision(reply.header()))
            }
        }
    }

    pub async fn get(&self, key: &str, options: Option<GetOptions>) -> Result<GetResponse> {
        self.sent_once("range", self.timeout * 10, || {
            let (mut kv, key, options) = (self.kv(), key.to_string(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// One KV call within `limit`, made again (on another connection, most likely) while the
    /// member it reached could not take it: down, or without a leader; and, after a pause
    /// that grows, while etcd refuses it for being too far behind. The request was not
    /// carried out, so any call may be made again. Any other failure is the answer.
    async fn sent_once<T, F, Fut>(&self, operation: &'static str, limit: Duration, call: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + limit;
        let mut behind = Backoff::new(BEHIND_RETRY_MIN, BEHIND_RETRY_MAX);
        let result = loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Err(_) => break Err(unavailable(format!("no answer within {limit:?}"))),
                Ok(Err(error)) if never_sent(&error) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                Ok(Err(error)) if refused_while_behind(&error) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + behind.next_delay())).await;
                }
                Ok(answer) => break answer.map_err(unavailable),
            }
        };
        fleet_metrics::metrics().store.observe("etcd", operation, started.elapsed(), result.is_err());
        result
    }

    /// Several reads at one revision, in one round trip, with the longer limit of a
    /// transaction that may bring back much.
    pub async fn read(&self, gets: Vec<TxnOp>) -> Result<(i64, Vec<GetResponse>)> {
        self.big_txn(Txn::new().and_then(gets)).await.map(replies_of)
    }

    /// Several reads of a few small keys at one revision, with the ordinary limit: a reader
    /// waiting on a member that lost its leader gives up as soon as any other request would.
    pub async fn small_read(&self, gets: Vec<TxnOp>) -> Result<(i64, Vec<GetResponse>)> {
        self.txn(Txn::new().and_then(gets)).await.map(replies_of)
    }
}

/// A transaction's revision and its reads' answers, in order (of the branch it took).
pub(crate) fn replies_of(response: TxnResponse) -> (i64, Vec<GetResponse>) {
    let revision = response.header().map_or(0, |header| header.revision());
    let replies = response
        .op_responses()
        .into_iter()
        .filter_map(|reply| match reply {
            etcd_client::TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect();
    (revision, replies)
}

/// A range read of every key under `prefix`.
pub fn get_prefix(prefix: &str) -> TxnOp {
    TxnOp::get(prefix, Some(GetOptions::new().with_prefix()))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use fleet_testkit::EtcdServer;

    use super::*;

    async fn connect(etcd: &EtcdServer) -> Connection {
        let options = EtcdOptions { endpoints: vec![etcd.endpoint()], ..EtcdOptions::default() };
        Connection::connect(&options).await.unwrap()
    }

    fn refusal(message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::unknown(message.to_string()))
    }

    /// etcd 3.4 refuses requests with "too many requests" while its apply is five thousand
    /// entries behind its commits; nothing was done, so the call waits and goes again (within
    /// its limit) rather than failing a batch back to its caller.
    #[tokio::test]
    async fn a_call_refused_while_etcd_is_behind_goes_again_after_growing_pauses() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let (calls, started) = (AtomicUsize::new(0), tokio::time::Instant::now());
        let answer = connection
            .sent_once("test", Duration::from_secs(5), || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0..3 => Err(refusal("etcdserver: too many requests")),
                    _ => Ok(7),
                }
            })
            .await;
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // 50 ms, 100 ms, 200 ms.
        assert!(started.elapsed() >= Duration::from_millis(350), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_call_refused_for_as_long_as_its_limit_fails_and_any_other_failure_is_the_answer() {
        let etcd = EtcdServer::start();
        let connection = connect(&etcd).await;
        let calls = AtomicUsize::new(0);
        let refused: Result<()> = connection
            .sent_once("test", Duration::from_secs(3), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(refusal("etcdserver: too many requests"))
            })
            .await;
        assert!(refused.is_err());
        assert!(calls.load(Ordering::SeqCst) > 3, "sent again while its limit lasted");
        let other = AtomicUsize::new(0);
        let failed: Result<()> = connection
            .sent_once("test", Duration::from_secs(3), || async {
                other.fetch_add(1, Ordering::SeqCst);
                Err(refusal("etcdserver: request timed out"))
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(other.load(Ordering::SeqCst), 1, "a request that may have been carried out is not sent again");
    }
}
