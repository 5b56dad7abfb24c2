//! No sequence of rollout, drain, eviction and preemption steps ever takes more of a group
//! down than its disruption budget allows (per value of its key when grouped by one).
//!
//! A small cluster of one template's instances runs through random steps: the voluntary ones
//! (a rollout's step, a drain's step, the engine's plan with a machine tainted `:evict` and a
//! high-priority unit that preempts) share one ledger counted from the cluster as it is, and
//! the others move time on (a disrupted unit comes back up where it now is) or fail a unit
//! (a fault: not a disruption, and allowed past the budget). After each voluntary step, every
//! unit it took down must leave its group (and value, where it was) at most at its budget,
//! counted here from the cluster itself, not from the ledger.

use std::collections::HashMap;
use std::sync::Arc;

use fleet_core::disruption_budget::{Budgets, DisruptionBudget, Member};
use fleet_core::drain::{Drain, DrainUnit, advance_within as drain_step};
use fleet_core::rollout::{
    Health, MaxUnavailable, Observed, Rollout, RolloutState, RolloutUnit, Step, advance_within as rollout_step,
};
use fleet_core::schedule::{ClusterSnapshot, Decision, UnitSpec, plan};
use fleet_core::taint::Taint;
use fleet_core::{DesiredState, MachineState, Requirements, Resources, UnitFile, UnitHash};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

#[derive(Clone, Debug)]
struct Unit {
    name: String,
    machine: Option<String>,
    /// The machine it left, while it is placed nowhere: it counts in that machine's zone.
    left: Option<String>,
    /// The content it runs while up.
    running: UnitHash,
    /// The content it should run.
    wanted: UnitHash,
    up: bool,
}

impl Unit {
    /// The machine whose zone it counts in: where it is, else the one it left.
    fn counted_on(&self) -> Option<&str> {
        self.machine.as_deref().or(self.left.as_deref())
    }
}

struct Cluster {
    machines: Vec<MachineState>,
    units: Vec<Unit>,
    budget: DisruptionBudget,
    rollout: Rollout,
    /// The high-priority unit that preempts, once it came.
    big: Option<Option<String>>,
}

#[derive(Clone, Debug)]
enum Action {
    RolloutStep,
    DrainStep(usize),
    Taint(usize),
    BigArrives,
    Plan,
    Recover(usize),
    Fault(usize),
}

fn hash(text: &str) -> UnitHash {
    UnitFile::parse(&format!("[Service]\nExecStart={text}\n")).expect("a unit").hash()
}

impl Cluster {
    fn new(machines: usize, units: usize, budget: DisruptionBudget) -> Self {
        let old = hash("/bin/old");
        let machines: Vec<MachineState> = (0..machines)
            .map(|n| MachineState {
                id: format!("m{n}"),
                metadata: [("zone".to_string(), if n % 2 == 0 { "a" } else { "b" }.to_string())].into(),
                capacity: Some(Resources { memory: 4 * GIB, cpu_millis: 4000 }),
                ..MachineState::default()
            })
            .collect();
        let units: Vec<Unit> = (0..units)
            .map(|n| Unit {
                name: format!("web@{n}.service"),
                machine: Some(machines[n % machines.len()].id.clone()),
                left: None,
                running: old,
                wanted: old,
                up: true,
            })
            .collect();
        let rollout = Rollout {
            units: units
                .iter()
                .map(|unit| RolloutUnit {
                    name: unit.name.clone(),
                    from: old,
                    to: hash("/bin/new"),
                    step: Step::Waiting,
                })
                .collect(),
            max_unavailable: MaxUnavailable::Count(3),
            min_ready: 0,
            deadline: 1_000_000,
            state: RolloutState::Running,
            undo: false,
            canary: None,
            auto_revert: false,
            reverted: None,
            held: None,
        };
        Self { machines, units, budget, rollout, big: None }
    }

    fn released(&self, unit: &str) -> bool {
        self.machines.iter().any(|machine| machine.drain.as_ref().is_some_and(|drain| drain.lets_go(unit)))
    }

