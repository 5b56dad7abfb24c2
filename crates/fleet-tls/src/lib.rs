//! TLS and the cluster's PKI: the API listeners' server configuration, reloaded on SIGHUP
//! ([`server_tls`]), the lean TLS stream they serve on ([`lean_tls`]), the certificates a
//! cluster needs made in one step ([`cluster_certificates`]), the agent CA a manager signs
//! joining pull agents' certificates with ([`agent_ca`]), and the identity a client
//! certificate names ([`certificate`]). The cryptography is rustls' and ring's.

#![forbid(unsafe_code)]

pub mod agent_ca;
pub mod certificate;
pub mod cluster_certificates;
pub mod lean_tls;
pub mod server_tls;
pub mod tickets;

/// The SHA-256 of `bytes`, in lowercase hex: how tokens and certificate keys are named in
/// the store.
pub fn hex_sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}
