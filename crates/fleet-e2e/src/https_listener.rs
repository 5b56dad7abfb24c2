//! An HTTPS listener for a benchmark's fleetd (its own CA and server certificate) and the
//! token files its callers read: what followers of the API reach a fleetd through.

use std::path::{Path, PathBuf};

use crate::pki::Authority;

/// The HTTPS listener: its certificates and the config lines.
pub struct Listener {
    dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    port: u16,
    cert: PathBuf,
    key: PathBuf,
}

impl Default for Listener {
    fn default() -> Self {
        Self::new()
    }
}

impl Listener {
    /// A listener on a free port of 127.0.0.1, with a new CA and server certificate.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a directory for the certificates");
        let ca = Authority::new("bench CA");
        let ca_file = ca.write(&dir.path().join("ca.pem"));
        let server = ca.server(dir.path(), "server");
        let port = fleet_testkit::free_port();
        Self { dir, ca_file, port, cert: server.cert, key: server.key }
    }

    /// fleet.conf lines for the engine fleetd: the harness's socket and this listener.
    pub fn config(&self) -> Vec<(String, String)> {
        vec![
            ("api_listen".into(), format!("unix://{{socket}},https://127.0.0.1:{}", self.port)),
            ("api_tls_cert_file".into(), self.cert.display().to_string()),
            ("api_tls_key_file".into(), self.key.display().to_string()),
        ]
    }

    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Writes `text` to a new file only its owner may read.
pub fn write_private(path: &Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).expect("a token file");
    file.write_all(text.as_bytes()).expect("write the token");
}