    /// Down as the budgets count it: not up where it is on the content it should run, or let
    /// go by a drain.
    fn down(&self, unit: &Unit) -> bool {
        !unit.up || unit.machine.is_none() || unit.running != unit.wanted || self.released(&unit.name)
    }

    fn zone(&self, machine: Option<&str>) -> Option<String> {
        let machine = self.machines.iter().find(|candidate| Some(candidate.id.as_str()) == machine)?;
        machine.metadata.get("zone").cloned()
    }

    /// The ledger for a voluntary step, counted from the cluster as it is.
    fn budgets(&self) -> Budgets {
        Budgets::new(self.units.iter().map(|unit| Member {
            name: unit.name.clone(),
            group: "web@.service".to_string(),
            budget: self.budget.clone(),
            value: self.budget.by.as_ref().and_then(|_| self.zone(unit.counted_on())),
            down: self.down(unit),
        }))
    }

    /// Each unit's bucket (its zone when the budget is grouped by one) and whether it is down.
    fn buckets(&self) -> Vec<(Option<String>, bool)> {
        self.units
            .iter()
            .map(|unit| {
                let value = self.budget.by.as_ref().map(|_| self.zone(unit.counted_on()).unwrap_or_default());
                (value, self.down(unit))
            })
            .collect()
    }

    fn drain_units(&self, machine: &str) -> Vec<DrainUnit> {
        let drain = self.machines.iter().find(|m| m.id == machine).and_then(|m| m.drain.clone());
        self.units
            .iter()
            .filter(|unit| {
                unit.machine.as_deref() == Some(machine) || drain.as_ref().is_some_and(|d| d.lets_go(&unit.name))
            })
            .map(|unit| DrainUnit {
                name: unit.name.clone(),
                on: unit.machine.clone(),
                ready: unit.up && unit.running == unit.wanted,
                wanted: true,
                machine_id: None,
                follows: Vec::new(),
                required_by: Vec::new(),
            })
            .collect()
    }

    fn requirements(&self, budgeted: bool, priority: u16, memory: u64) -> Arc<Requirements> {
        Arc::new(Requirements {
            disruption_budget: budgeted.then(|| self.budget.clone()),
            priority,
            reservation: Resources { memory, cpu_millis: 0 },
            ..Requirements::default()
        })
    }

    fn snapshot(&self) -> ClusterSnapshot {
        let web = self.requirements(true, 10, GIB);
        let mut units: Vec<UnitSpec> = self
            .units
            .iter()
            .map(|unit| UnitSpec {
                name: unit.name.clone(),
                desired: DesiredState::Launched,
                requirements: web.clone(),
                scheduled_on: unit.machine.clone(),
            })
            .collect();
        if let Some(on) = &self.big {
            units.push(UnitSpec {
                name: "big.service".to_string(),
                desired: DesiredState::Launched,
                requirements: self.requirements(false, 900, 4 * GIB),
                scheduled_on: on.clone(),
            });
        }
        ClusterSnapshot {
            machines: self.machines.clone(),
            units,
            preemption: true,
            budgets: self.budgets(),
            ..ClusterSnapshot::default()
        }
    }

    fn unit_mut(&mut self, name: &str) -> Option<&mut Unit> {
        self.units.iter_mut().find(|unit| unit.name == name)
    }

