//! The scheduling behaviour users rely on, checked the way the original's functional tests
//! did (compat.md §8): several real fleetds on one real etcd, driven with fleetctl and the
//! API, observed through list-units/list-unit-files and the unit processes themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_e2e::{Cluster, Fleetd, member_id, unit_processes, write_unit};

const WAIT: Duration = Duration::from_secs(30);
const BODY: &str = "[Service]\nExecStart=/bin/sleep 100000\n";

/// A cluster and a scratch directory for unit files.
struct Suite {
    cluster: Cluster,
    dir: PathBuf,
}

impl Suite {
    fn start(size: usize) -> Self {
        let cluster = Cluster::start(size, |_| Vec::new());
        let dir = cluster.members[0].dir.path().join("units");
        std::fs::create_dir_all(&dir).unwrap();
        Self { cluster, dir }
    }

    /// Writes a unit running `sleep` with `x_fleet` as its `[X-Fleet]` section; returns its path.
    fn unit(&self, name: &str, x_fleet: &str) -> String {
        let text = if x_fleet.is_empty() { BODY.to_string() } else { format!("{BODY}\n[X-Fleet]\n{x_fleet}\n") };
        write_unit(&self.dir, name, &text)
    }

    fn ctl(&self) -> &Fleetd {
        self.cluster.any()
    }

    fn ok(&self, args: &[&str]) -> String {
        self.ctl().ok(args).stdout
    }

    /// unit → machine ID, for units running (active) somewhere, from list-units; global units
    /// appear once per machine, so this keeps non-global units only.
    fn active(&self) -> BTreeMap<String, String> {
        self.active_rows().into_iter().filter(|(unit, _)| !unit.starts_with("global")).collect()
    }

    /// (unit, machine ID) for every active row of list-units.
    fn active_rows(&self) -> Vec<(String, String)> {
        self.ok(&["list-units", "--no-legend", "--full", "--fields", "unit,machine,active"])
            .lines()
            .filter_map(|line| {
                let cells = cells(line);
                let machine = cells.get(1)?.split('/').next()?.to_string();
                (cells.get(2) == Some(&"active")).then(|| (cells[0].to_string(), machine))
            })
            .collect()
    }

    /// unit → the engine's reason for not placing it, from `list-unit-files --fields unit,reason`.
    fn reasons(&self) -> BTreeMap<String, String> {
        self.ok(&["list-unit-files", "--no-legend", "--fields", "unit,reason"])
            .lines()
            .filter_map(|line| match cells(line)[..] {
                [unit, reason] if reason != "-" => Some((unit.to_string(), reason.to_string())),
                _ => None,
            })
            .collect()
    }

    fn unit_files(&self) -> Vec<String> {
        self.ok(&["list-unit-files", "--no-legend", "--fields", "unit"]).lines().map(str::to_string).collect()
    }

    fn wait_until(&self, what: &str, mut check: impl FnMut(&Self) -> bool) {
        self.cluster.wait_until(what, WAIT, |_| check(self));
    }

    /// Whether member `index` runs exactly `count` unit processes.
    fn runs(&self, index: usize, count: usize) -> bool {
        unit_processes(&self.cluster.members[index].state_dir()).len() == count
    }
}

/// The cells of a table row: columns are separated by runs of tabs.
fn cells(line: &str) -> Vec<&str> {
    line.split('\t').filter(|cell| !cell.is_empty()).collect()
}

/// A table with each run of tabs turned into one tab.
fn normalised(table: &str) -> String {
    table.lines().map(|line| cells(line).join("\t") + "\n").collect()
}

fn distinct(machines: impl IntoIterator<Item = String>) -> usize {
    machines.into_iter().collect::<BTreeSet<_>>().len()
}

