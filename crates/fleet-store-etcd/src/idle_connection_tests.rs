//! A connection to etcd left idle stays open: etcd closes a connection pinged without a call
//! or watch open on it (`GOAWAY too_many_pings`, at the fourth such ping: 20 s after the last
//! call, with pings every 5 s), and what is sent on it then fails.

use std::time::Duration;

use crate::EtcdOptions;
use crate::connection::Connection;

/// Regression: every idle connection was pinged every 5 s, and etcd closed it 19-20 s after
/// its last call. The wait is the property's own: a connection that would be closed is
/// closed by 20 s (later only if pings came late, which would let this pass, never fail).
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_connection_is_not_closed_by_etcds_ping_policy() {
    let etcd = fleet_testkit::EtcdServer::start();
    let endpoint = etcd.endpoint();
    let port: u16 = endpoint.rsplit(':').next().and_then(|port| port.parse().ok()).expect("port");
    let options = EtcdOptions {
        endpoints: vec![endpoint],
        key_prefix: "/idle/".into(),
        request_timeout: Duration::from_secs(2),
        ..EtcdOptions::default()
    };
    let connection = Connection::connect(&options).await.expect("connect");
    connection.get("/idle/x", None).await.expect("a first call");
    let before = fleet_testkit::connections_to(port);
    assert!(!before.is_empty(), "connected");
    tokio::time::sleep(Duration::from_secs(23)).await;
    assert_eq!(fleet_testkit::connections_to(port), before, "the idle connection was closed and made again");
    connection.get("/idle/x", None).await.expect("a call after the idle time");
}
