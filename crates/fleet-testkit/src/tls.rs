//! A throwaway certificate authority, with a server certificate for 127.0.0.1 and a client
//! certificate, made by the `openssl` command line for tests of TLS to etcd.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TestCertificates {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
    assert!(
        output.status.success(),
        "openssl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

const KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// Makes `<name>.pem` and `<name>-key.pem`, signed by the CA, with the given extensions.
fn issue(dir: &Path, name: &str, extensions: &str) {
    let (key, csr, cert, ext) =
        (format!("{name}-key.pem"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
    std::fs::write(dir.join(&ext), extensions).expect("writing the extensions file");
    let mut request = vec!["req", "-nodes", "-keyout", &key, "-out", &csr, "-subj"];
    let subject = format!("/CN=fleet-test-{name}");
    request.push(&subject);
    request.extend(KEY);
    openssl(dir, &request);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

impl TestCertificates {
    /// Generates the CA and both certificates in `dir`.
    pub fn generate(dir: &Path) -> Self {
        let mut ca = vec!["req", "-x509", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2"];
        ca.extend(["-subj", "/CN=fleet-test-ca"]);
        ca.extend(KEY);
        openssl(dir, &ca);
        issue(dir, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
        issue(dir, "client", "extendedKeyUsage=clientAuth\n");
        Self { dir: dir.to_path_buf() }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server-key.pem")
    }
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client-key.pem")
    }
}
