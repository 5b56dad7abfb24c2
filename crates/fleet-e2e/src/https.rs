//! Raw API requests over HTTP or HTTPS with a chosen credential, for the security tests and
//! the API benchmark: the status and body of each answer, or why no answer came.

use std::path::Path;
use std::time::Duration;

/// What a caller presents.
#[derive(Clone, Debug, Default)]
pub struct Credentials<'a> {
    pub token: Option<&'a str>,
    /// A client certificate and key.
    pub certificate: Option<(&'a Path, &'a Path)>,
}

/// An HTTP(S) client for one fleetd listener.
pub struct Caller {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// One answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    /// The server certificate (DER) an HTTPS answer came with.
    pub server_certificate: Option<Vec<u8>>,
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: String,
}

impl Caller {
    /// A caller for `base` (`http://127.0.0.1:PORT` or `https://localhost:PORT`), trusting
    /// only `ca` for HTTPS.
    pub fn new(base: &str, ca: Option<&Path>, credentials: Credentials<'_>) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(10)).tls_info(true);
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).map_err(|e| e.to_string())?;
            builder = builder.tls_certs_only(reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string())?);
        }
        if let Some((cert, key)) = credentials.certificate {
            let mut pem = std::fs::read(cert).map_err(|e| e.to_string())?;
            pem.extend(std::fs::read(key).map_err(|e| e.to_string())?);
            builder = builder.identity(reqwest::Identity::from_pem(&pem).map_err(|e| e.to_string())?);
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        Ok(Self { client, base: base.to_string(), token: credentials.token.map(str::to_string) })
    }

    /// Sends one request; `Err` when no HTTP answer came (a refused handshake, say).
    pub async fn call(&self, method: &str, path: &str, body: Option<&str>) -> Result<Answer, String> {
        self.call_with(method, path, body, &[]).await
    }

    /// [`Caller::call`] with more headers (which replace the caller's own credential).
    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.header("Content-Type", "application/json").body(body.to_string());
        }
        let response = request.send().await.map_err(|error| format!("{error:?}"))?;
        let status = response.status().as_u16();
        let version = format!("{:?}", response.version());
        let server_certificate = response
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|info| info.peer_certificate().map(<[u8]>::to_vec));
        let body = response.text().await.map_err(|e| e.to_string())?;
        Ok(Answer { status, body, server_certificate, version })
    }
}