    fn act(&mut self, action: &Action, now: u64) {
        match action {
            Action::RolloutStep => {
                let seen: Vec<Option<Observed>> = self
                    .units
                    .iter()
                    .map(|unit| {
                        let health = if unit.up { Health::Active } else { Health::Down };
                        unit.machine.as_ref().map(|_| Observed::new(unit.running, health))
                    })
                    .collect();
                let mut budgets = self.budgets();
                let step = rollout_step(&mut self.rollout, seen.as_slice(), now, &mut budgets);
                for name in step.replace {
                    let to = self.rollout.units.iter().find(|unit| unit.name == name).map(|unit| unit.to);
                    if let (Some(unit), Some(to)) = (self.unit_mut(&name), to) {
                        unit.wanted = to;
                    }
                }
            }
            Action::DrainStep(which) => {
                let index = which % self.machines.len();
                let id = self.machines[index].id.clone();
                let mut drain =
                    self.machines[index].drain.clone().unwrap_or_else(|| Drain::new(MaxUnavailable::Count(2), now));
                let units = self.drain_units(&id);
                let mut budgets = self.budgets();
                drain_step(&mut drain, &id, &units, now, &mut budgets);
                self.machines[index].drain = Some(drain);
            }
            Action::Taint(which) => {
                let index = which % self.machines.len();
                self.machines[index].taints.insert("maintenance".into(), Taint { value: String::new(), evict: true });
            }
            Action::BigArrives => {
                self.big.get_or_insert(None);
            }
            Action::Plan => {
                let decided = plan(&self.snapshot());
                for decision in decided.decisions {
                    match decision {
                        Decision::Unschedule { unit, .. } if unit == "big.service" => self.big = Some(None),
                        Decision::Schedule { unit, machine } if unit == "big.service" => self.big = Some(Some(machine)),
                        Decision::Unschedule { unit, .. } => {
                            if let Some(unit) = self.unit_mut(&unit) {
                                unit.left = unit.machine.take();
                                unit.up = false;
                            }
                        }
                        Decision::Schedule { unit, machine } => {
                            if let Some(unit) = self.unit_mut(&unit) {
                                unit.machine = Some(machine);
                                unit.left = None;
                                unit.up = false;
                            }
                        }
                    }
                }
            }
            Action::Recover(which) => {
                let index = which % self.units.len();
                let name = self.units[index].name.clone();
                // A unit a drain let go is moved by the engine (a plan); here it comes back up
                // only where it is not let go.
                if self.released(&name) && self.units[index].machine.as_deref().is_some_and(|on| self.drained(on)) {
                    return;
                }
                let unit = &mut self.units[index];
                if unit.machine.is_some() {
                    unit.running = unit.wanted;
                    unit.up = true;
                }
            }
            Action::Fault(which) => {
                let index = which % self.units.len();
                self.units[index].up = false;
            }
        }
    }

    fn drained(&self, machine: &str) -> bool {
        self.machines.iter().any(|candidate| candidate.id == machine && candidate.drain.is_some())
    }
}

fn voluntary(action: &Action) -> bool {
    matches!(action, Action::RolloutStep | Action::DrainStep(_) | Action::Plan)
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => Just(Action::RolloutStep),
        2 => (0..8usize).prop_map(Action::DrainStep),
        1 => (0..8usize).prop_map(Action::Taint),
        1 => Just(Action::BigArrives),
        3 => Just(Action::Plan),
        4 => (0..16usize).prop_map(Action::Recover),
        1 => (0..16usize).prop_map(Action::Fault),
    ]
}

fn budget() -> impl Strategy<Value = DisruptionBudget> {
    (
        prop_oneof![(1..3usize).prop_map(MaxUnavailable::Count), (20..60u8).prop_map(MaxUnavailable::Percent)],
        any::<bool>(),
    )
        .prop_map(|(size, by_zone)| DisruptionBudget { size, by: by_zone.then(|| "zone".to_string()) })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn no_sequence_of_disruptions_takes_a_group_past_its_budget(
        machines in 2..6usize,
        units in 3..12usize,
        budget in budget(),
        actions in proptest::collection::vec(action(), 1..60),
    ) {
        let mut cluster = Cluster::new(machines, units, budget);
        for (now, action) in actions.iter().enumerate() {
            let before = cluster.buckets();
            cluster.act(action, now as u64);
            if !voluntary(action) {
                continue;
            }
            let after = cluster.buckets();
            // Per bucket (where each unit was before the step): how many are down now, how
            // many there are, and whether the step took one of them down.
            let mut counted: HashMap<Option<String>, (usize, usize, bool)> = HashMap::new();
            for ((value, was_down), (_, down)) in before.iter().zip(&after) {
                let entry = counted.entry(value.clone()).or_default();
                entry.0 += usize::from(*down);
                entry.1 += 1;
                entry.2 |= *down && !was_down;
            }
            for (value, (down, size, took)) in counted {
                if took {
                    let limit = cluster.budget.size.of(size);
                    prop_assert!(
                        down <= limit,
                        "{action:?} took {value:?} to {down} down of {size}, past {} ({limit})",
                        cluster.budget
                    );
                }
            }
        }
    }
}

