//! A real OpenSSH server on a loopback port for the `fleetctl ssh` and `--tunnel` tests, with
//! a host key and a user key made for the test, and an ssh-agent holding the user key (the
//! original fleetctl authenticates through the agent).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn run(command: &mut Command) {
    let ran = command.output().unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(ran.status.success(), "{command:?}: {}", String::from_utf8_lossy(&ran.stderr));
}

fn keygen(path: &Path) {
    run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "fleet-test", "-f"]).arg(path));
}

pub struct SshServer {
    sshd: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl SshServer {
    /// Starts sshd on 127.0.0.1 accepting the key of `agent` for any user (root here).
    pub fn start(agent: &SshAgent) -> Self {
        let dir = tempfile::tempdir().expect("sshd dir");
        keygen(&dir.path().join("host_key"));
        std::fs::copy(agent.public_key(), dir.path().join("authorized_keys")).expect("authorized_keys");
        // sshd's privilege separation needs this directory.
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let port = fleet_testkit::free_port();
        let option = |text: String| ["-o".to_string(), text];
        let options = [
            option(format!("ListenAddress=127.0.0.1:{port}")),
            option(format!("HostKey={}", dir.path().join("host_key").display())),
            option(format!("AuthorizedKeysFile={}", dir.path().join("authorized_keys").display())),
            option("StrictModes=no".into()),
            option("UsePAM=no".into()),
            option("PasswordAuthentication=no".into()),
            option("KbdInteractiveAuthentication=no".into()),
            option("PermitRootLogin=prohibit-password".into()),
            option("AllowAgentForwarding=yes".into()),
            option("AllowStreamLocalForwarding=yes".into()),
            option("AllowTcpForwarding=yes".into()),
            option("PidFile=none".into()),
            option("LogLevel=DEBUG1".into()),
        ];
        let sshd = Command::new("/usr/sbin/sshd")
            .args(["-D", "-f", "/dev/null", "-E"])
            .arg(dir.path().join("sshd.log"))
            .args(options.iter().flatten())
            .stdin(Stdio::null())
            .spawn()
            .expect("start sshd (Debian's openssh-server)");
        let server = Self { sshd, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sshd did not listen; log:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// The known-hosts line for this server.
    pub fn known_hosts_line(&self) -> String {
        let key = std::fs::read_to_string(self.dir.path().join("host_key.pub")).expect("host key");
        let mut fields = key.split_whitespace();
        let (kind, key) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        format!("[127.0.0.1]:{} {kind} {key}\n", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

pub struct SshAgent {
    agent: Child,
    dir: tempfile::TempDir,
}

impl SshAgent {
    /// An ssh-agent holding a new user key.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("agent dir");
        keygen(&dir.path().join("id_ed25519"));
        let socket = dir.path().join("agent.sock");
        let agent = Command::new("ssh-agent")
            .args(["-D", "-a"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("start ssh-agent");
        let agent = Self { agent, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "ssh-agent did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        run(Command::new("ssh-add").env("SSH_AUTH_SOCK", &socket).arg(agent.dir.path().join("id_ed25519")));
        agent
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    pub fn public_key(&self) -> PathBuf {
        self.dir.path().join("id_ed25519.pub")
    }
}

impl Drop for SshAgent {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}
