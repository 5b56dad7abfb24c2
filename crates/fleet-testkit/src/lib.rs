//! Real components for tests and benchmarks. Nothing here is a mock: [`EtcdServer`] runs
//! Debian's `etcd` binary, installing the `etcd-server` package first when it is missing.

mod etcd;
mod ports;
mod tls;

pub use etcd::EtcdServer;
pub use ports::free_port;
pub use tls::TestCertificates;
