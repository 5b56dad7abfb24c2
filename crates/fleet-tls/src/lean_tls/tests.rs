use std::sync::Arc;

use rustls::HandshakeKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::*;
use crate::server_tls::server_config;
use crate::server_tls::tests::{Pki, client_config, pki};

/// A server stream and a rustls client stream over one loopback TCP connection, both past
/// the handshake as each side sees it.
async fn connect(
    server: Arc<ServerConfig>,
    client: Arc<rustls::ClientConfig>,
) -> (io::Result<LeanTlsStream<TcpStream>>, io::Result<TlsStream<TcpStream>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepting = async {
        let (socket, _) = listener.accept().await.unwrap();
        LeanTlsStream::accept(socket, server).await
    };
    let connecting = async {
        let socket = TcpStream::connect(address).await.unwrap();
        TlsConnector::from(client).connect("localhost".try_into().unwrap(), socket).await
    };
    tokio::join!(accepting, connecting)
}

fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length).map(|index| (index % 251) as u8 ^ seed).collect()
}

fn setup() -> (tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    (dir, pki)
}

#[tokio::test]
async fn data_crosses_both_ways_and_a_quiet_connection_holds_no_buffer() {
    let (_dir, pki) = setup();
    exchange(&pki, client_config(&pki), rustls::ProtocolVersion::TLSv1_3).await;
}

#[tokio::test]
async fn a_tls_1_2_client_is_served_the_same() {
    let (_dir, pki) = setup();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![pki.client.0.clone()], pki.client.1.clone_key())
        .unwrap();
    exchange(&pki, client, rustls::ProtocolVersion::TLSv1_2).await;
}

/// A connection of `client` that negotiates `version`: the client's certificate and ALPN
/// reach the server, megabytes cross each way, the quiet connection holds no buffer, and
/// each side's close_notify reaches the other as a clean end.
async fn exchange(pki: &Pki, mut client: rustls::ClientConfig, version: rustls::ProtocolVersion) {
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let (server, client) = connect(server_config(&pki.files).unwrap(), Arc::new(client)).await;
    let (mut server, mut client) = (server.unwrap(), client.unwrap());
    assert_eq!(server.tls().protocol_version(), Some(version));
    let presented = server.tls().peer_certificates().and_then(|chain| chain.first()).map(|leaf| leaf.to_vec());
    assert_eq!(presented, Some(pki.client.0.to_vec()), "the server holds the client's verified certificate");
    assert_eq!(server.tls().alpn_protocol(), Some(&b"http/1.1"[..]));

    // More than the socket holds, each way: writes wait for the reader, and arrive in order.
    let (up, down) = (pattern(3 << 20, 7), pattern(5 << 20, 11));
    let mut server_read = Vec::new();
    let send_up = async {
        client.write_all(&up).await.unwrap();
        client.flush().await.unwrap();
    };
    let receive_up = async {
        let mut buffer = vec![0; 10_000];
        while server_read.len() < up.len() {
            let read = server.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the client's data ended early");
            server_read.extend_from_slice(&buffer[..read]);
        }
    };
    tokio::join!(send_up, receive_up);
    assert_eq!(server_read, up);
    let mut client_read = Vec::new();
    let send_down = async {
        server.write_all(&down).await.unwrap();
        server.flush().await.unwrap();
    };
    let receive_down = async {
        while client_read.len() < down.len() {
            let read = client.read_buf(&mut client_read).await.unwrap();
            assert!(read > 0, "the server's data ended early");
        }
    };
    tokio::join!(send_down, receive_down);
    assert_eq!(client_read, down);
    assert_eq!(server.buffered_capacity(), 0, "a quiet connection holds no buffer");

    // The client says it is done: the server reads the end, and ends its side the same way.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
    server.shutdown().await.unwrap();
    assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0, "the client reads a clean end");
}

