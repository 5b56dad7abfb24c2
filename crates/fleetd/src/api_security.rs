//! The API's security settings, checked before anything listens: TLS files for `https://`
//! listeners, and the refusal of plain HTTP where other machines can reach it.

use std::net::SocketAddr;
use std::path::PathBuf;

use fleet_tls::server_tls::TlsFiles;

use crate::config::Config;

/// What a TCP listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Http,
    Https,
}

/// The TLS files the configuration names: `None` when TLS is not configured; an error when it
/// is half configured.
pub fn tls_files(config: &Config) -> Result<Option<TlsFiles>, String> {
    let (certificate, key, client_ca) =
        (&config.api_tls_cert_file, &config.api_tls_key_file, &config.api_tls_client_ca_file);
    match (certificate.is_empty(), key.is_empty()) {
        (true, true) if client_ca.is_empty() => Ok(None),
        (true, true) => Err("api_tls_client_ca_file is set but api_tls_cert_file and api_tls_key_file are not".into()),
        (false, true) => Err("api_tls_cert_file is set but api_tls_key_file is not".into()),
        (true, false) => Err("api_tls_key_file is set but api_tls_cert_file is not".into()),
        (false, false) => Ok(Some(TlsFiles {
            certificate: PathBuf::from(certificate),
            key: PathBuf::from(key),
            client_ca: (!client_ca.is_empty()).then(|| PathBuf::from(client_ca)),
            agent_ca: (!config.agent_ca_cert_file.is_empty()).then(|| PathBuf::from(&config.agent_ca_cert_file)),
        })),
    }
}

/// The agent CA the configuration names, if any: both files or neither, and only with TLS
/// (machines present its certificates in the TLS handshake).
pub fn agent_ca_files(config: &Config) -> Result<Option<(PathBuf, PathBuf)>, String> {
    match (config.agent_ca_cert_file.is_empty(), config.agent_ca_key_file.is_empty()) {
        (true, true) => Ok(None),
        (false, true) | (true, false) => Err("agent_ca_cert_file and agent_ca_key_file must be set together".into()),
        (false, false) if config.api_tls_cert_file.is_empty() => {
            Err("agent_ca_cert_file needs TLS: set api_tls_cert_file and api_tls_key_file".into())
        }
        (false, false) => {
            Ok(Some((PathBuf::from(&config.agent_ca_cert_file), PathBuf::from(&config.agent_ca_key_file))))
        }
    }
}

/// Refuses listeners that would expose the API without protection: `https://` without a
/// certificate, and plain HTTP on an address other machines can reach.
pub fn check_listeners(listeners: &[(SocketAddr, Transport)], tls_configured: bool) -> Result<(), String> {
    for (address, transport) in listeners {
        match transport {
            Transport::Https if !tls_configured => {
                return Err(format!(
                    "api_listen has https://{address} but no certificate: set api_tls_cert_file and api_tls_key_file"
                ));
            }
            Transport::Http if !address.ip().is_loopback() => {
                return Err(format!(
                    "refusing plain HTTP on {address}, which other machines can reach: listen on \
                     https://{address} with api_tls_cert_file and api_tls_key_file set, or on a loopback address"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> SocketAddr {
        text.parse().expect("test address")
    }

    #[test]
    fn plain_http_only_on_loopback_and_https_only_with_a_certificate() {
        assert!(check_listeners(&[(address("127.0.0.1:4002"), Transport::Http)], false).is_ok());
        assert!(check_listeners(&[(address("[::1]:4002"), Transport::Http)], false).is_ok());
        let refused = check_listeners(&[(address("0.0.0.0:4002"), Transport::Http)], true).unwrap_err();
        assert!(refused.contains("https://0.0.0.0:4002") && refused.contains("api_tls_cert_file"), "{refused}");
        assert!(check_listeners(&[(address("0.0.0.0:4002"), Transport::Https)], true).is_ok());
        let refused = check_listeners(&[(address("0.0.0.0:4002"), Transport::Https)], false).unwrap_err();
        assert!(refused.contains("api_tls_key_file"), "{refused}");
    }

    #[test]
    fn half_configured_tls_is_refused() {
        let config = |cert: &str, key: &str, ca: &str| Config {
            api_tls_cert_file: cert.into(),
            api_tls_key_file: key.into(),
            api_tls_client_ca_file: ca.into(),
            ..Config::default()
        };
        assert_eq!(tls_files(&config("", "", "")), Ok(None));
        assert!(tls_files(&config("c.pem", "", "")).is_err());
        assert!(tls_files(&config("", "k.pem", "")).is_err());
        assert!(tls_files(&config("", "", "ca.pem")).is_err());
        let files = tls_files(&config("c.pem", "k.pem", "ca.pem")).unwrap().unwrap();
        assert_eq!(files.client_ca, Some(PathBuf::from("ca.pem")));
    }
}
