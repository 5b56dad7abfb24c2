//! Serving the API on its listeners, with the limits that keep it answering whatever its
//! clients do: a bound on the connections of each listener (so a flood on TCP never starves
//! the Unix socket), a deadline for a request's headers that also closes idle keep-alive
//! connections, a deadline for its body, and a bound on accept errors (such as running out
//! of descriptors) that retries instead of giving up.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};

use tower::ServiceExt as _;

use crate::auth::Peer;
use crate::host_check::HostCheck;
use crate::listen::ApiListener;
use crate::tcp_liveness::{self, Probing};
use crate::unread_answers::ConnectionAnswers;
use crate::upgrade::ConnectionHold;
use fleet_metrics::HandshakeLabels;
use fleet_tls::certificate::{self, CertificateIdentity};
use fleet_tls::lean_tls::LeanTlsStream;
use fleet_tls::server_tls::ServerTls;

/// The limits every listener serves with.
#[derive(Clone, Copy, Debug)]
pub struct ServeLimits {
    /// Connections open at once on one listener; more are closed at once.
    pub connections_per_listener: usize,
    /// How long a client may take to send a request's headers, and how long a keep-alive
    /// connection may sit idle.
    pub header_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub shutdown_grace: Duration,
    /// How long an HTTP/2 connection may be silent before it is pinged; its answer may take
    /// half as long again before the connection is closed (on a manager, from `agent_ttl`: a
    /// pull agent's long poll lasts minutes, and its connection going dead must be noticed
    /// within that).
    pub keep_alive: Duration,
    /// How long a TLS handshake may take. On a manager, as long as a pull agent waits for its
    /// manager's answer: a handshake that is slow because the manager is loaded is finished,
    /// not thrown away with the work done for it (a thrown-away handshake is done again, and
    /// under load the agents' handshakes were dropped faster than they could finish).
    pub handshake_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            connections_per_listener: 512,
            header_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
            keep_alive: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Requests one HTTP/2 connection may have in flight at once (a pull agent has a long poll
/// and a request or two).
pub const HTTP2_STREAMS_PER_CONNECTION: u32 = 16;

/// How long to wait before accepting again after an accept error (e.g. EMFILE).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves `router` on every listener until `shutdown` turns true. TLS listeners use the
/// configuration `tls` holds at each handshake.
pub async fn serve(
    listeners: &[ApiListener],
    router: Router,
    shutdown: watch::Receiver<bool>,
    limits: ServeLimits,
    tls: Option<Arc<ServerTls>>,
) -> std::io::Result<()> {
    let mut servers = tokio::task::JoinSet::new();
    for listener in listeners {
        let check = HostCheck::for_listener(listener);
        let router = router.clone().layer(axum::Extension(check));
        let stop = shutdown.clone();
        match listener.try_clone()? {
            ApiListener::Unix(listener) => {
                let listener = tokio::net::UnixListener::from_std(listener)?;
                servers.spawn(accept_loop(listener, router, stop, limits, Connect::Plain));
            }
            ApiListener::Tcp(listener) => {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                servers.spawn(accept_loop(listener, router, stop, limits, Connect::Plain));
            }
            ApiListener::Tls(listener) => {
                let Some(tls) = tls.clone() else {
                    return Err(std::io::Error::other("an https:// listener needs a TLS certificate and key"));
                };
                let listener = tokio::net::TcpListener::from_std(listener)?;
                servers.spawn(accept_loop(listener, router, stop, limits, Connect::Tls(tls)));
            }
        }
    }
    while let Some(result) = servers.join_next().await {
        if let Err(error) = result {
            tracing::warn!(%error, "API listener task failed");
        }
    }
    Ok(())
}

/// How a connection starts once accepted.
#[derive(Clone)]
enum Connect {
    Plain,
    Tls(Arc<ServerTls>),
}

/// A listener's accept, whatever its kind, with who the peer is.
trait Accept: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, Peer)>> + Send;
    /// Has the kernel end the connection once its peer has been gone for about one and a
    /// half `keep_alive` (where the connection can tell).
    fn watch_peer(_stream: &Self::Stream, _probing: Probing) {}
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<(Self::Stream, Peer)> {
        let (stream, _) = self.accept().await?;
        let uid = stream.peer_cred().ok().map(|credentials| credentials.uid());
        Ok((stream, Peer::Unix { uid }))
    }
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<(Self::Stream, Peer)> {
        let (stream, _) = self.accept().await?;
        // An answer goes out a record at a time, each smaller than loopback's segment: with
        // Nagle's algorithm each waited for the client's delayed acknowledgement of the one
        // before (40 ms), and a list over HTTPS took 44 ms where it takes 1.5.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot turn off Nagle's algorithm on an API connection");
        }
        Ok((stream, Peer::Tcp { tls: false, certificate: None }))
    }

    fn watch_peer(stream: &Self::Stream, probing: Probing) {
        if let Err(error) = tcp_liveness::watch_peer(stream, probing) {
            tracing::debug!(%error, "cannot have the kernel watch an API connection's peer");
        }
    }
}

