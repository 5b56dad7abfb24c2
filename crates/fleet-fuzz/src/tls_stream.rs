//! The server's side of TLS as anyone on the network reaches it: whatever bytes arrive on an
//! accepted connection (a client's hello cut, changed or made up), the handshake ends, refused
//! or done and then read to its end, without a panic.

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use fleet_tls::cluster_certificates;
use fleet_tls::lean_tls::LeanTlsStream;
use fleet_tls::server_tls::{TlsFiles, server_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Fixture {
    runtime: tokio::runtime::Runtime,
    config: Arc<rustls::ServerConfig>,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let made = cluster_certificates::make(&dir.path().join("tls"), &[], SystemTime::now()).expect("certificates");
        let files = TlsFiles {
            certificate: made.server,
            key: made.server_key,
            client_ca: Some(made.api_ca),
            agent_ca: Some(made.agent_ca),
        };
        let config = server_config(&files).expect("the server's TLS configuration");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Fixture { runtime, config, _dir: dir }
    })
}

/// `data` as all a client sends before it closes its side.
pub fn tls_stream(data: &[u8]) {
    let fixture = fixture();
    fixture.runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let sending = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            // What the server answers is read, so that its writes never wait on a full pipe.
            let _ = client.read_to_end(&mut Vec::new()).await;
        };
        let serving = async {
            if let Ok(mut stream) = LeanTlsStream::accept(server, fixture.config.clone()).await {
                let _ = stream.read_to_end(&mut Vec::new()).await;
            }
        };
        tokio::join!(sending, serving);
    });
}
