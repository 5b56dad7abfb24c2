//! fleetd installs its signal handlers before anything starts, so that an early signal does
//! not end it without its shutdown: what it does before its components run (a member
//! reaching etcd, a pull agent joining its manager, each retried while they cannot be
//! reached) must end on SIGTERM too, not leave the signal unread until systemd's SIGKILL.

use std::process::Child;
use std::time::{Duration, Instant};

use fleet_e2e::pki::ManagerPki;
use fleet_e2e::pull::PullFleetd;
use fleet_testkit::free_port;

/// A fleetd killed when dropped, whatever the test's outcome.
struct NotLeftBehind(Child);

impl Drop for NotLeftBehind {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `child` once `log()` shows `trying`, and expects it to end by itself
/// with success and `said` in its log within 20 s.
fn ends_on_sigterm_while(child: Child, log: impl Fn() -> String, trying: &str, said: &str) {
    let mut child = NotLeftBehind(child);
    let child = &mut child.0;
    fleet_e2e::poll_until(&format!("it logs {trying:?}"), Duration::from_secs(60), || log().contains(trying), &log);
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        if let Some(status) = child.try_wait().expect("its status") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(ended.is_some_and(|status| status.success()), "{ended:?}\n{}", log());
    assert!(log().contains(said), "{}", log());
}

#[test]
fn a_pull_fleetd_still_trying_to_join_ends_on_sigterm() {
    let pki = ManagerPki::local();
    // Nothing listens there.
    let manager_url = format!("https://localhost:{}", free_port());
    let mut pull = PullFleetd::start(&manager_url, &pki.api_ca_file, Some("not-a-token-it-gets-to-use"), None, &[]);
    let child = pull.child.take().expect("running");
    ends_on_sigterm_while(child, || pull.log(), "cannot join yet", "fleetd stopped before it joined");
}

#[test]
fn a_member_still_trying_to_reach_etcd_ends_on_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        "machine_id = early0member0001\nstate_dir = {}\nunit_manager = native\npublic_ip = 127.0.0.9\n\
         etcd_servers = http://127.0.0.1:{}\napi_listen = unix://{}\n",
        dir.path().join("state").display(),
        free_port(),
        dir.path().join("fleet.sock").display()
    );
    // A fleetd of its own configuration: an etcd member here, whose store cannot be reached.
    let mut member = PullFleetd::start_configured(dir, &config, &[], &[]);
    let child = member.child.take().expect("running");
    let log = || member.log();
    ends_on_sigterm_while(
        child,
        log,
        "cannot read the store's format yet",
        "fleetd stopped before it reached its store",
    );
}
