use super::*;
use crate::UnitFile;

fn hash(n: u8) -> UnitHash {
    UnitFile::parse(&format!("[Service]\nExecStart=/bin/sleep {n}\n")).unwrap().hash()
}

fn write(hash: UnitHash, desired: DesiredState, at: i64, by: &ChangedBy) -> Write<'_> {
    Write { hash, desired, at, by }
}

#[test]
fn a_new_unit_is_version_one_and_keeps_nothing() {
    let ci = ChangedBy::identity("token:ci");
    let versions = Versions::after(None, write(hash(1), DesiredState::Launched, 10, &ci), DEFAULT_KEPT);
    assert_eq!(versions.current, Some(Stamp { version: 1, at: 10, by: ci }));
    assert!(versions.past.is_empty());
}

#[test]
fn each_change_of_content_or_desired_state_keeps_the_version_before() {
    let (alice, git) = (ChangedBy::identity("cert:alice"), ChangedBy::source("app", Some("1a2b3c4d5e6f7a8b")));
    let first = Versions::after(None, write(hash(1), DesiredState::Inactive, 10, &alice), 5);
    let before = Before { hash: hash(1), desired: DesiredState::Inactive, versions: &first };
    let started = Versions::after(Some(before), write(hash(1), DesiredState::Launched, 20, &alice), 5);
    let before = Before { hash: hash(1), desired: DesiredState::Launched, versions: &started };
    let replaced = Versions::after(Some(before), write(hash(2), DesiredState::Launched, 30, &git), 5);
    assert_eq!(replaced.number(), 3);
    assert_eq!(replaced.current.as_ref().map(|stamp| &stamp.by), Some(&git));
    let past: Vec<(u64, UnitHash, DesiredState, Option<i64>)> =
        replaced.past.iter().map(|past| (past.version, past.hash, past.desired, past.at)).collect();
    assert_eq!(
        past,
        vec![(1, hash(1), DesiredState::Inactive, Some(10)), (2, hash(1), DesiredState::Launched, Some(20))]
    );
    let shown = shown(hash(2), DesiredState::Launched, &replaced);
    assert_eq!(
        shown.iter().map(|version| (version.version, version.current)).collect::<Vec<_>>(),
        vec![(1, false), (2, false), (3, true)]
    );
    assert_eq!(replaced.contents_with(hash(2)), [hash(1), hash(2)].into_iter().collect());
}

#[test]
fn a_write_that_changes_nothing_makes_no_version() {
    let ci = ChangedBy::identity("token:ci");
    let first = Versions::after(None, write(hash(1), DesiredState::Launched, 10, &ci), 5);
    let before = Before { hash: hash(1), desired: DesiredState::Launched, versions: &first };
    assert_eq!(Versions::after(Some(before), write(hash(1), DesiredState::Launched, 99, &ci), 5), first);
}

#[test]
fn only_the_newest_kept_versions_stay_and_numbers_go_on() {
    let ci = ChangedBy::identity("token:ci");
    let mut versions = Versions::after(None, write(hash(0), DesiredState::Launched, 0, &ci), 3);
    for n in 1..=10u8 {
        let before = Before { hash: hash(n - 1), desired: DesiredState::Launched, versions: &versions };
        versions = Versions::after(Some(before), write(hash(n), DesiredState::Launched, i64::from(n), &ci), 3);
    }
    assert_eq!(versions.number(), 11);
    assert_eq!(versions.past.iter().map(|past| past.version).collect::<Vec<_>>(), vec![8, 9, 10]);
    let before = Before { hash: hash(10), desired: DesiredState::Launched, versions: &versions };
    let none_kept = Versions::after(Some(before), write(hash(11), DesiredState::Launched, 11, &ci), 0);
    assert!(none_kept.past.is_empty());
    assert_eq!(none_kept.number(), 12);
}

#[test]
fn a_unit_written_before_versions_were_kept_is_version_one_of_unknown_origin() {
    let old = Versions::default();
    let ci = ChangedBy::identity("token:ci");
    let before = Before { hash: hash(1), desired: DesiredState::Launched, versions: &old };
    let after = Versions::after(Some(before), write(hash(2), DesiredState::Launched, 50, &ci), 20);
    assert_eq!(after.number(), 2);
    assert_eq!(
        after.past,
        vec![PastVersion {
            version: 1,
            hash: hash(1),
            desired: DesiredState::Launched,
            at: None,
            by: ChangedBy::UNKNOWN
        }]
    );
}

#[test]
fn who_made_a_version_reads_in_one_line_and_long_names_are_cut() {
    assert_eq!(ChangedBy::UNKNOWN.describe(), "unknown");
    assert_eq!(ChangedBy::identity("token:ci").describe(), "token:ci");
    assert_eq!(ChangedBy::source("app", Some("0123456789abcdef0123")).describe(), "source app at 0123456789ab");
    assert_eq!(ChangedBy::rollout("web", Some("app")).describe(), "rollout web of source app");
    let long = "é".repeat(LONGEST_NAME);
    let cut = ChangedBy::identity(&long).identity.unwrap();
    assert!(cut.len() <= LONGEST_NAME && cut.chars().all(|c| c == 'é'));
}

#[test]
fn the_kept_setting_is_bounded() {
    assert_eq!(parse_kept("20"), Ok(20));
    assert_eq!(parse_kept("0"), Ok(0));
    assert!(parse_kept("1001").is_err());
    assert!(parse_kept("-1").is_err());
    assert!(parse_kept("many").is_err());
}

#[test]
fn versions_read_back_as_they_were_written() {
    let ci = ChangedBy::identity("token:ci");
    let first = Versions::after(None, write(hash(1), DesiredState::Launched, 10, &ci), 5);
    let before = Before { hash: hash(1), desired: DesiredState::Launched, versions: &first };
    let second = Versions::after(Some(before), write(hash(2), DesiredState::Launched, 20, &ci), 5);
    let text = serde_json::to_string(&second).unwrap();
    assert_eq!(serde_json::from_str::<Versions>(&text).unwrap(), second);
    assert_eq!(serde_json::to_string(&Versions::default()).unwrap(), "{}");
}
