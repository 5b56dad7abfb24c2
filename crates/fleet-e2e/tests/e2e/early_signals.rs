//! fleetd installs its signal handlers before anything starts, so that an early signal does
//! not end it without its shutdown: what it does before its components run (a member
//! reaching etcd, a pull agent joining its manager, each retried while they cannot be
//! reached) must end on SIGTERM too, not leave the signal unread until systemd's SIGKILL.

use std::time::Duration;

use fleet_e2e::pki::ManagerPki;
use fleet_e2e::pull::PullFleetd;
use fleet_testkit::free_port;

/// Sends SIGTERM to `fleetd` once its log shows `trying`, and expects it to end by itself
/// with success and `said` in its log within 20 s.
fn ends_on_sigterm_while(fleetd: &mut PullFleetd, trying: &str, said: &str) {
    let log = || fleetd.log();
    fleet_e2e::poll_until(&format!("it logs {trying:?}"), Duration::from_secs(60), || log().contains(trying), log);
    let child = fleetd.child.as_mut().expect("running");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let ended = fleet_e2e::exit_within(child, Duration::from_secs(20));
    assert!(ended.is_some_and(|status| status.success()), "{ended:?}\n{}", fleetd.log());
    assert!(fleetd.log().contains(said), "{}", fleetd.log());
}

#[test]
fn a_pull_fleetd_still_trying_to_join_ends_on_sigterm() {
    let pki = ManagerPki::local();
    // Nothing listens there.
    let manager_url = format!("https://localhost:{}", free_port());
    let mut pull = PullFleetd::start(&manager_url, &pki.api_ca_file, Some("not-a-token-it-gets-to-use"), None, &[]);
    ends_on_sigterm_while(&mut pull, "joining the cluster failed", "fleetd stopped before it joined");
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
    ends_on_sigterm_while(
        &mut member,
        "cannot read the store's format yet",
        "fleetd stopped before it reached its store",
    );
}
