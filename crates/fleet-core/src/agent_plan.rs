//! The agent's decisions: from what should run on this machine and what the unit manager
//! holds, the ordered tasks that close the gap. A pure function.

use std::collections::BTreeMap;

use crate::drift::{Drift, DriftPolicy};
use crate::machine::MachineState;
use crate::required_places::{OnChange, RequiredPlace};
use crate::requirements::Requirements;
use crate::secrets::SecretPins;
use crate::state::DesiredState;
use crate::unit_file::UnitHash;

/// A unit this machine should hold, and whether it should be started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredUnit {
    pub hash: UnitHash,
    pub state: DesiredState,
    /// What to do if the unit drifts on this machine.
    pub drift: DriftPolicy,
    /// The versions of its secrets it is to run with, where not the newest.
    pub secrets: SecretPins,
    /// For a unit with `Requires=` or `After=`: where what it names runs, and what it wants
    /// when that moves.
    pub places: Places,
}

/// Where what a unit requires runs, as its file is to say, and what it wants when that moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Places {
    pub at: Vec<RequiredPlace>,
    pub on_change: OnChange,
}

/// A unit the unit manager holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedUnit {
    pub hash: UnitHash,
    pub launched: bool,
    /// The version of each secret it was given; `None`: not known (taken over from an
    /// earlier fleetd).
    pub secrets: Option<BTreeMap<String, u64>>,
    /// Where its file says what it requires runs; `None`: not known (taken over).
    pub places: Option<Vec<RequiredPlace>>,
}

impl LoadedUnit {
    /// A unit just loaded with the secrets `secrets` and the places `places`, not started yet.
    pub fn loaded(hash: UnitHash, secrets: BTreeMap<String, u64>, places: Vec<RequiredPlace>) -> Self {
        Self { hash, launched: false, secrets: Some(secrets), places: Some(places) }
    }

    /// Whether `wanted` places differ from those its file says (known ones only).
    fn places_moved(&self, wanted: &Places) -> bool {
        self.places.as_ref().is_some_and(|had| *had != wanted.at)
    }
}

/// One step, in the order the original runs them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Task {
    Unload(String),
    Load(String),
    /// Its credentials written again, the unit left running (`secret set --no-restart`, or
    /// what it requires moved).
    Refresh(String),
    /// One `daemon-reload` after all loads and unloads.
    ReloadUnitFiles,
    Stop(String),
    Start(String),
    /// Its `ExecReload=` run, after a [`Task::Refresh`] (`RequiresChange=reload`).
    Reload(String),
}

impl Task {
    fn rank(&self) -> u8 {
        match self {
            Self::Unload(_) => 1,
            Self::Load(_) | Self::Refresh(_) => 2,
            Self::ReloadUnitFiles => 3,
            Self::Stop(_) => 4,
            Self::Start(_) | Self::Reload(_) => 5,
        }
    }
}

