//! Real components for tests and benchmarks. Nothing here is a mock: [`EtcdServer`] runs
//! Debian's `etcd` binary, installing the `etcd-server` package first when it is missing;
//! [`SystemdUser`] runs a real systemd user instance in a private mount namespace.

mod etcd;
mod ports;
mod systemd;
mod tls;

pub use etcd::EtcdServer;
pub use ports::free_port;
pub use systemd::SystemdUser;
pub use tls::TestCertificates;
