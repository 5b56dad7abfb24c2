//! Regressions for what hostile units, hostile requests and resource exhaustion did to a
//! single-machine fleet: real fleetd and fleetctl, the native supervisor, the embedded store.

use std::time::Duration;

use fleet_e2e::{Fleetd, write_unit};

const WAIT: Duration = Duration::from_secs(20);

/// A time span too large for a `Duration` killed the agent task while the lease lived on.
/// Now it is refused at submission with the directive named, and nothing is stored.
#[test]
fn a_time_span_that_does_not_fit_is_refused_at_submission() {
    let fleet = Fleetd::start("e2e0hostile00001", &[]);
    for directive in ["TimeoutStartSec", "RestartSec", "TimeoutStopSec"] {
        let text = format!("[Service]\nExecStart=/bin/sleep 1000\n{directive}=99999999999999999999999\n");
        let path = write_unit(fleet.dir.path(), "huge.service", &text);
        let refused = fleet.fleetctl(&["start", "--no-block", &path]);
        assert_ne!(refused.code, 0, "{refused:?}");
        assert!(
            refused.stderr.contains(&format!("invalid value \"99999999999999999999999\" for {directive}=")),
            "{refused:?}"
        );
    }
    assert_eq!(fleet.ok(&["list-unit-files", "--no-legend"]).stdout, "", "nothing was stored");
    let fine = write_unit(fleet.dir.path(), "fine.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    fleet.ok(&["start", &fine]);
    fleet.wait_until("the agent still runs units", WAIT, |f| {
        f.unit_rows() == vec![("fine.service".into(), "active".into(), "running".into())]
    });
    assert!(!fleet.log().contains("panicked"), "{}", fleet.log());
}
