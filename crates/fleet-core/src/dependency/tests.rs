use super::*;
use crate::UnitFile;
use proptest::prelude::*;

fn of(name: &str, x_fleet: &str) -> Result<Dependencies, String> {
    let file = UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).expect("a unit");
    dependencies_of(name, file.options())
}

fn item(kind: Kind, pattern: &str, count: u32) -> Dependency {
    Dependency { kind, pattern: pattern.to_string(), count }
}

#[test]
fn items_are_names_or_patterns_with_a_count_on_several_lines() {
    let read = of(
        "app.service",
        "Requires=db.service cache@*.service:2\nAfter=migrate.service\nRequires=db.service\nRequiresGrace=30s\n",
    )
    .expect("read");
    assert_eq!(
        read.items,
        [
            item(Kind::Requires, "cache@*.service", 2),
            item(Kind::Requires, "db.service", 1),
            item(Kind::After, "migrate.service", 1),
        ]
    );
    assert_eq!(read.grace, Some(Duration::from_secs(30)));
    assert_eq!(of("app.service", ""), Ok(Dependencies::default()));
    let colon = of("app.service", "After=dev-disk:x.service\n").expect("a name may hold a colon");
    assert_eq!(colon.items, [item(Kind::After, "dev-disk:x.service", 1)]);
    assert_eq!(of("app.service", "Requires=db.service\nRequiresGrace=0\n").expect("read").grace, None);
}

#[test]
fn a_bad_item_is_refused_naming_the_option_and_the_value() {
    let refused = |name: &str, x_fleet: &str, says: &str| {
        let error = of(name, x_fleet).expect_err("refused");
        assert!(error.contains(says), "{x_fleet:?}: {error}");
    };
    refused(
        "app.service",
        "Requires=db@*.service:0\n",
        "invalid value \"db@*.service:0\" for [X-Fleet] Requires: a count from 1 to 1000",
    );
    refused("app.service", "Requires=db@*.service:5000\n", "a count from 1 to 1000");
    refused("app.service", "Requires=db.service:2\n", "a count needs a pattern over instances");
    refused("app.service", "After=db\n", "invalid value \"db\" for [X-Fleet] After");
    refused("app.service", "Requires=db[.service\n", "not a name or a pattern");
    refused("app@1.service", "Requires=app@*.service\n", "it names app@1.service itself");
    refused("app.service", "RequiresGrace=30s\n", "RequiresGrace= needs a Requires=");
    refused("app.service", "Requires=db.service\nRequiresGrace=soon\n", "for [X-Fleet] RequiresGrace");
    let many: String = (0..65).map(|n| format!("Requires=db{n}.service\n")).collect();
    refused("app.service", &many, "at most 64 items");
}

/// How the units of `cluster` that `item` matches stand.
fn matching<'a>(cluster: &'a [(String, Standing)], item: &Dependency) -> Vec<(&'a str, &'a Standing)> {
    let glob = Glob::new(&item.pattern).expect("a pattern");
    cluster.iter().filter(|(name, _)| glob.matches(name)).map(|(name, standing)| (name.as_str(), standing)).collect()
}

#[test]
fn a_unit_waits_for_the_first_item_not_met_and_says_how_it_stands() {
    let dependencies = of("app.service", "Requires=db.service cache@*.service:2\nAfter=migrate.service\n").unwrap();
    let inactive = Standing::Down("inactive on 3f2a1b0c".into());
    let mut cluster: Vec<(String, Standing)> = vec![
        ("db.service".into(), inactive),
        ("cache@1.service".into(), Standing::Up),
        ("cache@2.service".into(), Standing::Finished),
        ("migrate.service".into(), Standing::Finished),
    ];
    let waits = |cluster: &[(String, Standing)]| waiting_for(&dependencies, |item| matching(cluster, item));
    assert_eq!(
        waits(&cluster).as_deref(),
        Some("waiting for 2 of cache@*.service up: 1"),
        "items in order (the cache pattern sorts first); a finished unit is not up"
    );
    cluster.push(("cache@3.service".into(), Standing::Up));
    assert_eq!(waits(&cluster).as_deref(), Some("waiting for db.service: inactive on 3f2a1b0c"));
    cluster[0].1 = Standing::Up;
    assert_eq!(waits(&cluster), None, "After= takes a finished unit");
    cluster.remove(0);
    assert_eq!(waits(&cluster).as_deref(), Some("waiting for db.service: not in the cluster"));
}