/// The tasks that take `loaded` to `desired`: unloads, loads, one reload, stops, starts.
pub fn plan(desired: &BTreeMap<String, DesiredUnit>, loaded: &BTreeMap<String, LoadedUnit>) -> Vec<Task> {
    let mut tasks = Vec::new();
    for (name, current) in loaded {
        match desired.get(name) {
            None => tasks.push(Task::Unload(name.clone())),
            Some(wanted) if wanted.state == DesiredState::Inactive => tasks.push(Task::Unload(name.clone())),
            // New content, a secret's version moved (given by a restart), or what a running unit
            // requires moved and it wants a restart: loaded afresh.
            Some(wanted)
                if wanted.hash != current.hash
                    || (!wanted.secrets.in_place && wanted.secrets.moved_from(current.secrets.as_ref()))
                    || (current.launched
                        && wanted.state == DesiredState::Launched
                        && wanted.places.on_change == OnChange::Restart
                        && current.places_moved(&wanted.places)) =>
            {
                tasks.push(Task::Unload(name.clone()));
                tasks.push(Task::Load(name.clone()));
                if wanted.state == DesiredState::Launched {
                    tasks.push(Task::Start(name.clone()));
                }
            }
            Some(wanted) => {
                let places_moved = current.places_moved(&wanted.places);
                if wanted.secrets.moved_from(current.secrets.as_ref()) || places_moved {
                    tasks.push(Task::Refresh(name.clone()));
                }
                let running = current.launched && wanted.state == DesiredState::Launched;
                if places_moved && running && wanted.places.on_change == OnChange::Reload {
                    tasks.push(Task::Reload(name.clone()));
                }
                match (wanted.state, current.launched) {
                    (DesiredState::Launched, false) => tasks.push(Task::Start(name.clone())),
                    (DesiredState::Loaded, true) => tasks.push(Task::Stop(name.clone())),
                    _ => {}
                }
            }
        }
    }
    for (name, wanted) in desired {
        if wanted.state != DesiredState::Inactive && !loaded.contains_key(name) {
            tasks.push(Task::Load(name.clone()));
            if wanted.state == DesiredState::Launched {
                tasks.push(Task::Start(name.clone()));
            }
        }
    }
    if tasks.iter().any(|task| matches!(task, Task::Load(_) | Task::Unload(_))) {
        tasks.push(Task::ReloadUnitFiles);
    }
    tasks.sort_by(|a, b| a.rank().cmp(&b.rank()).then_with(|| a.cmp(b)));
    tasks
}

/// `tasks` with the ones that put drifted units back: a unit whose file changed or went is
/// written again (and started again if it was), a stopped one started.
/// `launched` says whether the agent started each unit. Units in `drifted` have no task in
/// `tasks` (they are in sync as far as the plan knows).
pub fn with_corrections(mut tasks: Vec<Task>, drifted: &[(String, Drift, bool)]) -> Vec<Task> {
    for (name, drift, launched) in drifted {
        match drift {
            Drift::Changed | Drift::Removed => {
                tasks.push(Task::Unload(name.clone()));
                tasks.push(Task::Load(name.clone()));
                if *launched {
                    tasks.push(Task::Start(name.clone()));
                }
            }
            Drift::Stopped => tasks.push(Task::Start(name.clone())),
        }
    }
    let loads = tasks.iter().any(|task| matches!(task, Task::Load(_) | Task::Unload(_)));
    if loads && !tasks.contains(&Task::ReloadUnitFiles) {
        tasks.push(Task::ReloadUnitFiles);
    }
    tasks.sort_by(|a, b| a.rank().cmp(&b.rank()).then_with(|| a.cmp(b)));
    tasks.dedup();
    tasks
}

/// A global unit as an agent sees it.
pub struct GlobalUnit<'a> {
    pub name: &'a str,
    pub desired: DesiredUnit,
    pub requirements: &'a Requirements,
}

/// Whether a global unit runs on `machine`: it is wanted (not inactive), the machine has the
/// metadata it asks for, it tolerates every taint of the machine (`:evict` or not: the rule
/// knows no "already there"), and it excludes no unit already there (`excludes_a_resident`:
/// `Conflicts=` or `Replaces=`, checked both ways). The one rule the engine's planner counts
/// global units by and each agent runs them by, taking the global units in name order.
pub fn global_unit_runs(
    desired: DesiredState,
    requirements: &Requirements,
    machine: &MachineState,
    excludes_a_resident: impl FnOnce() -> bool,
) -> bool {
    desired != DesiredState::Inactive && requirements.admitted_by(machine) && !excludes_a_resident()
}

