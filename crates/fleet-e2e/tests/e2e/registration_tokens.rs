//! Registration tokens (what pull agents will join with) through fleetctl and the API: made
//! and shown once by an administrator, listed without the token, bad requests refused with
//! nothing stored, revoked.

use fleet_e2e::Fleetd;

#[test]
fn registration_tokens_are_made_listed_refused_and_revoked() {
    let fleetd = Fleetd::start("e2e0registration", &[]);
    let made = fleetd.ok(&[
        "registration-token",
        "create",
        "--ttl",
        "24h",
        "--max-uses",
        "3",
        "--metadata",
        "rack=r1,zone=a",
        "rack1",
    ]);
    let token = made.stdout.trim();
    assert!(token.starts_with("fleetreg_") && token.len() == 52, "{made:?}");
    assert!(made.stderr.contains("shown only now"), "{made:?}");
    fleetd.ok(&["registration-token", "create", "forever"]);

    let listed = fleetd.ok(&["registration-token", "list"]).stdout;
    let rack1 = listed.lines().find(|line| line.starts_with("rack1")).expect("rack1 listed");
    assert!(rack1.contains("0/3") && rack1.contains("rack=r1,zone=a"), "{listed}");
    assert!(!listed.contains(token), "the token is shown only at creation");

    let again = fleetd.fleetctl(&["registration-token", "create", "rack1"]);
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("409"), "{again:?}");
    for body in [
        r#"{"name":"zero","maxUses":0}"#,
        r#"{"name":"bad-meta","metadata":{"a,b":"c"}}"#,
        r#"{"name":"bad-ttl","ttlSeconds":0}"#,
        r#"{"name":"has space"}"#,
        r#"{"name":"x","surprise":1}"#,
    ] {
        let answer = fleetd.api("POST", "/fleet/v1/registration-tokens", body);
        assert!(answer.starts_with("HTTP/1.0 400") || answer.starts_with("HTTP/1.1 400"), "{body}: {answer}");
    }
    let names: Vec<String> = fleetd
        .ok(&["registration-token", "list", "--no-legend"])
        .stdout
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect();
    assert_eq!(names, vec!["forever", "rack1"], "refused requests stored nothing");

    fleetd.ok(&["registration-token", "create", "doomed"]);
    fleetd.ok(&["registration-token", "revoke", "doomed"]);
    let gone = fleetd.fleetctl(&["registration-token", "revoke", "doomed"]);
    assert_ne!(gone.code, 0);
    assert!(gone.stderr.contains("does not exist"), "{gone:?}");
}
