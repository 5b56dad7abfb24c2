//! Regression (issue 67): a viewer whose HTTP/2 client never opens its window made fleetd keep
//! every page it asked for (32 connections × 64 streams of a 392 KB page took it from 29 MB
//! to 839 MB). A real HTTP/2 client (the `h2` crate) with a stream window of 0 asks for the
//! same here: fleetd answers what it may hold, refuses the rest with a 503, and stays within
//! its bound.

use std::sync::Arc;

use fleet_e2e::pki::ManagerPki;
use fleet_e2e::{Fleetd, peak_resident_mib};
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;

/// 2,048 streams in all, as in the issue: 16 on each of 128 connections (fleetd takes 16
/// at once on a connection).
const CONNECTIONS: usize = 128;
const STREAMS: usize = fleet_api::serve::HTTP2_STREAMS_PER_CONNECTION as usize;

/// A TLS connection to `port` trusting `ca`, speaking HTTP/2 with a stream window of 0: it
/// takes headers but never a byte of a body.
async fn never_reading(port: u16, ca: &[u8]) -> h2::client::SendRequest<bytes::Bytes> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls_pki_types::CertificateDer::pem_slice_iter(ca) {
        roots.add(certificate.expect("a CA certificate")).expect("trusted");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("a name"), tcp)
        .await
        .expect("TLS");
    let (send, connection) =
        h2::client::Builder::new().initial_window_size(0).handshake(tls).await.expect("an HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

#[test]
fn clients_that_never_read_their_answers_do_not_grow_fleetd() {
    let pki = ManagerPki::local();
    let port = fleet_testkit::free_port();
    let config = pki.manager_config(&format!("127.0.0.1:{port}"), &[]);
    let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let fleet = Fleetd::start("e2e0unread000001", &pairs);
    // A page of the unit list is about 400 KB: 100 units of 4 KB.
    let dir = tempfile::tempdir().expect("a dir");
    let padding = "x".repeat(1900);
    let mut paths = Vec::new();
    for index in 0..100 {
        let text =
            format!("[Service]\nExecStart=/bin/true\nEnvironment=A{index}={padding}\nEnvironment=B{index}={padding}\n");
        paths.push(fleet_e2e::write_unit(dir.path(), &format!("pad{index}.service"), &text));
    }
    let mut submit = vec!["submit"];
    submit.extend(paths.iter().map(String::as_str));
    fleet.ok(&submit);
    let token = fleet.ok(&["token", "create", "--role", "viewer", "reader"]).stdout.trim().to_string();
    let ca = pki.api_ca_pem();

    let before = peak_resident_mib(fleet.pid());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let asking = async {
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS {
            clients.push(never_reading(port, &ca).await);
        }
        let mut asked = Vec::new();
        for client in &clients {
            for _ in 0..STREAMS {
                let request = http::Request::get(format!("https://localhost:{port}/fleet/v1/units"))
                    .header("authorization", format!("Bearer {token}"))
                    .body(())
                    .expect("a request");
                let mut ready = client.clone().ready().await.expect("a stream");
                let (answer, _) = ready.send_request(request, true).expect("sent");
                asked.push(answer);
            }
        }
        // Headers come whatever the window: the bodies are what waits. Each answer is kept
        // (dropping one would cancel its stream) and the clients stay connected, reading
        // nothing, while fleetd's memory is read.
        let mut answers = Vec::new();
        for answer in asked {
            answers.push(answer.await.ok());
        }
        let statuses: Vec<u16> =
            answers.iter().map(|answer| answer.as_ref().map_or(0, |a| a.status().as_u16())).collect();
        (statuses, (clients, answers))
    };
    let (statuses, _clients) = rt
        .block_on(async { tokio::time::timeout(std::time::Duration::from_secs(120), asking).await })
        .expect("every stream answered with headers within two minutes");
    let peak = peak_resident_mib(fleet.pid());
    let answered = statuses.iter().filter(|status| **status == 200).count();
    let refused = statuses.iter().filter(|status| **status == 503).count();
    // A connection whose client took nothing for 30 s is closed: what it still waited for
    // never got its headers (on a loaded machine, building the pages can take that long).
    let closed = statuses.iter().filter(|status| **status == 0).count();
    assert_eq!(answered + refused + closed, statuses.len(), "{statuses:?}");
    eprintln!("{answered} answered, {refused} refused, {closed} closed, peak {peak:.0} MiB");
    assert!(refused > 0 && answered > 0, "{answered} answered, {refused} refused");
    // Unbounded, the pages alone were 2,048 × 400 KB = 800 MB.
    assert!(peak - before < 200.0, "fleetd grew from {before:.0} MiB to {peak:.0} MiB");
    drop(rt);
}
