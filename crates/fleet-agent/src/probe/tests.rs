//! Probes against real local servers: a kept connection, one the server let go, HTTPS with a
//! certificate no one signed, an answer too long to keep, a server that never answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fleet_core::health::{Outcome, Probe};
use fleet_testkit::FakeUnitManager;
use fleet_unit_manager::check_command::RunAs;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Prober;

/// What a test server counts.
#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    requests: AtomicUsize,
}

/// Serves `answer` to each request on a connection, and closes the connection, without a
/// word, after `per_connection` answers (as a server does with a connection idle too long).
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    answer: &'static str,
    per_connection: usize,
    counts: &Counts,
) {
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    let mut answered = 0;
    while answered < per_connection {
        let Ok(read) = stream.read(&mut chunk).await else { return };
        if read == 0 {
            return;
        }
        request.extend_from_slice(&chunk[..read]);
        while let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") {
            request.drain(..end + 4);
            counts.requests.fetch_add(1, Ordering::SeqCst);
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            answered += 1;
        }
    }
}

/// Listens on a loopback port and serves `answer` on each connection, over TLS when given an
/// acceptor.
async fn server(
    answer: &'static str,
    per_connection: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (u16, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let counts = Arc::new(Counts::default());
    let counted = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.connections.fetch_add(1, Ordering::SeqCst);
            let (tls, counted) = (tls.clone(), counted.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve(stream, answer, per_connection, &counted).await,
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            serve(stream, answer, per_connection, &counted).await;
                        }
                    }
                }
            });
        }
    });
    (port, counts)
}

async fn plain_server(answer: &'static str, per_connection: usize) -> (u16, Arc<Counts>) {
    server(answer, per_connection, None).await
}

async fn tls_server(answer: &'static str) -> (u16, Arc<Counts>) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("parameters");
    let certificate = params.self_signed(&key).expect("a self-signed certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(
            vec![certificate.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("a server configuration");
    server(answer, usize::MAX, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
}

async fn probe_times(prober: &mut Prober, probe: &Probe, times: usize) -> Vec<Outcome> {
    let manager = FakeUnitManager::new();
    let mut outcomes = Vec::new();
    for _ in 0..times {
        outcomes.push(prober.probe(probe, "web.service", &RunAs::default(), Duration::from_secs(5), &manager).await);
    }
    outcomes
}

fn http(tls: bool, port: u16) -> Probe {
    Probe::Http { tls, host: "127.0.0.1".to_string(), port, path: "/health".to_string() }
}

const CHUNKED_OK: &str = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";

#[tokio::test]
async fn an_http_check_keeps_its_connection_and_replaces_one_the_server_let_go() {
    let (port, counts) = plain_server(CHUNKED_OK, 3).await;
    let mut prober = Prober::default();
    let outcomes = probe_times(&mut prober, &http(false, port), 9).await;
    assert_eq!(outcomes, vec![Outcome::Pass; 9], "a connection closed while idle is no failure");
    assert_eq!(counts.requests.load(Ordering::SeqCst), 9);
    assert_eq!(counts.connections.load(Ordering::SeqCst), 3, "one connection for every three probes");
}

#[tokio::test]
async fn an_https_check_takes_a_certificate_no_one_signed_and_keeps_its_connection() {
    let (port, counts) = tls_server("HTTP/1.1 204 No Content\r\n\r\n").await;
    let mut prober = Prober::default();
    assert_eq!(probe_times(&mut prober, &http(true, port), 4).await, vec![Outcome::Pass; 4]);
    assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
    // The same server over plain HTTP does not answer with a status line.
    let mut plain = Prober::default();
    let outcomes = probe_times(&mut plain, &http(false, port), 1).await;
    assert!(matches!(&outcomes[0], Outcome::Fail(_)), "{outcomes:?}");
}

#[tokio::test]
async fn a_failing_answer_is_reported_and_a_long_or_closing_one_is_not_kept() {
    let long: &'static str = Box::leak(
        format!("HTTP/1.1 500 Oops\r\nContent-Length: {}\r\n\r\n{}", 70_000, "x".repeat(70_000)).into_boxed_str(),
    );
    let (port, counts) = plain_server(long, usize::MAX).await;
    let mut prober = Prober::default();
    let outcomes = probe_times(&mut prober, &http(false, port), 2).await;
    assert_eq!(outcomes, vec![Outcome::Fail("HTTP 500".to_string()); 2]);
    assert_eq!(counts.connections.load(Ordering::SeqCst), 2, "a body past 64 KiB is left with its connection");

    let (port, counts) =
        plain_server("HTTP/1.1 301 Moved\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", usize::MAX).await;
    let mut prober = Prober::default();
    assert_eq!(probe_times(&mut prober, &http(false, port), 2).await, vec![Outcome::Pass; 2]);
    assert_eq!(counts.connections.load(Ordering::SeqCst), 2, "the server said it closes");
}

#[tokio::test]
async fn a_server_that_never_answers_fails_at_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let manager = FakeUnitManager::new();
    let mut prober = Prober::default();
    let outcome =
        prober.probe(&http(false, port), "web.service", &RunAs::default(), Duration::from_millis(200), &manager).await;
    assert_eq!(outcome, Outcome::Fail("no answer within 0.2s".to_string()));
    drop(listener);
}