async fn accept_loop<L: Accept>(
    listener: L,
    router: Router,
    mut stop: watch::Receiver<bool>,
    limits: ServeLimits,
    connect: Connect,
) {
    let slots = Arc::new(Semaphore::new(limits.connections_per_listener));
    let probing = Probing::for_keep_alive(limits.keep_alive);
    let mut connections = tokio::task::JoinSet::new();
    let mut refused_logged = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.next() => accepted,
            // A finished connection's task is let go at once: its memory (sized for the
            // connection, about 10 KiB) is held until it is joined.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            () = stopped(&mut stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept an API connection; retrying");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if !refused_logged {
                tracing::warn!(limit = limits.connections_per_listener, "too many API connections; closing new ones");
                refused_logged = true;
            }
            drop(stream);
            continue;
        };
        refused_logged = false;
        // An idle pull agent's stream may carry nothing for minutes: its kernel, not a
        // heartbeat, tells whether it is still there.
        L::watch_peer(&stream, probing);
        let (router, stop) = (router.clone(), stop.clone());
        match &connect {
            Connect::Plain => {
                connections.spawn(serve_connection(stream, peer, Protocol::Http1, router, stop, limits, slot));
            }
            Connect::Tls(tls) => {
                let config = tls.current();
                let machine_issuer = tls.machine_issuer();
                connections.spawn(async move {
                    let handshake =
                        tokio::time::timeout(limits.handshake_timeout, LeanTlsStream::accept(stream, config)).await;
                    let stream = match handshake {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "TLS handshake refused");
                            return;
                        }
                        Err(_) => return,
                    };
                    let kind = match stream.tls().handshake_kind() {
                        Some(rustls::HandshakeKind::Resumed) => "resumed",
                        _ => "full",
                    };
                    fleet_metrics::metrics().api.tls_handshakes.get_or_create(&HandshakeLabels { kind }).inc();
                    let certificate = stream.tls().peer_certificates().and_then(|chain| chain.first()).map(|leaf| {
                        Arc::new(certificate::from_der(leaf, machine_issuer.as_deref()).unwrap_or_else(|| {
                            CertificateIdentity {
                                name: "unnamed".into(),
                                role: Err("its subject has no usable common name (CN)".into()),
                                key_sha256: String::new(),
                            }
                        }))
                    });
                    let peer = Peer::Tcp { tls: true, certificate };
                    let protocol = match stream.tls().alpn_protocol() {
                        Some(b"h2") => Protocol::Http2,
                        _ => Protocol::Http1,
                    };
                    serve_connection(stream, peer, protocol, router, stop, limits, slot).await;
                });
            }
        }
    }
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_grace, drain).await.is_err() {
        connections.abort_all();
    }
}

/// The HTTP version a connection speaks: HTTP/2 only where TLS negotiated it (ALPN `h2`),
/// so that a plain connection is never read before its header deadline applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// A connection fleetd can ask to finish what it is doing and close.
trait GracefulShutdown: std::future::Future<Output = Result<(), hyper::Error>> {
    fn shut_down(self: std::pin::Pin<&mut Self>);
}

impl<I, S> GracefulShutdown for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: hyper::body::Body + Send + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shut_down(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S> GracefulShutdown for hyper::server::conn::http2::Connection<I, S, TokioExecutor>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Future: Send + 'static,
    S::ResBody: hyper::body::Body + Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shut_down(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves `connection` until it ends, or until `stop`, when it finishes in-flight requests;
/// closes it at once when its client leaves the answers it asked for unread
/// ([`ConnectionAnswers::stalled`]).
async fn drive(connection: impl GracefulShutdown, stop: &mut watch::Receiver<bool>, answers: &ConnectionAnswers) {
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "API connection ended");
            }
        }
        () = stopped(stop) => {
            connection.as_mut().shut_down();
            let _ = connection.await;
        }
        () = answers.stalled() => {
            tracing::info!(held = answers.held(), "closing an API connection whose client reads none of its answers");
        }
    }
}

async fn serve_connection<S>(
    stream: S,
    peer: Peer,
    protocol: Protocol,
    router: Router,
    mut stop: watch::Receiver<bool>,
    limits: ServeLimits,
    slot: tokio::sync::OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // A protocol a request upgrades to keeps the connection's slot and follows the stop.
    let hold = ConnectionHold { slot: Arc::new(slot), stop: stop.clone() };
    let answers = ConnectionAnswers::new();
    let held = answers.clone();
    let with_peer = router
        .map_request(move |mut request: axum::http::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(peer.clone());
            request.extensions_mut().insert(hold.clone());
            request
        })
        .map_response(move |response| held.hold(response));
    let service = TowerToHyperService::new(with_peer);
    match protocol {
        Protocol::Http1 => {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            drive(connection, &mut stop, &answers).await;
        }
        // A pull agent keeps one HTTP/2 connection for its long polls and requests alike.
        Protocol::Http2 => {
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(limits.keep_alive))
                .keep_alive_timeout(limits.keep_alive / 2)
                .max_concurrent_streams(HTTP2_STREAMS_PER_CONNECTION);
            drive(builder.serve_connection(TokioIo::new(stream), service), &mut stop, &answers).await;
        }
    }
}