#[test]
fn conflicts_keep_units_apart_both_ways_and_the_rest_wait_with_a_reason() {
    let suite = Suite::start(3);
    // TestScheduleConflicts: five units conflicting by glob, three machines.
    let conflicting: Vec<String> =
        (0..5).map(|n| suite.unit(&format!("conflict.{n}.service"), "Conflicts=conflict.*.service")).collect();
    let mut args = vec!["start", "--no-block"];
    args.extend(conflicting.iter().map(String::as_str));
    suite.ok(&args);
    suite.wait_until("three conflicting units active", |s| s.active().len() == 3);
    let active = suite.active();
    assert_eq!(distinct(active.values().cloned()), 3, "{active:?}");
    assert_eq!(suite.unit_files().len(), 5);
    let reasons = suite.reasons();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for reason in reasons.values() {
        assert!(reason.starts_with("conflicts with conflict.") && reason.ends_with("on every eligible machine"));
    }
    // A blocking start of one more such unit gives up and says why.
    let sixth = suite.unit("conflict.5.service", "Conflicts=conflict.*.service");
    let ran = suite.ctl().fleetctl(&["start", "--block-attempts=2", &sixth]);
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("Unit conflict.5.service cannot be scheduled: conflicts with conflict."), "{ran:?}");
    // Destroying one running unit lets one waiting unit take its machine.
    let running = active.keys().next().unwrap().clone();
    suite.ok(&["destroy", &running]);
    suite.wait_until("a waiting unit took the freed machine", |s| s.active().len() == 3 && s.reasons().len() == 2);
    let left: Vec<String> = suite.unit_files();
    let mut destroy = vec!["destroy"];
    destroy.extend(left.iter().map(String::as_str));
    suite.ok(&destroy);
    suite.wait_until("nothing left", |s| s.unit_files().is_empty() && (0..3).all(|i| s.runs(i, 0)));

    // TestScheduleMultipleConflicts: space-separated and repeated values.
    let many = [
        suite.unit("multi.0.service", "Conflicts=multi.1.service multi.2.service"),
        suite.unit("multi.1.service", "Conflicts=multi.0.service\nConflicts=multi.2.service"),
        suite.unit("multi.2.service", "X-Conflicts=multi.0.service"),
    ];
    suite.ok(&["start", "--no-block", &many[0], &many[1], &many[2]]);
    suite.wait_until("three units on three machines", |s| s.active().len() == 3);
    assert_eq!(distinct(suite.active().into_values()), 3);

    // TestScheduleOneWayConflict: only one side names the other, both sides are kept apart.
    // Both units may only use member 0.
    let shy = suite.unit("shy.service", "Conflicts=hello.service\nMachineMetadata=member=0");
    let hello = suite.unit("hello.service", "MachineMetadata=member=0");
    suite.ok(&["start", &shy]);
    let ran = suite.ctl().fleetctl(&["start", "--block-attempts=3", &hello]);
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(suite.reasons()["hello.service"], "conflicts with shy.service on every eligible machine");
    suite.ok(&["destroy", "shy.service"]);
    suite.wait_until("hello runs once shy is gone", |s| s.active().get("hello.service") == Some(&member_id(0)));
    assert!(!suite.reasons().contains_key("hello.service"), "the reason is cleared once placed");
}

