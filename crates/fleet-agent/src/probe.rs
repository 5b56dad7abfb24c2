//! One probe of a unit's health check, bounded by the check's timeout: an HTTP(S) GET that
//! reads only the status line, a TCP connect, a command (`fleet_unit_manager::check_command`),
//! or a look at systemd's watchdog.
//!
//! An HTTPS check does not verify the server's certificate: it authenticates nothing and
//! sends nothing secret (no credentials are taken in its address), and a service's own
//! certificate is often one no machine trusts; only whether the service answers counts.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fleet_core::health::{Outcome, Probe};
use fleet_unit_manager::UnitManager;
use fleet_unit_manager::check_command::{RunAs, run_check};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most of an answer read to find its status line.
const MOST_STATUS_LINE: usize = 1024;

/// Probes `unit` once, within `timeout`.
pub async fn probe(probe: &Probe, unit: &str, run_as: &RunAs, timeout: Duration, manager: &dyn UnitManager) -> Outcome {
    let result = match probe {
        // Bounded by its own timeout, which also kills what it left.
        Probe::Exec { argv } => run_check(argv, run_as, timeout).await,
        other => match tokio::time::timeout(timeout, probe_network(other, unit, manager)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {}s", timeout.as_secs_f64())),
        },
    };
    match result {
        Ok(()) => Outcome::Pass,
        Err(why) => Outcome::Fail(why),
    }
}

async fn probe_network(probe: &Probe, unit: &str, manager: &dyn UnitManager) -> Result<(), String> {
    match probe {
        Probe::Tcp { host, port } => connect(host, *port).await.map(drop),
        Probe::Http { tls, host, port, path } => http_get(*tls, host, *port, path).await,
        Probe::Watchdog => match manager.watchdog_fired(unit).await {
            Ok(false) => Ok(()),
            Ok(true) => Err("systemd's watchdog fired".to_string()),
            Err(error) => Err(error.to_string()),
        },
        Probe::Exec { .. } => Err("not a network probe".to_string()),
    }
}

/// Connects to `host:port`. The connection is reset when dropped rather than closed: a probe
/// has what it came for by then, and neither side keeps a closing socket around for minutes
/// (thousands of probes a second would fill both sides with them).
async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|error| format!("connecting to {}: {error}", authority(host, port)))?;
    let _ = stream.set_zero_linger();
    Ok(stream)
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

async fn http_get(tls: bool, host: &str, port: u16, path: &str) -> Result<(), String> {
    let stream = connect(host, port).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: fleet-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        authority(host, port)
    );
    if !tls {
        return exchange(stream, &request).await;
    }
    let name = ServerName::try_from(host.to_string()).map_err(|error| format!("server name {host:?}: {error}"))?;
    let connector = tokio_rustls::TlsConnector::from(tls_config()?);
    let stream = connector.connect(name, stream).await.map_err(|error| format!("TLS handshake: {error}"))?;
    exchange(stream, &request).await
}

/// Sends `request` and reads the status line: 2xx and 3xx pass.
async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: &str) -> Result<(), String> {
    stream.write_all(request.as_bytes()).await.map_err(|error| format!("sending the request: {error}"))?;
    let mut answer = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    while !answer.windows(2).any(|pair| pair == b"\r\n") {
        if answer.len() >= MOST_STATUS_LINE {
            return Err("no HTTP status line in the answer".to_string());
        }
        let read = stream.read(&mut chunk).await.map_err(|error| format!("reading the answer: {error}"))?;
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..read]);
    }
    let line = String::from_utf8_lossy(&answer);
    let code = status_code(&line).ok_or_else(|| "no HTTP status line in the answer".to_string())?;
    if (200..400).contains(&code) { Ok(()) } else { Err(format!("HTTP {code}")) }
}

/// The code of `HTTP/1.1 200 OK…`.
fn status_code(answer: &str) -> Option<u16> {
    let line = answer.lines().next()?;
    let mut words = line.split_whitespace();
    words.next().filter(|version| version.starts_with("HTTP/"))?;
    words.next()?.parse().ok().filter(|code| (100..600).contains(code))
}

/// The one client configuration of HTTPS checks.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|error| format!("TLS: {error}"))?;
            let config = builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnswersOnly(provider)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

/// Takes any certificate (the handshake's signatures are still checked): a health check
/// asks whether the service answers, not who it is.
#[derive(Debug)]
struct AnswersOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for AnswersOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(status_code("HTTP/1.0 500\r\n"), Some(500));
        assert_eq!(status_code("SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code("HTTP/1.1 9999 what\r\n"), None);
    }
}