#[test]
fn cycles_are_found_directly_and_through_patterns_and_named() {
    let units = |pairs: &[(&str, &str)]| -> BTreeMap<String, Dependencies> {
        pairs.iter().map(|(name, x_fleet)| (name.to_string(), of(name, x_fleet).unwrap())).collect()
    };
    assert_eq!(
        find_cycle(&units(&[("a.service", "Requires=b.service\n"), ("b.service", "After=a.service\n")])),
        Some(vec!["a.service".to_string(), "b.service".to_string(), "a.service".to_string()])
    );
    let through = units(&[
        ("web@1.service", "Requires=api@*.service\n"),
        ("api@1.service", "Requires=db.service\n"),
        ("db.service", "After=web@*.service:1\n"),
    ]);
    assert_eq!(find_cycle(&through).map(|cycle| cycle.len()), Some(4), "{:?}", find_cycle(&through));
    let chain = units(&[("web@1.service", "Requires=api@*.service\n"), ("api@1.service", "Requires=db.service\n")]);
    assert_eq!(find_cycle(&chain), None);
}

/// Whether `units` has a cycle, by brute force: some unit reaches itself.
fn reaches_itself(edges: &[Vec<usize>]) -> bool {
    (0..edges.len()).any(|start| {
        let mut seen = vec![false; edges.len()];
        let mut stack: Vec<usize> = edges[start].clone();
        while let Some(node) = stack.pop() {
            if node == start {
                return true;
            }
            if !std::mem::replace(&mut seen[node], true) {
                stack.extend(&edges[node]);
            }
        }
        false
    })
}

proptest! {
    #[test]
    fn a_cycle_is_found_exactly_when_there_is_one(edges in proptest::collection::vec(proptest::collection::vec(0..8usize, 0..3), 1..8)) {
        let count = edges.len();
        let edges: Vec<Vec<usize>> =
            edges.into_iter().enumerate().map(|(from, to)| to.into_iter().filter(|to| *to < count && *to != from).collect()).collect();
        let units: BTreeMap<String, Dependencies> = edges
            .iter()
            .enumerate()
            .map(|(from, to)| {
                let items = to.iter().map(|to| item(Kind::Requires, &format!("u{to}.service"), 1)).collect();
                (format!("u{from}.service"), Dependencies { items, ..Dependencies::default() })
            })
            .collect();
        let found = find_cycle(&units);
        prop_assert_eq!(found.is_some(), reaches_itself(&edges), "{:?}", found);
        if let Some(cycle) = found {
            prop_assert_eq!(cycle.first(), cycle.last());
            for pair in cycle.windows(2) {
                let from: usize = pair[0].trim_start_matches('u').trim_end_matches(".service").parse().unwrap();
                let to: usize = pair[1].trim_start_matches('u').trim_end_matches(".service").parse().unwrap();
                prop_assert!(edges[from].contains(&to), "{} requires {}", pair[0], pair[1]);
            }
        }
    }
}

#[test]
fn a_short_line_names_every_item_the_grace_and_a_change_other_than_restart() {
    assert_eq!(Dependencies::default().short(), "-");
    let dependencies = of(
        "app.service",
        "Requires=db@*.service:2 cache.service\nAfter=migrate.service\nRequiresGrace=30s\nRequiresChange=none",
    )
    .expect("dependencies");
    assert_eq!(dependencies.short(), "cache.service db@*.service:2 after:migrate.service (grace 30s, none)");
    assert_eq!(dependencies.written(Kind::Requires), ["cache.service", "db@*.service:2"]);
}

fn on_change(text: &str, waits: bool) -> Result<crate::required_places::OnChange, String> {
    let file = UnitFile::parse(text).expect("a unit file");
    on_change_of(file.options(), waits)
}

#[test]
fn requires_change_is_read_and_checked() {
    use crate::required_places::OnChange;
    assert_eq!(on_change("[Service]\nExecStart=/bin/true\n", false), Ok(OnChange::Restart));
    assert_eq!(on_change("[X-Fleet]\nRequiresChange=none\n", true), Ok(OnChange::None));
    assert_eq!(
        on_change("[Service]\nExecReload=/bin/kill -HUP $MAINPID\n[X-Fleet]\nRequiresChange=reload\n", true),
        Ok(OnChange::Reload)
    );
    let error = on_change("[X-Fleet]\nRequiresChange=reload\n", true).expect_err("no ExecReload=");
    assert!(error.contains("ExecReload="), "{error}");
    let error = on_change("[X-Fleet]\nRequiresChange=bounce\n", true).expect_err("a bad value");
    assert!(error.contains("\"bounce\"") && error.contains("restart, reload or none"), "{error}");
    let error = on_change("[X-Fleet]\nRequiresChange=none\n", false).expect_err("nothing to follow");
    assert!(error.contains("Requires="), "{error}");
}

#[test]
fn an_instance_names_its_own_counterpart_through_its_specifiers() {
    let dependencies = of("app@3.service", "Requires=db@%i.service\nAfter=%p-cache.service").expect("dependencies");
    assert_eq!(dependencies.written(Kind::Requires), ["db@3.service"]);
    assert_eq!(dependencies.written(Kind::After), ["app-cache.service"]);
    let template = of("app@.service", "Requires=db@%i.service").expect("the template's own");
    assert_eq!(template.written(Kind::Requires), ["db@.service"]);
}
