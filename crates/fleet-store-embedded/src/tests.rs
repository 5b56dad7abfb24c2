use fleet_core::schedule::{Decision, UnscheduleReason};
use fleet_core::{DesiredState, MachineState, SystemdState, UnitFile, UnitState};

use super::EmbeddedRegistry;
use fleet_registry::{AgentRegistry, ApiRegistry, EngineRegistry, StateReport};

fn unit(text: &str) -> UnitFile {
    UnitFile::parse(text).unwrap()
}

fn machine(id: &str) -> MachineState {
    MachineState { id: id.into(), public_ip: "127.0.0.1".into(), ..Default::default() }
}

#[tokio::test]
async fn units_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.redb");
    {
        let registry = EmbeddedRegistry::open(&path).unwrap();
        registry
            .put_unit("a.service", &unit("[Service]\nExecStart=/bin/sleep 1000\n"), DesiredState::Launched)
            .await
            .unwrap();
        registry.register_machine(&machine("m1")).await.unwrap();
    }
    let registry = EmbeddedRegistry::open(&path).unwrap();
    let view = registry.unit("a.service").await.unwrap().unwrap();
    assert_eq!(view.hash.to_string(), "2d432f4a06608c1a8b2848b66c836793a1d48ce6");
    assert_eq!(view.desired, DesiredState::Launched);
    assert_eq!(view.current, Some(DesiredState::Inactive));
    assert_eq!(registry.machines().await.unwrap().len(), 1);
}

#[tokio::test]
async fn schedule_states_and_current_state() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let mut machine_signal = registry.machine_changes("m1");
    registry.register_machine(&machine("m1")).await.unwrap();
    let file = unit("[Service]\nExecStart=/bin/true\n");
    registry.put_unit("a.service", &file, DesiredState::Launched).await.unwrap();
    let lease = registry.acquire_leadership("m1").await.unwrap().unwrap();
    let schedule = [Decision::Schedule { unit: "a.service".into(), machine: "m1".into() }];
    machine_signal.mark_unchanged();
    registry.apply(&lease, &schedule, &[("b.service".into(), "nowhere".into())]).await.unwrap();
    assert!(machine_signal.has_changed().unwrap());
    let work = registry.machine_work("m1").await.unwrap();
    assert_eq!(work.scheduled.len(), 1);
    assert_eq!(registry.unit("a.service").await.unwrap().unwrap().current, Some(DesiredState::Inactive));

    let mut state = UnitState {
        run: None,
        name: "a.service".into(),
        machine_id: "m1".into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", "inactive", "dead"),
        launched: false,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    registry.report_states("m1", &[StateReport::Set(state.clone())]).await.unwrap();
    assert_eq!(registry.unit("a.service").await.unwrap().unwrap().current, Some(DesiredState::Loaded));
    state.launched = true;
    registry.report_states("m1", &[StateReport::Set(state)]).await.unwrap();
    let view = registry.unit("a.service").await.unwrap().unwrap();
    assert_eq!((view.current, view.machine_id.as_deref()), (Some(DesiredState::Launched), Some("m1")));

    // A second schedule of a placed unit is skipped; an unschedule from another machine too.
    let stale = [
        Decision::Schedule { unit: "a.service".into(), machine: "m2".into() },
        Decision::Unschedule {
            unit: "a.service".into(),
            machine: "m2".into(),
            reason: UnscheduleReason::MachineWentAway,
        },
    ];
    registry.apply(&lease, &stale, &[]).await.unwrap();
    assert_eq!(registry.unit("a.service").await.unwrap().unwrap().machine_id.as_deref(), Some("m1"));

    registry.unregister_machine("m1").await.unwrap();
    assert!(registry.unit_states().await.unwrap().is_empty());
    assert!(registry.machines().await.unwrap().is_empty());
}

/// A fleetd that starts again (after a crash: the store keeps its machine) drops what the
/// one before reported: a unit reported running may have stopped meanwhile, and the engine
/// waits for a machine to stop what it took off it. A pull agent announcing itself again
/// keeps its reports: it reports only changes.
#[tokio::test]
async fn a_fleetd_starting_again_drops_the_reports_of_the_one_before_and_a_pull_agent_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let registry = EmbeddedRegistry::open(&dir.path().join("fleet.redb")).unwrap();
    let running = |machine: &str| UnitState {
        run: None,
        name: "a.service".into(),
        machine_id: machine.into(),
        hash: unit("[Service]\nExecStart=/bin/true\n").hash(),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    for id in ["m1", "pulled"] {
        registry.register_machine(&machine(id)).await.unwrap();
        registry.report_states(id, &[StateReport::Set(running(id))]).await.unwrap();
    }
    registry.announce_for_agent(&machine("pulled")).await.unwrap();
    registry.register_machine(&machine("m1")).await.unwrap();
    let left: Vec<String> = registry.unit_states().await.unwrap().into_iter().map(|state| state.machine_id).collect();
    assert_eq!(left, vec!["pulled".to_string()]);
    assert_eq!(registry.machines().await.unwrap().len(), 2);
}

/// Regression: a store file truncated to 0 bytes opened as a new, empty store without a word,
/// and a single machine then stopped every unit. A file that is not a whole store is refused,
/// named, and left as it was.
#[tokio::test]
async fn a_file_that_is_not_a_whole_store_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.redb");
    {
        let registry = EmbeddedRegistry::open(&path).unwrap();
        registry
            .put_unit("a.service", &unit("[Service]\nExecStart=/bin/true\n"), DesiredState::Launched)
            .await
            .unwrap();
    }
    let whole = std::fs::read(&path).unwrap();
    for (damage, says) in [
        (Vec::new(), "is empty (0 bytes), not a whole store"),
        (b"not a database at all, just text".to_vec(), "cannot be read"),
        (whole[..whole.len().min(100)].to_vec(), "cannot be read"),
    ] {
        std::fs::write(&path, &damage).unwrap();
        let error = EmbeddedRegistry::open(&path).err().expect("refused").to_string();
        assert!(error.contains(&path.display().to_string()) && error.contains(says), "{error}");
        assert!(error.contains("restore it from a backup, or move it aside"), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), damage, "the file is left as it was");
    }
    std::fs::write(&path, &whole).unwrap();
    let registry = EmbeddedRegistry::open(&path).unwrap();
    assert!(registry.unit("a.service").await.unwrap().is_some(), "the whole store opens again");
}