/// Which global units this machine runs, by [`global_unit_runs`], in name order.
pub fn add_global_units(
    machine: &MachineState,
    desired: &mut BTreeMap<String, DesiredUnit>,
    desired_requirements: &BTreeMap<String, Requirements>,
    globals: &[GlobalUnit<'_>],
) {
    let mut taken: Vec<(&str, &Requirements)> =
        desired_requirements.iter().map(|(name, requirements)| (name.as_str(), requirements)).collect();
    let mut globals: Vec<&GlobalUnit<'_>> = globals.iter().collect();
    globals.sort_by_key(|global| global.name);
    for global in globals {
        let excludes_a_resident =
            || taken.iter().any(|(other, requirements)| global.requirements.excludes(global.name, other, requirements));
        if global_unit_runs(global.desired.state, global.requirements, machine, excludes_a_resident) {
            desired.insert(global.name.to_string(), global.desired.clone());
            taken.push((global.name, global.requirements));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(n: u8) -> UnitHash {
        UnitHash([n; 20])
    }

    fn want(n: u8, state: DesiredState) -> DesiredUnit {
        DesiredUnit {
            hash: hash(n),
            state,
            drift: DriftPolicy::Correct,
            secrets: SecretPins::default(),
            places: Places::default(),
        }
    }

    fn have(n: u8, launched: bool) -> LoadedUnit {
        LoadedUnit { hash: hash(n), launched, secrets: Some(BTreeMap::new()), places: Some(Vec::new()) }
    }

    #[test]
    fn tasks_follow_the_original_order() {
        use DesiredState::*;
        let desired = BTreeMap::from([
            ("new.service".to_string(), want(1, Launched)),
            ("changed.service".to_string(), want(2, Launched)),
            ("stop.service".to_string(), want(3, Loaded)),
            ("start.service".to_string(), want(4, Launched)),
            ("same.service".to_string(), want(5, Launched)),
            ("inactive.service".to_string(), want(6, Inactive)),
        ]);
        let loaded = BTreeMap::from([
            ("changed.service".to_string(), have(9, true)),
            ("stop.service".to_string(), have(3, true)),
            ("start.service".to_string(), have(4, false)),
            ("same.service".to_string(), have(5, true)),
            ("gone.service".to_string(), have(7, true)),
            ("inactive.service".to_string(), have(6, false)),
        ]);
        let tasks = plan(&desired, &loaded);
        assert_eq!(
            tasks,
            vec![
                Task::Unload("changed.service".into()),
                Task::Unload("gone.service".into()),
                Task::Unload("inactive.service".into()),
                Task::Load("changed.service".into()),
                Task::Load("new.service".into()),
                Task::ReloadUnitFiles,
                Task::Stop("stop.service".into()),
                Task::Start("changed.service".into()),
                Task::Start("new.service".into()),
                Task::Start("start.service".into()),
            ]
        );
    }

    #[test]
    fn corrections_join_the_plan_in_order() {
        let planned = vec![Task::Start("new.service".into())];
        let drifted = [
            ("edited.service".to_string(), Drift::Changed, true),
            ("stopped.service".to_string(), Drift::Stopped, true),
            ("gone.service".to_string(), Drift::Removed, false),
        ];
        assert_eq!(
            with_corrections(planned, &drifted),
            vec![
                Task::Unload("edited.service".into()),
                Task::Unload("gone.service".into()),
                Task::Load("edited.service".into()),
                Task::Load("gone.service".into()),
                Task::ReloadUnitFiles,
                Task::Start("edited.service".into()),
                Task::Start("new.service".into()),
                Task::Start("stopped.service".into()),
            ]
        );
        assert!(with_corrections(Vec::new(), &[]).is_empty());
    }

    #[test]
    fn a_moved_secret_restarts_its_unit_or_is_written_where_it_runs() {
        let pinned = |version: u64, in_place: bool| DesiredUnit {
            secrets: SecretPins { versions: BTreeMap::from([("db".to_string(), version)]), in_place },
            ..want(1, DesiredState::Launched)
        };
        let given = |version: Option<u64>| LoadedUnit {
            secrets: version.map(|version| BTreeMap::from([("db".to_string(), version)])),
            ..have(1, true)
        };
        let name = "a.service".to_string();
        let tasks = |wanted: DesiredUnit, loaded: LoadedUnit| {
            plan(&BTreeMap::from([(name.clone(), wanted)]), &BTreeMap::from([(name.clone(), loaded)]))
        };
        assert_eq!(
            tasks(pinned(2, false), given(Some(1))),
            vec![
                Task::Unload(name.clone()),
                Task::Load(name.clone()),
                Task::ReloadUnitFiles,
                Task::Start(name.clone())
            ]
        );
        assert_eq!(tasks(pinned(2, true), given(Some(1))), vec![Task::Refresh(name.clone())]);
        assert!(tasks(pinned(2, false), given(Some(2))).is_empty(), "the pinned version runs");
        assert!(tasks(pinned(2, false), given(None)).is_empty(), "taken over: taken to run what is pinned");
    }

    #[test]
    fn what_a_unit_requires_moving_restarts_reloads_or_rewrites_its_file_as_it_asks() {
        let db = |machine: &str| RequiredPlace {
            unit: "db.service".into(),
            machine_id: machine.into(),
            public_ip: "10.0.0.1".into(),
        };
        let wanted = |machine: &str, on_change: OnChange, state: DesiredState| DesiredUnit {
            places: Places { at: vec![db(machine)], on_change },
            ..want(1, state)
        };
        let given = |places: Option<Vec<RequiredPlace>>, launched: bool| LoadedUnit { places, ..have(1, launched) };
        let name = "app.service".to_string();
        let tasks = |wanted: DesiredUnit, loaded: LoadedUnit| {
            plan(&BTreeMap::from([(name.clone(), wanted)]), &BTreeMap::from([(name.clone(), loaded)]))
        };
        let moved = Some(vec![db("m1")]);
        use DesiredState::Launched;
        assert_eq!(
            tasks(wanted("m2", OnChange::Restart, Launched), given(moved.clone(), true)),
            vec![
                Task::Unload(name.clone()),
                Task::Load(name.clone()),
                Task::ReloadUnitFiles,
                Task::Start(name.clone())
            ]
        );
        assert_eq!(
            tasks(wanted("m2", OnChange::Reload, Launched), given(moved.clone(), true)),
            vec![Task::Refresh(name.clone()), Task::Reload(name.clone())]
        );
        assert_eq!(
            tasks(wanted("m2", OnChange::None, Launched), given(moved.clone(), true)),
            vec![Task::Refresh(name.clone())]
        );
        assert_eq!(
            tasks(wanted("m2", OnChange::Restart, DesiredState::Loaded), given(moved.clone(), false)),
            vec![Task::Refresh(name.clone())],
            "not running: only its file"
        );
        assert!(tasks(wanted("m1", OnChange::Restart, Launched), given(moved, true)).is_empty(), "unmoved");
        assert!(tasks(wanted("m2", OnChange::Restart, Launched), given(None, true)).is_empty(), "taken over");
    }

    #[test]
    fn nothing_to_do_means_no_reload() {
        let desired = BTreeMap::from([("a.service".to_string(), want(1, DesiredState::Loaded))]);
        let loaded = BTreeMap::from([("a.service".to_string(), have(1, false))]);
        assert!(plan(&desired, &loaded).is_empty());
    }

    #[test]
    fn globals_skip_conflicts_and_other_metadata() {
        let machine =
            MachineState { id: "m".into(), metadata: [("role".into(), "web".into())].into(), ..Default::default() };
        let web = Requirements { metadata: [("role".into(), vec!["web".into()])].into(), ..Default::default() };
        let db = Requirements { metadata: [("role".into(), vec!["db".into()])].into(), ..Default::default() };
        let conflicting = Requirements { conflicts: vec!["local.service".into()], ..Default::default() };
        let mut desired = BTreeMap::from([("local.service".to_string(), want(1, DesiredState::Launched))]);
        let requirements = BTreeMap::from([("local.service".to_string(), Requirements::default())]);
        let globals = [
            GlobalUnit { name: "web.service", desired: want(2, DesiredState::Launched), requirements: &web },
            GlobalUnit { name: "db.service", desired: want(3, DesiredState::Launched), requirements: &db },
            GlobalUnit { name: "c.service", desired: want(4, DesiredState::Launched), requirements: &conflicting },
        ];
        add_global_units(&machine, &mut desired, &requirements, &globals);
        assert_eq!(desired.keys().collect::<Vec<_>>(), vec!["local.service", "web.service"]);
    }
}