#[tokio::test]
async fn a_peer_gone_without_close_notify_is_an_unexpected_end() {
    let (_dir, pki) = setup();
    let (server, client) = connect(server_config(&pki.files).unwrap(), Arc::new(client_config(&pki))).await;
    let (mut server, mut client) = (server.unwrap(), client.unwrap());
    // The client reads all the server sent (its session ticket too), so that closing its
    // socket ends the connection rather than resetting it.
    server.write_all(b"ready").await.unwrap();
    server.flush().await.unwrap();
    let mut ready = [0; 5];
    client.read_exact(&mut ready).await.unwrap();
    client.write_all(b"half a request").await.unwrap();
    client.flush().await.unwrap();
    // The socket closed under the TLS session (no close_notify).
    let (socket, _) = client.into_inner();
    drop(socket);
    let mut read = Vec::new();
    let error = server.read_to_end(&mut read).await.unwrap_err();
    assert_eq!(read, b"half a request");
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
}

#[tokio::test]
async fn a_second_connection_resumes_and_the_server_still_holds_the_certificate() {
    let (_dir, pki) = setup();
    let server = server_config(&pki.files).unwrap();
    let client = Arc::new(client_config(&pki));
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let (accepted, connected) = connect(server.clone(), client.clone()).await;
        let (mut accepted, mut connected) = (accepted.unwrap(), connected.unwrap());
        // The server's session ticket reaches the client with the first data it reads.
        accepted.write_all(b"hello").await.unwrap();
        accepted.flush().await.unwrap();
        let mut hello = [0; 5];
        connected.read_exact(&mut hello).await.unwrap();
        let certificate = accepted.tls().peer_certificates().and_then(|chain| chain.first()).map(|leaf| leaf.to_vec());
        assert_eq!(certificate, Some(pki.client.0.to_vec()));
        kinds.push(accepted.tls().handshake_kind());
    }
    assert_eq!(kinds, [Some(HandshakeKind::Full), Some(HandshakeKind::Resumed)]);
}

#[tokio::test]
async fn a_client_whose_certificate_the_server_refuses_is_told_why() {
    let (_dir, pki) = setup();
    let (_other_dir, stranger) = setup();
    // The server trusts `pki`'s CA for clients; the client's certificate comes from another.
    let mut client = client_config(&pki);
    client.client_auth_cert_resolver = client_config(&stranger).client_auth_cert_resolver.clone();
    let (server, client) = connect(server_config(&pki.files).unwrap(), Arc::new(client)).await;
    assert!(server.is_err(), "the server refused the handshake");
    // TLS 1.3: the client finished its side before the server read its certificate; it hears
    // the alert on its first read, not a bare end of the connection.
    let mut client = client.unwrap();
    let error = client.read_to_end(&mut Vec::new()).await.unwrap_err();
    assert!(error.to_string().contains("alert"), "{error}");
}

#[tokio::test]
async fn a_handshake_message_larger_than_allowed_is_refused_before_it_is_held() {
    let (_dir, pki) = setup();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = server_config(&pki.files).unwrap();
    let accepting = async {
        let (socket, _) = listener.accept().await.unwrap();
        LeanTlsStream::accept(socket, server).await.map(|_| ())
    };
    // A ClientHello that says it is 16 MiB long, sent as full records until the server stops
    // reading or 1 MiB went (the socket then closes).
    let flooding = async {
        let mut socket = TcpStream::connect(address).await.unwrap();
        let mut record = vec![0x16, 0x03, 0x01, 0x40, 0x00];
        record.extend_from_slice(&[0x01, 0xff, 0xff, 0xff]);
        record.resize(5 + 0x4000, 0);
        let mut sent = 0;
        while sent < 1 << 20 && socket.write_all(&record).await.is_ok() {
            sent += record.len();
        }
    };
    let (accepted, _) = tokio::join!(accepting, flooding);
    let error = accepted.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "refused as invalid, not waited on: {error}");
}
