//! `fleetctl plan`, end to end on a single machine: real fleetd on the embedded store, the
//! real fleetctl. A plan says what the command would do and writes nothing; the command then
//! does what the plan said.

use std::time::Duration;

use fleet_e2e::Fleetd;

const WAIT: Duration = Duration::from_secs(20);

/// The words of the plan table's row of `unit`.
fn row_of<'a>(printed: &'a str, unit: &str) -> Vec<&'a str> {
    let row = printed.lines().find(|line| line.split_whitespace().next() == Some(unit));
    row.unwrap_or_else(|| panic!("no row of {unit}: {printed}")).split_whitespace().collect()
}

fn plan_index(printed: &str) -> String {
    let line = printed.lines().find_map(|line| line.strip_prefix("Plan index: ")).unwrap_or_default();
    line.split_whitespace().next().unwrap_or_default().to_string()
}

fn unit_files(fleet: &Fleetd) -> String {
    fleet.ok(&["list-unit-files", "--no-legend", "--fields", "unit,dstate"]).stdout
}

#[test]
fn a_plan_says_what_start_replace_and_destroy_would_do_and_writes_nothing() {
    let fleet = Fleetd::start("e2e0plans0000001", &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("planned.service");
    std::fs::write(&path, "[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    let unit = path.display().to_string();

    let planned = fleet.ok(&["plan", "start", &unit]);
    let fields = row_of(&planned.stdout, "planned.service");
    assert_eq!(fields[..3], ["planned.service", "create", "-"], "{planned:?}");
    assert_eq!(fields[3..5], ["->", "launched"], "{planned:?}");
    let machine = fields[5..].join(" ");
    assert!(machine.starts_with("- -> e2e0plan"), "placed on the one machine: {planned:?}");
    assert!(planned.stdout.contains("Plan index: "), "{planned:?}");
    assert_eq!(unit_files(&fleet), "", "a plan writes nothing");

    // The command does what the plan said, on the cluster the plan saw.
    let index = plan_index(&planned.stdout);
    fleet.ok(&["--if-unchanged", &index, "start", &unit]);
    fleet.wait_until("the unit runs", WAIT, |f| {
        f.unit_rows() == vec![("planned.service".into(), "active".into(), "running".into())]
    });

    // New content: without --replace start keeps the cluster's (and says so); with it, the
    // plan shows the change and its diff, and still writes nothing.
    std::fs::write(&path, "[Service]\nExecStart=/bin/sleep 2000\n").unwrap();
    let kept = fleet.ok(&["plan", "start", &unit]);
    assert!(kept.stderr.contains("differs from local unit file"), "{kept:?}");
    assert!(kept.stdout.starts_with("Nothing to do"), "{kept:?}");
    let replaced = fleet.ok(&["plan", "start", "--replace", &unit]);
    assert_eq!(row_of(&replaced.stdout, "planned.service")[..4], ["planned.service", "change", "launched", "e2e0plan"]);
    assert!(replaced.stdout.contains("-ExecStart=/bin/sleep 1000"), "{replaced:?}");
    assert!(replaced.stdout.contains("+ExecStart=/bin/sleep 2000"), "{replaced:?}");
    let rollout = fleet.ok(&["plan", "rollout", &unit]);
    assert_eq!(row_of(&rollout.stdout, "planned.service")[..3], ["planned.service", "change", "launched"]);
    assert!(rollout.stdout.contains("+ExecStart=/bin/sleep 2000"), "{rollout:?}");
    assert!(fleet.ok(&["cat", "planned.service"]).stdout.contains("sleep 1000"));
    // A template's rollout, over the instances a pattern picks as `rollout start --instances`.
    let template = dir.path().join("tmpl@.service");
    std::fs::write(&template, "[Service]\nExecStart=/bin/sleep 3000\n").unwrap();
    let instance = |index: u32| dir.path().join(format!("tmpl@{index}.service")).display().to_string();
    fleet.ok(&["submit", &instance(1), &instance(2)]);
    std::fs::write(&template, "[Service]\nExecStart=/bin/sleep 3001\n").unwrap();
    let template = template.display().to_string();
    let some = fleet.ok(&["plan", "rollout", "--instances", "tmpl@1*", &template]);
    assert_eq!(row_of(&some.stdout, "tmpl@1.service")[..2], ["tmpl@1.service", "change"], "{some:?}");
    assert!(!some.stdout.contains("tmpl@2.service"), "{some:?}");
    assert!(fleet.ok(&["plan", "rollout", &template]).stdout.contains("tmpl@2.service"));
    // The order a rollout would replace them in, its canary first.
    let ordered = fleet.ok(&["plan", "rollout", "--canary", "1", "-o", "json", &template]);
    let ordered: serde_json::Value = serde_json::from_str(&ordered.stdout).unwrap();
    let order: Vec<(String, serde_json::Value, serde_json::Value)> = ordered["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|unit| (unit["name"].as_str().unwrap().to_string(), unit["order"].clone(), unit["canary"].clone()))
        .collect();
    assert_eq!(
        order,
        [("tmpl@1.service".to_string(), 1.into(), true.into()), ("tmpl@2.service".to_string(), 2.into(), false.into())]
    );
    assert!(fleet.ok(&["plan", "rollout", "--canary", "1", &template]).stdout.contains("1 (canary)"));
    let misplaced = fleet.fleetctl(&["plan", "start", "--instances", "tmpl@1*", &unit]);
    assert_eq!(misplaced.code, 2, "{misplaced:?}");
    assert!(misplaced.stderr.contains("--instances and --canary apply to plan rollout only"), "{misplaced:?}");
    fleet.ok(&["destroy", "tmpl@1.service", "tmpl@2.service"]);

    // A drain of the only machine: its unit has nowhere to go, and says so.
    let drain = fleet.ok(&["plan", "machine", "drain", "e2e0plan", "-o", "json"]);
    let plan: serde_json::Value = serde_json::from_str(&drain.stdout).unwrap();
    let stays = &plan["units"][0];
    assert_eq!((&stays["name"], &stays["action"]), (&"planned.service".into(), &"stays".into()), "{plan}");
    let reason = stays["waiting"].as_str().unwrap_or_default();
    assert!(reason.starts_with("cannot leave its draining machine"), "{plan}");
    let unknown = fleet.fleetctl(&["plan", "machine", "drain", "f00f00f0"]);
    assert_eq!(unknown.code, 1);
    assert!(unknown.stderr.contains("machine \"f00f00f0\" does not exist"), "{unknown:?}");
    assert!(fleet.ok(&["list-machines", "--no-legend"]).stdout.lines().all(|line| !line.contains("drain")));

    // A destroy, as JSON.
    let destroy = fleet.ok(&["plan", "destroy", "planned.service", "-o", "json"]);
    let plan: serde_json::Value = serde_json::from_str(&destroy.stdout).unwrap();
    let planned_unit = &plan["units"][0];
    assert_eq!((&planned_unit["name"], &planned_unit["action"]), (&"planned.service".into(), &"destroy".into()));
    assert!(planned_unit["machineBefore"].as_str().is_some_and(|id| id.starts_with("e2e0plan")), "{plan}");
    assert!(planned_unit["machine"].is_null() && planned_unit["waiting"].is_null(), "{plan}");
    assert!(plan["index"].as_u64().is_some_and(|index| index > 0), "{plan}");
    assert_eq!(unit_files(&fleet), "planned.service\tlaunched\n", "still there");

    // A plan's index is stale once the cluster changed: the command refuses and writes nothing.
    let stale = plan_index(&fleet.ok(&["plan", "stop", "planned.service"]).stdout);
    let other = dir.path().join("other.service");
    std::fs::write(&other, "[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    fleet.ok(&["submit", &other.display().to_string()]);
    let refused = fleet.fleetctl(&["--if-unchanged", &stale, "stop", "--no-block", "planned.service"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains(&format!("the cluster changed since plan index {stale}")), "{refused:?}");
    assert_eq!(unit_files(&fleet), "other.service\tinactive\nplanned.service\tlaunched\n");

    // A plan refuses what the command refuses, with its words, and the unit is left alone.
    let stop_unknown = fleet.fleetctl(&["plan", "stop", "nowhere.service"]);
    assert_eq!((stop_unknown.code, stop_unknown.stderr.as_str()), (1, "Units not found in registry\n"));
    let bad = dir.path().join("bad.service");
    std::fs::write(&bad, "[Service]\nExecStart=/bin/true\nthis is not an option\n").unwrap();
    let refused = fleet.fleetctl(&["plan", "start", &bad.display().to_string()]);
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains("bad.service: line 3: expected \"Name=Value\""), "{refused:?}");
    assert_eq!(unit_files(&fleet), "other.service\tinactive\nplanned.service\tlaunched\n");
}

/// unit → (machine before, machine after) of a plan printed as JSON.
fn planned_machines(printed: &str) -> std::collections::BTreeMap<String, (Option<String>, Option<String>)> {
    let plan: serde_json::Value = serde_json::from_str(printed).unwrap_or_else(|error| panic!("{error}: {printed}"));
    let text = |unit: &serde_json::Value, field: &str| unit[field].as_str().map(str::to_string);
    plan["units"]
        .as_array()
        .map(|units| {
            units
                .iter()
                .map(|unit| {
                    (text(unit, "name").unwrap_or_default(), (text(unit, "machineBefore"), text(unit, "machine")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// On etcd, three members: a plan made through one member is what a write through another then
/// does, for a start, a drain and a source's sync, and its index guards the write whichever
/// member takes it.
#[test]
fn on_etcd_a_plan_through_one_member_is_what_a_write_through_another_does() {
    use fleet_e2e::Cluster;
    let cluster = Cluster::start(3, |_| Vec::new());
    let dir = cluster.members[0].dir.path().to_path_buf();
    std::fs::write(dir.join("sleep@.service"), "[Service]\nExecStart=/bin/sleep 100000\n").unwrap();
    let instances = |range: std::ops::RangeInclusive<usize>| -> Vec<String> {
        range.map(|index| dir.join(format!("sleep@{index}.service")).display().to_string()).collect()
    };
    let placed = |c: &Cluster| -> std::collections::BTreeMap<String, String> {
        c.placement()
            .into_iter()
            .filter_map(|(unit, (machine, state))| Some((unit, machine.filter(|_| state == "launched")?)))
            .collect()
    };
    let first = instances(1..=3);
    let mut args = vec!["start", "--no-block"];
    args.extend(first.iter().map(String::as_str));
    cluster.members[0].ok(&args);
    cluster.wait_until("3 units launched", Duration::from_secs(30), |c| placed(c).len() == 3);

    // A start of three more, planned through the first member, written through the second.
    let more = instances(4..=6);
    let mut plan_args = vec!["plan", "start", "-o", "json"];
    plan_args.extend(more.iter().map(String::as_str));
    let printed = cluster.members[0].ok(&plan_args).stdout;
    let planned = planned_machines(&printed);
    let index = serde_json::from_str::<serde_json::Value>(&printed).unwrap()["index"].to_string();
    assert_eq!(planned.len(), 3, "{printed}");
    assert!(planned.values().all(|(before, after)| before.is_none() && after.is_some()), "{printed}");
    let mut start_args = vec!["--if-unchanged", index.as_str(), "start", "--no-block"];
    start_args.extend(more.iter().map(String::as_str));
    cluster.members[1].ok(&start_args);
    cluster.wait_until("6 units launched", Duration::from_secs(30), |c| placed(c).len() == 6);
    let now = placed(&cluster);
    for (unit, (_, after)) in &planned {
        assert_eq!(now.get(unit), after.as_ref(), "{unit}: planned {printed}, placed {now:?}");
    }

    // The same index is stale now, through any member.
    let mut stale_args = vec!["--if-unchanged", index.as_str(), "stop", "--no-block"];
    stale_args.push("sleep@1.service");
    let refused = cluster.members[2].fleetctl(&stale_args);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("the cluster changed since plan index"), "{refused:?}");

    // A drain of the third member's machine, planned through the second: where its units go.
    let drained = fleet_e2e::member_id(2);
    let printed = cluster.members[1].ok(&["plan", "machine", "drain", &drained, "-o", "json"]).stdout;
    let planned = planned_machines(&printed);
    let on_it: Vec<&String> = now.iter().filter(|(_, machine)| **machine == drained).map(|(unit, _)| unit).collect();
    assert_eq!(planned.keys().collect::<Vec<_>>(), on_it, "the plan names the machine's units: {printed}");
    assert!(
        planned.values().all(|(before, after)| before.as_deref() == Some(drained.as_str())
            && after.as_ref().is_some_and(|machine| *machine != drained)),
        "{printed}"
    );
    cluster.members[0].ok(&["machine", "drain", &drained]);
    cluster.wait_until("the drained machine's units run elsewhere", Duration::from_secs(60), |c| {
        let now = placed(c);
        now.len() == 6 && now.values().all(|machine| *machine != drained)
    });
    // A drain lets its units go in waves: where each lands is compared as a whole (the
    // machines they went to), not unit by unit.
    let now = placed(&cluster);
    let mut landed: Vec<&String> = planned.keys().filter_map(|unit| now.get(unit)).collect();
    let mut said: Vec<&String> = planned.values().filter_map(|(_, after)| after.as_ref()).collect();
    landed.sort();
    said.sort();
    assert_eq!(landed, said, "planned {printed}, placed {now:?}");

    // A source's sync, planned through a member that need not lead (it fetches the source
    // itself), then made by the leader: the unit it changes gets the content the plan showed.
    let repo = fleet_testkit::GitRepo::new();
    let first = repo.commit(&[("units/src.service", Some("[Service]\nExecStart=/bin/sleep 800001\n"))], "first");
    let url = repo.url();
    cluster.members[0].ok(&["source", "add", "--repo", &url, "--path", "units", "--interval", "1h", "apps"]);
    let synced = |c: &Cluster, commit: &str| c.any().ok(&["source", "status", "apps"]).stdout.contains(commit);
    cluster.wait_until("the source's first sync", Duration::from_secs(30), |c| synced(c, &first));
    let second = repo.commit(&[("units/src.service", Some("[Service]\nExecStart=/bin/sleep 800002\n"))], "second");
    for member in &cluster.members {
        let printed = member.ok(&["plan", "source", "sync", "apps"]).stdout;
        assert!(printed.contains(&format!("Source apps at commit {}", &second[..12])), "{printed}");
        assert_eq!(row_of(&printed, "src.service")[1], "change", "{printed}");
        assert!(printed.contains("+ExecStart=/bin/sleep 800002"), "{printed}");
    }
    assert!(synced(&cluster, &first), "the plans synced nothing");
    cluster.members[1].ok(&["source", "sync", "apps"]);
    cluster.wait_until("the second commit synced", Duration::from_secs(30), |c| synced(c, &second));
    assert!(cluster.members[2].ok(&["cat", "src.service"]).stdout.contains("800002"));

    // A source planned and then removed: each member lets go of its clone at its next plan,
    // whether or not it leads (a member that only plans runs no syncer that would).
    // (Its first sync awaited: a fetch under way is not interrupted, and the next is in an hour.)
    cluster.members[0].ok(&["source", "add", "--repo", &url, "--path", "units", "--interval", "1h", "other"]);
    cluster.wait_until("the other source's first sync", Duration::from_secs(30), |c| {
        c.any().ok(&["source", "status", "other"]).stdout.contains(&second)
    });
    let clone_of = |member: &fleet_e2e::Fleetd| member.state_dir().join("sources").join("other");
    for member in &cluster.members {
        member.ok(&["plan", "source", "sync", "other"]);
        assert!(clone_of(member).is_dir(), "the plan fetched into {}", clone_of(member).display());
    }
    cluster.members[0].ok(&["source", "remove", "other"]);
    for member in &cluster.members {
        member.ok(&["plan", "source", "sync", "apps"]);
        assert!(!clone_of(member).exists(), "{} is gone", clone_of(member).display());
    }
}

/// A source's sync, planned against a real repository: what the sync would create, change and
/// destroy (with the diff), and the file it could not read, before anything is written; then
/// the sync does what the plan said, where the plan said.
#[test]
fn a_plan_of_a_source_sync_is_what_the_sync_then_does() {
    const HELLO: &str = "[Service]\nExecStart=/bin/sleep 700001\n";
    const HELLO_2: &str = "[Service]\nExecStart=/bin/sleep 700002\n";
    const WEB: &str = "[Service]\nExecStart=/bin/sleep 700%i\n";
    let fleet = Fleetd::start("e2e0plans0000003", &[]);
    let repo = fleet_testkit::GitRepo::new();
    let first = repo.commit(
        &[
            ("units/hello.service", Some(HELLO)),
            ("units/web@.service", Some(WEB)),
            ("units/fleet-desired.conf", Some("web@{1..2}.service = launched\n")),
        ],
        "first",
    );
    let url = repo.url();
    // Synced when added, then not again for an hour unless asked: the plan comes first.
    fleet.ok(&["source", "add", "--repo", &url, "--branch", "main", "--path", "units", "--interval", "1h", "apps"]);
    let synced = |fleet: &Fleetd, commit: &str| fleet.ok(&["source", "status", "apps"]).stdout.contains(commit);
    fleet.wait_until("the source's first sync", WAIT, |f| synced(f, &first));
    fleet.wait_until("its units run", WAIT, |f| f.unit_rows().len() == 3);
    let before = unit_files(&fleet);

    let second = repo.commit(
        &[
            ("units/hello.service", Some(HELLO_2)),
            ("units/new.service", Some(HELLO)),
            ("units/fleet-desired.conf", Some("web@1.service = launched\n")),
            ("units/bad.service", Some("[Service]\nExecStart=/bin/true\nnot an option\n")),
        ],
        "second",
    );
    let printed = fleet.ok(&["plan", "source", "sync", "apps", "-o", "json"]).stdout;
    let plan: serde_json::Value = serde_json::from_str(&printed).unwrap_or_else(|error| panic!("{error}: {printed}"));
    assert_eq!(plan["source"]["commit"], second.as_str(), "{printed}");
    let problems = plan["source"]["problems"].to_string();
    assert!(problems.contains("units/bad.service: line 3"), "{printed}");
    let actions: std::collections::BTreeMap<String, String> = plan["units"]
        .as_array()
        .map(|units| {
            let text = |unit: &serde_json::Value, field: &str| unit[field].as_str().unwrap_or_default().to_string();
            units.iter().map(|unit| (text(unit, "name"), text(unit, "action"))).collect()
        })
        .unwrap_or_default();
    let expected: std::collections::BTreeMap<String, String> =
        [("hello.service", "change"), ("new.service", "create"), ("web@2.service", "destroy")]
            .into_iter()
            .map(|(unit, action)| (unit.to_string(), action.to_string()))
            .collect();
    assert_eq!(actions, expected, "{printed}");
    let table = fleet.ok(&["plan", "source", "sync", "apps"]).stdout;
    assert!(table.contains(&format!("Source apps at commit {}", &second[..12])), "{table}");
    assert!(
        table.contains("-ExecStart=/bin/sleep 700001") && table.contains("+ExecStart=/bin/sleep 700002"),
        "{table}"
    );
    assert!(table.contains("Problem (its unit keeps what it has): units/bad.service"), "{table}");
    assert_eq!(unit_files(&fleet), before, "a plan writes nothing");
    assert!(synced(&fleet, &first), "and syncs nothing");

    // The sync does what the plan said: the same units, on the machines it named.
    let planned = planned_machines(&printed);
    fleet.ok(&["source", "sync", "apps"]);
    fleet.wait_until("the second commit synced", WAIT, |f| synced(f, &second));
    fleet.wait_until("the sync applied", WAIT, |f| {
        let rows: Vec<String> = f.unit_rows().into_iter().map(|(unit, _, _)| unit).collect();
        rows == ["hello.service", "new.service", "web@1.service"]
    });
    assert!(fleet.ok(&["cat", "hello.service"]).stdout.contains("700002"));
    let placed: std::collections::BTreeMap<String, Option<String>> = fleet
        .api_units()
        .iter()
        .map(|unit| {
            (unit["name"].as_str().unwrap_or_default().to_string(), unit["machineID"].as_str().map(str::to_string))
        })
        .collect();
    for (unit, (_, after)) in planned.iter().filter(|(unit, _)| *unit != "web@2.service") {
        assert_eq!(placed.get(unit).cloned().flatten(), after.clone(), "{unit}: {printed}");
    }

    // Nothing is left to sync, and a source that does not exist is not planned.
    let again = fleet.ok(&["plan", "source", "sync", "apps"]).stdout;
    assert!(again.contains("Nothing would change."), "{again}");
    let missing = fleet.fleetctl(&["plan", "source", "sync", "nosuch"]);
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stderr.contains("source does not exist"), "{missing:?}");
}
