//! The channel to etcd's members: etcd-client's balanced channel, with HTTP/2 told that etcd
//! is a peer this side trusts.
//!
//! A manager under load cancels many etcd calls at once (the agents' requests behind them
//! timed out). HTTP/2 remembers a cancelled stream for a second, and only 50 of them, so that a
//! late answer on it is dropped quietly; an answer on any other is a protocol error that the
//! library answers with a reset of its own, and once it has sent 1,024 of those over the
//! connection's life it closes the whole connection (`GOAWAY`, `too_many_internal_resets`),
//! failing every call in flight and ending every watch, which then lists the cluster again.
//! That limit guards a server against a flood from an untrusted peer; between fleetd and its
//! own etcd it only turns a busy moment into an outage. Found with 100,000 pull agents on 12
//! managers (docs/benchmark-history.md, issue 36).

use std::time::Duration;

use etcd_client::{BalancedChannelBuilder, Channel};
use tonic::transport::channel::Change;
use tonic::transport::{Endpoint, Uri};

/// What etcd-client sends its members' endpoints through.
type Updater = tokio::sync::mpsc::Sender<Change<Uri, Endpoint>>;

/// How many cancelled streams one connection to etcd remembers (each a few hundred bytes),
/// and for how long: an answer etcd sends on one of them within that time is dropped without
/// a word.
pub const REMEMBERED_RESETS: usize = 8192;
pub const RESET_MEMORY: Duration = Duration::from_secs(30);

/// Builds etcd-client's balanced channel, each member's endpoint with HTTP/2's limit on
/// locally sent resets lifted and its memory of cancelled streams widened.
pub struct TrustingEtcd;

/// A member's endpoint as [`TrustingEtcd`] connects to it.
fn trusting(endpoint: Endpoint) -> Endpoint {
    endpoint
        .http2_max_local_error_reset_streams(None)
        .http2_max_concurrent_reset_streams(REMEMBERED_RESETS)
        .http2_reset_stream_duration(RESET_MEMORY)
}

impl BalancedChannelBuilder for TrustingEtcd {
    type Error = etcd_client::Error;

    fn balanced_channel(self, buffer_size: usize) -> Result<(Channel, Updater), Self::Error> {
        let (channel, to_balancer) = tonic::transport::Channel::balance_channel(buffer_size);
        let (updater, mut updates) = tokio::sync::mpsc::channel::<Change<Uri, Endpoint>>(buffer_size);
        // Ends with the client, which holds the updater.
        tokio::spawn(async move {
            while let Some(change) = updates.recv().await {
                let change = match change {
                    Change::Insert(uri, endpoint) => Change::Insert(uri, trusting(endpoint)),
                    removed => removed,
                };
                if to_balancer.send(change).await.is_err() {
                    return;
                }
            }
        });
        Ok((Channel::Tonic(channel), updater))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fleet_testkit::EtcdServer;

    use crate::EtcdOptions;
    use crate::connection::Connection;

    /// A proxy to `target` whose answers back can be held: what the target sends while held
    /// waits, in order, until released. Returns its address and the switch.
    async fn holding_proxy(target: String) -> (String, tokio::sync::watch::Sender<bool>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (hold, held) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else { continue };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
                let mut held = held.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        let Ok(read) = from_server.read(&mut buffer).await else { return };
                        if read == 0 {
                            return;
                        }
                        if held.wait_for(|held| !*held).await.is_err() {
                            return;
                        }
                        if to_client.write_all(&buffer[..read]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, hold)
    }

    /// Calls cancelled by the thousand whose answers come after (a busy manager whose agents
    /// gave up on their requests, answered late by a busy etcd) leave the connection standing:
    /// a watch opened before still hears.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_cancelled_by_the_thousand_and_answered_late_leave_the_connection_and_its_watches_standing() {
        let etcd = EtcdServer::start();
        let (proxy, hold) = holding_proxy(etcd.endpoint().trim_start_matches("http://").to_string()).await;
        let options = EtcdOptions {
            endpoints: vec![format!("http://{proxy}")],
            request_timeout: Duration::from_secs(5),
            ..EtcdOptions::default()
        };
        let connection = Connection::connect(&options).await.expect("connect");
        let mut client = connection.client();
        client.put("value", "x", None).await.expect("put");
        let mut watch = client.watch("probe", None).await.expect("watch");
        // etcd answers; its answers wait in the proxy until every call has given up on them.
        hold.send_replace(true);
        let calls: Vec<_> = (0..1500)
            .map(|_| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(500), client.get("value", None)).await
                })
            })
            .collect();
        for call in calls {
            assert!(call.await.expect("a call").is_err(), "no answer comes through while held");
        }
        hold.send_replace(false);
        client.put("probe", "after", None).await.expect("the connection still answers");
        let heard = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match watch.message().await {
                    Ok(Some(reply)) if reply.events().is_empty() => continue,
                    other => break other,
                }
            }
        })
        .await
        .expect("the watch answers within 10 s");
        let heard = heard.expect("the watch still stands");
        assert!(heard.is_some_and(|reply| !reply.events().is_empty()), "the watch heard the put");
    }
}
