//! Real components for tests and benchmarks: [`EtcdServer`] runs Debian's `etcd` binary,
//! installing the `etcd-server` package first when it is missing; [`SystemdUser`] runs a real
//! systemd user instance in a private mount namespace; [`GitRepo`] is a git repository
//! committed to with the git command line. One fake, for where fleet's own work
//! is under test rather than a unit manager's: [`FakeUnitManager`]. And a link that stalls:
//! [`HoldingProxy`].

mod etcd;
mod eventually;
mod fake_manager;
mod git_repo;
mod holding_proxy;
mod ports;
mod seeded;
mod systemd;
mod tls;

pub use etcd::{EtcdServer, LARGE_CLUSTER_SETTINGS};
pub use eventually::{eventually, eventually_within};
pub use fake_manager::FakeUnitManager;
pub use git_repo::GitRepo;
pub use holding_proxy::HoldingProxy;
pub use ports::{connections_to, free_port};
pub use seeded::Seeded;
pub use systemd::SystemdUser;
pub use tls::TestCertificates;
