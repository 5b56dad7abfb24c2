use fleet_client::original_registry::FoundUnit;

use super::*;

fn original(name: &str, text: &str, hash: Option<&str>, machine: Option<&str>) -> OriginalUnit {
    let file = UnitFile::parse(text).map(|file| file.hash().to_string()).unwrap_or_default();
    OriginalUnit {
        name: name.into(),
        found: Ok(FoundUnit {
            desired_state: "launched".into(),
            machine: machine.map(str::to_string),
            hash: hash.map_or(file, str::to_string),
            text: text.into(),
        }),
    }
}

#[test]
fn units_are_carried_with_one_copy_of_each_content_and_the_unreadable_are_refused_here() {
    let text = "[Service]\nExecStart=/bin/sleep 1000\n";
    let registry = OriginalRegistry {
        units: vec![
            original("a@1.service", text, None, Some("m1")),
            original("a@2.service", text, None, Some("m2")),
            original("bad.service", "[Service\nExecStart=x\n", None, None),
            original("changed.service", text, Some(&"00".repeat(20)), None),
            OriginalUnit { name: "lost.service".into(), found: Err("its unit file (unit/ab) is missing".into()) },
        ],
        machines: Vec::new(),
    };
    let (request, refused) = import_request(&registry);
    assert_eq!(request.units.len(), 2);
    assert_eq!(request.contents.len(), 1, "instances share their content");
    assert_eq!(request.units[1].machine_id.as_deref(), Some("m2"));
    let why: BTreeMap<&str, &str> =
        refused.iter().map(|unit| (unit.name.as_str(), unit.reason.as_deref().unwrap_or_default())).collect();
    assert!(why["bad.service"].contains("line 1"), "{}", why["bad.service"]);
    assert!(why["changed.service"].contains("where the original keeps it as 0000"), "{}", why["changed.service"]);
    assert!(why["lost.service"].contains("missing"));
    let report = merged(ImportReport { written: false, units: Vec::new() }, refused);
    assert_eq!(
        report.units.iter().map(|unit| unit.name.as_str()).collect::<Vec<_>>(),
        ["bad.service", "changed.service", "lost.service"]
    );
}