#[test]
fn machine_of_followers_stay_with_their_leader_and_move_with_it() {
    let mut suite = Suite::start(3);
    // TestScheduleMachineOf: three ping/pong pairs started without waiting.
    let mut args = vec!["start".to_string(), "--no-block".to_string()];
    for n in 0..3 {
        args.push(suite.unit(&format!("ping.{n}.service"), ""));
        args.push(suite.unit(&format!("pong.{n}.service"), &format!("MachineOf=ping.{n}.service")));
    }
    // A chain: tail follows middle, which follows head.
    args.push(suite.unit("chain-head.service", ""));
    args.push(suite.unit("chain-middle.service", "MachineOf=chain-head.service"));
    args.push(suite.unit("chain-tail.service", "X-ConditionMachineOf=chain-middle.service"));
    // A follower of a unit that does not exist waits and says why.
    args.push(suite.unit("lonely.service", "MachineOf=db.service"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    suite.ok(&args);
    assert_eq!(suite.unit_files().len(), 10, "every unit file is listed at once");
    suite.wait_until("nine units active", |s| s.active().len() == 9);
    let active = suite.active();
    for n in 0..3 {
        assert_eq!(active[&format!("ping.{n}.service")], active[&format!("pong.{n}.service")], "{active:?}");
    }
    assert_eq!(active["chain-head.service"], active["chain-middle.service"]);
    assert_eq!(active["chain-head.service"], active["chain-tail.service"]);
    assert_eq!(suite.reasons()["lonely.service"], "MachineOf db.service, which is not scheduled");

    // Stopping fleetd where ping.1 runs moves ping.1 and pong.1 together; nothing else moves.
    let host = member_id_index(&active["ping.1.service"]);
    suite.cluster.members[host].stop_with(libc::SIGTERM);
    suite.wait_until("ping.1 and pong.1 run elsewhere", |s| {
        let now = s.active();
        now.len() == 9 && now.values().all(|machine| *machine != member_id(host))
    });
    let after = suite.active();
    assert_eq!(after["ping.1.service"], after["pong.1.service"]);
    assert_eq!(after["chain-head.service"], after["chain-tail.service"]);
    for (unit, machine) in &active {
        if *machine != member_id(host) {
            assert_eq!(&after[unit], machine, "{unit} moved though its machine lives");
        }
    }
    // The follower of a missing unit is placed once its leader exists.
    let db = suite.unit("db.service", "");
    suite.ok(&["start", &db]);
    suite.wait_until("lonely runs with db", |s| {
        let now = s.active();
        now.contains_key("lonely.service") && now.get("lonely.service") == now.get("db.service")
    });
}

fn member_id_index(machine: &str) -> usize {
    (0..16).find(|i| member_id(*i) == machine).expect("a member's machine ID")
}

#[test]
fn replaces_takes_the_machine_and_circular_replaces_run_one_unit() {
    let suite = Suite::start(2);
    // TestScheduleReplace: replace.0 on one machine, replace.1 and replace.2 (its follower)
    // on the other; a unit replacing replace.0 takes its machine and replace.0 moves.
    let zero = suite.unit("replace.0.service", "MachineMetadata=member=0");
    suite.ok(&["start", &zero]);
    let one = suite.unit("replace.1.service", "MachineMetadata=member=1");
    let two = suite.unit("replace.2.service", "MachineOf=replace.1.service");
    suite.ok(&["start", &one, &two]);
    suite.wait_until("three units active", |s| s.active().len() == 3);
    assert_eq!(suite.active()["replace.0.service"], member_id(0));
    // replace.0 may go anywhere from now on.
    let zero = write_unit(&suite.dir, "replace.0.service", BODY);
    suite.ok(&["start", "--replace", &zero]);
    suite.wait_until("replace.0 runs again", |s| s.active().contains_key("replace.0.service"));
    let before = suite.active()["replace.0.service"].clone();
    let kick = suite.unit("replace-kick0.service", "Replaces=replace.0.service");
    suite.ok(&["start", &kick]);
    suite.wait_until("the kick unit runs where replace.0 ran, and replace.0 moved", |s| {
        let now = s.active();
        now.get("replace-kick0.service") == Some(&before)
            && now.get("replace.0.service").is_some_and(|machine| *machine != before)
    });
    let after = suite.active();
    assert_eq!(after["replace.1.service"], member_id(1), "units not replaced stay put");
    assert_eq!(after["replace.2.service"], member_id(1));
    let kicked = member_id_index(&before);
    suite.wait_until("the processes follow: the kick unit alone where replace.0 was", |s| {
        s.runs(kicked, 1) && s.runs(1 - kicked, 3)
    });

    // TestScheduleCircularReplace: two units replacing each other, two machines, one runs.
    let a = suite.unit("circle.a.service", "Replaces=circle.b.service");
    suite.ok(&["start", "--no-block", &a]);
    suite.wait_until("circle.a runs", |s| s.active().contains_key("circle.a.service"));
    let b = suite.unit("circle.b.service", "Replaces=circle.a.service");
    let ran = suite.ctl().fleetctl(&["start", "--block-attempts=3", &b]);
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("replaces circle.a.service, which replaces it in turn"), "{ran:?}");
    let launched = normalised(&suite.ok(&["list-unit-files", "--no-legend", "--fields", "unit,state"]));
    assert!(launched.contains("circle.a.service\tlaunched"), "{launched}");
    assert!(!launched.contains("circle.b.service\tlaunched"), "{launched}");
}

#[test]
fn machine_ids_templates_with_specifiers_and_runtime_metadata_pick_machines() {
    let suite = Suite::start(3);
    // TestScheduleConditionMachineID: full ID, short ID, and a template instance naming it.
    let full = suite.unit("full.service", &format!("MachineID={}", member_id(2)));
    let short = suite.unit("short.service", &format!("X-ConditionMachineID={}", &member_id(1)[..8]));
    write_unit(&suite.dir, "pin@.service", &format!("{BODY}\n[X-Fleet]\nMachineID=%i\n"));
    let pinned = suite.dir.join(format!("pin@{}.service", member_id(0))).display().to_string();
    suite.ok(&["start", &full, &short, &pinned]);
    suite.wait_until("three pinned units active", |s| s.active().len() == 3);
    let active = suite.active();
    assert_eq!(active["full.service"], member_id(2));
    assert_eq!(active["short.service"], member_id(1));
    assert_eq!(active[&format!("pin@{}.service", member_id(0))], member_id(0));
    let nowhere = suite.unit("nowhere.service", "MachineID=0123456789abcdef");
    let ran = suite.ctl().fleetctl(&["start", "--block-attempts=2", &nowhere]);
    assert!(ran.stderr.contains("no machine with ID 0123456789abcdef is available"), "{ran:?}");

    // TestTemplatesWithSpecifiersInMetadata: instances land where their instance names.
    write_unit(&suite.dir, "metadata@.service", &format!("{BODY}\n[X-Fleet]\nMachineMetadata=member=%i\n"));
    let instances: Vec<String> =
        (0..3).map(|i| suite.dir.join(format!("metadata@{i}.service")).display().to_string()).collect();
    suite.ok(&["start", &instances[0], &instances[1], &instances[2]]);
    suite.wait_until("three metadata instances active", |s| s.active().len() == 6);
    let active = suite.active();
    for i in 0..3 {
        assert_eq!(active[&format!("metadata@{i}.service")], member_id(i));
    }
    let invalid = suite.dir.join("metadata@invalid.service").display().to_string();
    let ran = suite.ctl().fleetctl(&["start", "--block-attempts=5", &invalid]);
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("no machine has metadata member=invalid"), "{ran:?}");

    // Metadata set at runtime through the API takes part, and taking it away moves the unit.
    let eu = suite.unit("eu.service", "MachineMetadata=region=eu\nMachineMetadata=region=us");
    suite.ok(&["start", "--no-block", &eu]);
    suite.wait_until("eu waits with a reason", |s| {
        s.reasons().get("eu.service").map(String::as_str) == Some("no machine has metadata region=eu or region=us")
    });
    let patch = |ops: &str| {
        let answer = suite.ctl().api("PATCH", "/fleet/v1/machines", ops);
        assert!(answer.contains(" 204 "), "{answer}");
    };
    patch(&format!(r#"[{{"op":"add","path":"/{}/metadata/region","value":"us"}}]"#, member_id(1)));
    suite.wait_until("eu runs on member 1", |s| s.active().get("eu.service") == Some(&member_id(1)));
    patch(&format!(
        r#"[{{"op":"remove","path":"/{}/metadata/region"}},{{"op":"add","path":"/{}/metadata/region","value":{{"value":"eu"}}}}]"#,
        member_id(1),
        member_id(2)
    ));
    suite.wait_until("eu moved to member 2", |s| s.active().get("eu.service") == Some(&member_id(2)));
    let machines = normalised(&suite.ok(&["list-machines", "--no-legend", "--full", "--fields", "machine,metadata"]));
    assert!(machines.contains(&format!("{}\tmember=2,region=eu", member_id(2))), "{machines}");
}

#[test]
fn global_units_run_on_every_matching_machine_and_honour_conflicts() {
    let suite = Suite::start(3);
    // TestScheduleGlobalUnits: two ordinary units, then a global unit on three machines.
    let hello = suite.unit("hello.service", "");
    let goodbye = suite.unit("goodbye.service", "");
    suite.ok(&["start", "--no-block", &hello, &goodbye]);
    let global = suite.unit("global.service", "Global=true");
    suite.ok(&["start", "--no-block", &global]);
    let global_machines = |s: &Suite, unit: &str| -> BTreeSet<String> {
        s.active_rows().into_iter().filter(|(name, _)| name == unit).map(|(_, machine)| machine).collect()
    };
    suite.wait_until("five active rows", |s| s.active_rows().len() == 5);
    assert_eq!(global_machines(&suite, "global.service"), (0..3).map(member_id).collect());
    // Restarting a global unit restarts it everywhere.
    let pids_before: BTreeSet<u32> =
        (0..3).flat_map(|i| unit_processes(&suite.cluster.members[i].state_dir())).collect();
    suite.ok(&["restart", "global.service"]);
    suite.wait_until("three global rows again", |s| global_machines(s, "global.service").len() == 3);
    let pids_after: BTreeSet<u32> =
        (0..3).flat_map(|i| unit_processes(&suite.cluster.members[i].state_dir())).collect();
    assert_eq!(pids_before.intersection(&pids_after).count(), 2, "only the ordinary units kept their processes");

    // Global units with metadata run only where it matches.
    let some = suite.unit("global-some.service", "Global=true\nMachineMetadata=member=0\nMachineMetadata=member=2");
    suite.ok(&["start", "--no-block", &some]);
    suite.wait_until("global-some runs on members 0 and 2", |s| {
        global_machines(s, "global-some.service") == [member_id(0), member_id(2)].into()
    });

    // TestScheduleGlobalConflicts: a global unit conflicting with a running global unit
    // never starts anywhere.
    let first = suite.unit("global-conflict.0.service", "Global=true\nConflicts=global-conflict.*.service");
    suite.ok(&["start", "--no-block", &first]);
    suite.wait_until("the first conflicting global unit runs everywhere", |s| {
        global_machines(s, "global-conflict.0.service").len() == 3
    });
    let second = suite.unit("global-conflict.1.service", "Global=true\nConflicts=global-conflict.*.service");
    suite.ok(&["start", "--no-block", &second]);
    // Give every agent time to act on it, then check it started nowhere.
    std::thread::sleep(Duration::from_secs(3));
    assert!(global_machines(&suite, "global-conflict.1.service").is_empty());
    assert_eq!(global_machines(&suite, "global-conflict.0.service").len(), 3);
    // A non-global unit conflicting with a global unit waits rather than evicting it.
    let loner = suite.unit("loner.service", "Conflicts=global.service");
    let ran = suite.ctl().fleetctl(&["start", "--block-attempts=3", &loner]);
    assert_eq!(ran.code, 1, "{ran:?}");
    assert_eq!(suite.reasons()["loner.service"], "conflicts with global.service on every eligible machine");
    assert_eq!(global_machines(&suite, "global.service").len(), 3);
}

#[test]
fn losing_or_rebooting_a_member_moves_only_its_units() {
    let mut suite = Suite::start(4);
    // TestDynamicClusterNewMemberUnitMigration: three mutually conflicting units on four
    // machines; stopping fleetd under one moves it to the free machine, the others stay.
    let units: Vec<String> =
        (0..3).map(|n| suite.unit(&format!("conflict.{n}.service"), "Conflicts=conflict.*.service")).collect();
    suite.ok(&["start", &units[0], &units[1], &units[2]]);
    suite.wait_until("three units active", |s| s.active().len() == 3);
    let before = suite.active();
    assert_eq!(distinct(before.values().cloned()), 3);
    let free = (0..4).find(|i| !before.values().any(|m| *m == member_id(*i))).unwrap();
    let (moved, host) = before.iter().next().map(|(u, m)| (u.clone(), member_id_index(m))).unwrap();
    suite.cluster.members[host].stop_with(libc::SIGTERM);
    suite.wait_until("the unit moved to the free machine", |s| s.active().get(&moved) == Some(&member_id(free)));
    let after = suite.active();
    for (unit, machine) in &before {
        if *unit != moved {
            assert_eq!(&after[unit], machine, "{unit} moved though its machine lives");
        }
    }

    // TestDynamicClusterMemberReboot: with every machine taken, a member that goes away and
    // comes back takes its unit back and nothing else moves.
    let busy = suite.active();
    let rebooted = member_id_index(&busy["conflict.2.service"]);
    suite.cluster.members[rebooted].stop_with(libc::SIGTERM);
    suite.wait_until("conflict.2 waits for a machine", |s| {
        s.reasons().get("conflict.2.service").is_some_and(|r| r.starts_with("conflicts with"))
    });
    suite.cluster.members[rebooted].launch();
    suite.wait_until("conflict.2 runs on the rebooted member", |s| {
        s.active().get("conflict.2.service") == Some(&member_id(rebooted))
    });
    let end = suite.active();
    for (unit, machine) in &busy {
        assert_eq!(&end[unit], machine, "{unit} moved");
    }
}

#[test]
fn unit_lifecycles_replace_at_each_stage_cat_and_ordering_across_the_cluster() {
    let suite = Suite::start(2);
    write_unit(
        &suite.dir,
        "hello@.service",
        "[Unit]\nDescription=hello %i\n\n[Service]\nExecStart=/bin/sleep 100000\n",
    );
    let instances: Vec<String> =
        (1..=9).map(|n| suite.dir.join(format!("hello@{n}.service")).display().to_string()).collect();
    let first_six: Vec<&str> = instances.iter().take(6).map(String::as_str).collect();
    let first_three: Vec<&str> = instances.iter().take(3).map(String::as_str).collect();
    let names = |paths: &[&str]| -> Vec<String> {
        paths.iter().map(|p| Path::new(p).file_name().unwrap().to_string_lossy().into_owned()).collect()
    };
    for round in 0..2 {
        // TestUnitSubmit: nine instances from a template on disk, destroyed, twice.
        let mut args = vec!["submit"];
        args.extend(instances.iter().map(String::as_str));
        suite.ok(&args);
        assert_eq!(suite.unit_files().len(), 9, "round {round}");
        let all = names(&instances.iter().map(String::as_str).collect::<Vec<_>>());
        let mut destroy = vec!["destroy"];
        destroy.extend(all.iter().map(String::as_str));
        suite.ok(&destroy);
        assert!(suite.unit_files().is_empty(), "round {round}");

        // TestUnitLoad: six loaded (rows in list-units), unloaded, twice.
        let mut load = vec!["load"];
        load.extend(&first_six);
        suite.ok(&load);
        suite.wait_until("six loaded rows", |s| {
            s.ok(&["list-units", "--no-legend", "--fields", "unit,load"])
                .lines()
                .filter(|l| l.contains("loaded"))
                .count()
                == 6
        });
        let six = names(&first_six);
        let mut unload = vec!["unload"];
        unload.extend(six.iter().map(String::as_str));
        suite.ok(&unload);
        suite.wait_until("no rows", |s| s.ok(&["list-units", "--no-legend"]).trim().is_empty());

        // TestUnitStart / TestUnitRestart: three started, restarted, stopped.
        let mut start = vec!["start"];
        start.extend(&first_three);
        suite.ok(&start);
        suite.wait_until("three active", |s| s.active().len() == 3);
        let three = names(&first_three);
        let mut restart = vec!["restart"];
        restart.extend(three.iter().map(String::as_str));
        suite.ok(&restart);
        suite.wait_until("three active after the restart", |s| s.active().len() == 3);
        let mut stop = vec!["stop"];
        stop.extend(three.iter().map(String::as_str));
        suite.ok(&stop);
        suite.wait_until("none active", |s| s.active().is_empty());
        let mut destroy = vec!["destroy"];
        destroy.extend(all.iter().map(String::as_str));
        suite.ok(&destroy);
        suite.wait_until("no unit processes", |s| s.runs(0, 0) && s.runs(1, 0));
    }

    // TestUnitSubmitReplace / LoadReplace / StartReplace, and TestUnitCat.
    for (stage, command) in ["submit", "load", "start"].iter().enumerate() {
        let name = format!("replace-{command}.service");
        let original = write_unit(&suite.dir, &name, "[Service]\nExecStart=/bin/sleep 100000\n");
        suite.ok(&[*command, &original]);
        assert_eq!(suite.ok(&["cat", &name]).trim(), std::fs::read_to_string(&original).unwrap().trim());
        let changed =
            format!("[Unit]\nDescription=changed at stage {stage}\n\n[Service]\nExecStart=/bin/sleep 200000\n");
        let path = write_unit(&suite.dir, &name, &changed);
        suite.ok(&[*command, "--replace", &path]);
        assert_eq!(suite.ok(&["cat", &name]).trim(), changed.trim(), "{command} --replace");
        let listed = normalised(&suite.ok(&["list-unit-files", "--no-legend", "--fields", "unit,desc"]));
        assert!(listed.contains(&format!("{name}\tchanged at stage {stage}")), "{listed}");
    }
    suite.wait_until("the replaced started unit runs its new command", |s| {
        (0..2).any(|i| {
            let state = s.cluster.members[i].state_dir();
            unit_processes(&state)
                .iter()
                .any(|pid| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.contains("200000")))
        })
    });

    // TestListUnitFilesOrder: twenty units come back sorted by name.
    let mut args = vec!["submit".to_string()];
    for n in (0..20).rev() {
        args.push(write_unit(&suite.dir, &format!("order-{n:02}.service"), BODY));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    suite.ok(&args);
    let listed: Vec<String> = suite.unit_files().into_iter().filter(|u| u.starts_with("order-")).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed.len(), 20);
    assert_eq!(listed, sorted);
}