/// Resolves when `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use fleet_store_embedded::EmbeddedRegistry;

    use super::*;
    use crate::listen::{bind_tcp, bind_unix};
    use crate::{ApiState, router};

    struct Server {
        tcp: std::net::SocketAddr,
        unix: std::path::PathBuf,
        stop: watch::Sender<bool>,
        _dir: tempfile::TempDir,
    }

    async fn server(limits: ServeLimits) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
        let state = ApiState::new(
            Arc::new(registry.clone()),
            crate::auth::Auth::new(Arc::new(registry), Some(fleet_core::access::Role::Viewer)),
        );
        let unix = dir.path().join("api.sock");
        let listeners = vec![bind_tcp("127.0.0.1:0").unwrap(), bind_unix(&unix).unwrap()];
        let ApiListener::Tcp(tcp) = &listeners[0] else { unreachable!() };
        let tcp = tcp.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move { serve(&listeners, router(state), stopped, limits, None).await });
        Server { tcp, unix, stop, _dir: dir }
    }

    /// An answer goes out a record at a time: with Nagle's algorithm each would wait for the
    /// client's delayed acknowledgement of the one before.
    #[tokio::test]
    async fn tcp_connections_are_accepted_without_nagles_delay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = Accept::next(&listener).await.unwrap();
        assert!(accepted.nodelay().unwrap(), "an accepted connection sends at once");
    }

    fn ask(mut stream: impl Read + Write, host: &str) -> String {
        let request = format!("GET /fleet/v1/units HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    }

    /// Blocks until the server closes `stream`; returns how long that took.
    fn closed_after(mut stream: impl Read) -> Duration {
        let started = Instant::now();
        let mut buffer = [0u8; 256];
        while matches!(stream.read(&mut buffer), Ok(read) if read > 0) {}
        started.elapsed()
    }

    const LIMITS: ServeLimits = ServeLimits {
        connections_per_listener: 4,
        header_timeout: Duration::from_millis(300),
        shutdown_grace: Duration::from_secs(1),
        keep_alive: Duration::from_secs(10),
        handshake_timeout: Duration::from_millis(300),
    };

    /// Regression: idle and slow-header connections were never timed out.
    #[tokio::test(flavor = "multi_thread")]
    async fn idle_and_slow_connections_are_closed() {
        let server = server(LIMITS).await;
        let tcp = server.tcp;
        let waited = tokio::task::spawn_blocking(move || {
            let idle = TcpStream::connect(tcp).unwrap();
            let idle_for = closed_after(idle);
            let mut slow = TcpStream::connect(tcp).unwrap();
            slow.write_all(b"GET /fleet/v1/units HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
            (idle_for, closed_after(slow))
        })
        .await
        .unwrap();
        for elapsed in [waited.0, waited.1] {
            assert!(elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(5), "{elapsed:?}");
        }
        let _ = server.stop.send(true);
    }

    /// Connections past the bound are closed at once, and a flood on TCP does not reach the
    /// Unix socket, which keeps answering.
    #[tokio::test(flavor = "multi_thread")]
    async fn connections_are_bounded_per_listener() {
        let server = server(ServeLimits { header_timeout: Duration::from_secs(30), ..LIMITS }).await;
        let (tcp, unix) = (server.tcp, server.unix.clone());
        tokio::task::spawn_blocking(move || {
            let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(tcp).unwrap()).collect();
            std::thread::sleep(Duration::from_millis(200));
            let extra = TcpStream::connect(tcp).unwrap();
            assert!(closed_after(extra) < Duration::from_secs(2), "the fifth connection is closed at once");
            assert!(ask(UnixStream::connect(&unix).unwrap(), "localhost").starts_with("HTTP/1.1 200"));
            drop(held);
            std::thread::sleep(Duration::from_millis(200));
            assert!(ask(TcpStream::connect(tcp).unwrap(), "127.0.0.1").starts_with("HTTP/1.1 200"), "slots come back");
        })
        .await
        .unwrap();
        let _ = server.stop.send(true);
    }

    /// Regression: the Host header was not checked, which let DNS rebinding reach a loopback
    /// listener from a browser.
    #[tokio::test(flavor = "multi_thread")]
    async fn loopback_listeners_refuse_foreign_host_names() {
        let server = server(LIMITS).await;
        let (tcp, unix) = (server.tcp, server.unix.clone());
        tokio::task::spawn_blocking(move || {
            let refused = ask(TcpStream::connect(tcp).unwrap(), "attacker.example:4002");
            assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
            assert!(refused.contains("Host header names no loopback address"), "{refused}");
            assert!(
                ask(TcpStream::connect(tcp).unwrap(), &format!("localhost:{}", tcp.port())).starts_with("HTTP/1.1 200")
            );
            assert!(ask(TcpStream::connect(tcp).unwrap(), &tcp.to_string()).starts_with("HTTP/1.1 200"));
            assert!(
                ask(UnixStream::connect(&unix).unwrap(), "attacker.example").starts_with("HTTP/1.1 200"),
                "a Unix socket is not reachable from a browser"
            );
        })
        .await
        .unwrap();
        let _ = server.stop.send(true);
    }
}