/// The generated sequences do disrupt: a budget that held everything would pass the property
/// above trivially.
#[test]
fn the_steps_disrupt_units_and_a_budget_holds_some_back() {
    let budget = DisruptionBudget { size: MaxUnavailable::Count(1), by: Some("zone".into()) };
    let mut cluster = Cluster::new(4, 8, budget);
    cluster.act(&Action::RolloutStep, 0);
    let replacing: Vec<&str> =
        cluster.units.iter().filter(|u| u.running != u.wanted).map(|u| u.name.as_str()).collect();
    assert_eq!(replacing, ["web@0.service", "web@1.service"], "one in each zone, though the rollout allows 3");
    assert!(cluster.rollout.held.as_deref().is_some_and(|held| {
        held.starts_with("web@2.service waits: held by the disruption budget of web@.service in zone=a")
    }));
    cluster.act(&Action::DrainStep(2), 1);
    let drain = cluster.machines[2].drain.clone().expect("drained");
    assert!(drain.released.is_empty(), "zone a has its one down");
    assert!(drain.held.is_some());
    for n in 0..8 {
        cluster.act(&Action::Recover(n), 2);
    }
    cluster.act(&Action::Taint(1), 3);
    let decided = plan(&cluster.snapshot());
    assert_eq!(decided.held.len(), 1, "one of m1's two units leaves for the taint, the other waits: {decided:?}");
    assert!(
        decided.held[0]
            .1
            .contains("despite its taint maintenance:evict: held by the disruption budget of web@.service in zone=b"),
        "{:?}",
        decided.held
    );
    cluster.act(&Action::Plan, 3);
    let moved: Vec<&str> = cluster.units.iter().filter(|u| !u.up).map(|u| u.name.as_str()).collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
}

/// A preemption whose victims their budget holds waits, and the preemptor's reason says so.
#[test]
fn a_preemption_a_budget_holds_waits_naming_the_budget() {
    let mut cluster = Cluster::new(2, 4, DisruptionBudget { size: MaxUnavailable::Count(1), by: None });
    cluster.act(&Action::Fault(0), 0);
    cluster.act(&Action::BigArrives, 0);
    let decided = plan(&cluster.snapshot());
    let reasons = decided.reason_texts();
    let big = reasons.iter().find(|(unit, _)| unit == "big.service").map(|(_, reason)| reason.as_str());
    assert_eq!(
        big,
        Some(
            "needs 4 GiB memory; the most free is 2 GiB on m0; preempting web@0.service, web@2.service is held by the disruption budget of web@.service: 1 down of the 1 it allows (DisruptionBudget=1)"
        ),
    );
    assert!(decided.decisions.is_empty(), "nothing moves: {:?}", decided.decisions);
    assert!(decided.budget_held());
    cluster.act(&Action::Recover(0), 1);
    let decided = plan(&cluster.snapshot());
    assert!(decided.decisions.is_empty(), "two up on each machine and a budget of 1: still held");
    let with_room = DisruptionBudget { size: MaxUnavailable::Count(2), by: None };
    cluster.budget = with_room;
    let decided = plan(&cluster.snapshot());
    assert!(
        decided.decisions.contains(&Decision::Schedule { unit: "big.service".into(), machine: "m0".into() }),
        "{:?}",
        decided.decisions
    );
    assert_eq!(decided.disrupted.len(), 2, "{:?}", decided.disrupted);
}
