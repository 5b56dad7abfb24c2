//! The registry contract: what ARCHITECTURE.md promises of every store, written once against
//! the facet traits and run by each store crate's tests through [`registry_contract!`], once
//! per way that store opens (a store added later writes one opener and calls the macro).
//! Reads that go through a watch-fed copy are eventually consistent, so the checks wait for
//! them.

use std::collections::BTreeMap;
use std::sync::Arc;

use fleet_core::schedule::{Decision, UnscheduleReason};
use fleet_core::{DesiredState, MachineState, SystemdState, UnitFile, UnitState};

use fleet_testkit::eventually;

use crate::{
    AgentRegistry, EngineLease, MetadataChange, Page, PageRequest, Registry, RegistryError, StateReport, StoreChores,
    TokenRecord,
};
use crate::{
    Imported, ImportedUnit, JoinRefused, RegistrationRecord, RegistrationRefused, RevokedMachine, RolloutRecord,
    SourceRecord, SourceStatus, UnitChange, UnitChanged, UnitView, Writer,
};

/// The agent's facet of the store for one machine: the store itself for a store that serves
/// every machine, a remote store of that machine's own for the remote one.
pub type AgentFor<'a> = &'a (dyn Fn(&str) -> Arc<dyn AgentRegistry> + Sync);

/// Runs every contract against one store: `$open` is an `async fn() -> Opened`, called once
/// per test. A store crate's tests call it once per way the store can be opened.
#[macro_export]
macro_rules! registry_contract {
    ($open:path) => {
        $crate::registry_contract!(@each $open;
            tokens_are_unique_by_name_and_revocable,
            secrets_are_set_over_the_version_read,
            a_revoked_machine_goes_with_its_states,
            registrations_are_counted_bounded_and_expire,
            a_machine_id_belongs_to_the_key_that_first_joined,
            a_stale_lease_cannot_write,
            the_engine_leader_is_named_while_it_leads,
            a_schedule_change_wakes_only_its_machine,
            desired_state_changes_reach_the_agent,
            secret_pins_reach_the_agent_and_hold_across_new_content,
            runtime_metadata_overlays_the_machine,
            taints_overlay_the_machine_as_metadata_does,
            a_drain_reads_with_its_machine_and_is_stepped_only_while_it_stands,
            states_go_with_their_machine,
            units_belong_to_the_source_that_made_them,
            a_write_guarded_by_a_plan_refuses_units_changed_since,
            a_sources_drift_policy_reaches_the_agents,
            sources_and_their_statuses_are_kept_by_name,
            rollouts_are_kept_by_name,
            a_rollout_of_the_most_units_is_kept_whole,
            sources_statuses_and_rollouts_signal_their_changes,
            units_and_states_signal_their_changes_while_paged,
            pages_are_the_lists_cut_up,
            a_batch_of_unit_writes_is_each_write_alone,
            an_import_writes_its_units_where_they_run_or_nothing,
            job_records_are_replaced_only_over_the_version_read,
            a_run_ticket_reaches_every_machine_with_its_global_unit,
            machines_out_of_touch_are_recorded_by_the_leader_and_listed,
            silent_departures_are_recorded_by_the_leader,
            where_requirements_run_reaches_the_machine_of_their_unit,
            events_are_one_stream_read_from_any_index_and_trimmed_oldest_first,
        );
    };
    (@each $open:path; $($name:ident),+ $(,)?) => {
        $(#[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            let opened: $crate::contract::Opened = $open().await;
            let store = opened.registry.clone();
            let agent_for = move |_: &str| store.clone() as std::sync::Arc<dyn $crate::AgentRegistry>;
            $crate::contract::$name(opened.registry.as_ref(), &agent_for).await;
        })+

        #[tokio::test(flavor = "multi_thread")]
        async fn bodies_are_content_addressed_and_collected() {
            let opened: $crate::contract::Opened = $open().await;
            $crate::contract::bodies_are_content_addressed_and_collected(opened.registry.as_ref(), opened.chores.as_deref())
                .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_unit_keeps_its_versions_and_the_bodies_they_name() {
            let opened: $crate::contract::Opened = $open().await;
            $crate::contract::a_unit_keeps_its_versions_and_the_bodies_they_name(
                opened.registry.as_ref(),
                opened.chores.as_deref(),
            )
            .await;
        }
    };
}

/// A store for one test, and what must live as long as it (its directory, its etcd).
pub struct Opened {
    pub registry: Arc<dyn Registry>,
    /// The store's chores, for a store that has any.
    pub chores: Option<Arc<dyn StoreChores>>,
    pub guard: Box<dyn std::any::Any + Send>,
}

fn unit(exec: &str) -> UnitFile {
    UnitFile::parse(&format!("[Service]\nExecStart={exec}\n")).expect("a unit file")
}

fn machine(id: &str) -> MachineState {
    MachineState { id: id.into(), public_ip: "127.0.0.1".into(), ..Default::default() }
}

async fn lease(registry: &dyn Registry) -> EngineLease {
    registry.acquire_leadership("m1").await.expect("leadership").expect("no other leader")
}

/// Schedules `unit` on `machine` as the leading engine does, once the engine's snapshot shows
/// the unit: a store writes a schedule only for a unit its engine copy holds (a plan from a copy
/// that has not seen the unit is skipped, to be planned again). A caller that changed the unit
/// just before waits for the engine's copy to show that change itself.
async fn place(registry: &dyn Registry, unit: &str, machine: &str) {
    eventually("the engine sees the unit it places", async || {
        registry.snapshot().await.is_ok_and(|snapshot| snapshot.units.iter().any(|seen| seen.name == unit))
    })
    .await;
    let decision = Decision::Schedule { unit: unit.into(), machine: machine.into() };
    registry.apply(&lease(registry).await, &[decision], &[]).await.expect("a schedule write");
}

/// Whether the store's chores, after a snapshot, leave `hash`'s body gone (a store without
/// chores drops a body with its last unit).
async fn collected(registry: &dyn Registry, chores: Option<&dyn StoreChores>, hash: &fleet_core::UnitHash) -> bool {
    if registry.snapshot().await.is_err() {
        return false;
    }
    if let Some(chores) = chores
        && chores.do_chores().await.is_err()
    {
        return false;
    }
    registry.unit_body(hash).await.is_ok_and(|body| body.is_none())
}

/// Bodies are stored once per content, read by hash, and deleted once no unit refers to
/// them (by the store's chores, after a snapshot that shows it).
pub async fn bodies_are_content_addressed_and_collected(registry: &dyn Registry, chores: Option<&dyn StoreChores>) {
    let (shared, other, once) = (unit("/bin/true"), unit("/bin/false"), unit("/bin/echo once"));
    registry.put_unit("a.service", &shared, DesiredState::Inactive).await.unwrap();
    registry.put_unit("b.service", &shared, DesiredState::Inactive).await.unwrap();
    registry.put_unit("c.service", &once, DesiredState::Inactive).await.unwrap();
    assert_eq!(registry.unit_body(&shared.hash()).await.unwrap(), Some(shared.clone()));
    // A snapshot that counts both units of the shared content, before one of them leaves it.
    eventually("a snapshot shows every unit", async || {
        registry.snapshot().await.is_ok_and(|snapshot| snapshot.units.len() == 3)
    })
    .await;
    registry.put_unit("b.service", &other, DesiredState::Inactive).await.unwrap();
    assert_eq!(registry.unit("b.service").await.unwrap().unwrap().hash, other.hash());
    // c.service's body going shows that a collection ran after b.service left the shared
    // content; the shared body must have outlived it.
    assert!(registry.destroy_unit("c.service").await.unwrap());
    eventually("the body of a destroyed unit is collected", async || collected(registry, chores, &once.hash()).await)
        .await;
    assert!(registry.unit_body(&shared.hash()).await.unwrap().is_some(), "a.service still refers to it");
    let asked = [shared.hash(), other.hash(), once.hash()];
    let both = crate::AgentRegistry::unit_bodies(registry, "m1", &asked).await.unwrap();
    assert_eq!(both.len(), 2, "a body that is gone is left out");
    assert_eq!((&both[&shared.hash()], &both[&other.hash()]), (&shared, &other));
    assert!(registry.destroy_unit("a.service").await.unwrap());
    // b.service's first version names the shared content: its body stays while it does.
    let b = registry.unit("b.service").await.unwrap().unwrap();
    assert_eq!(b.versions.past.iter().map(|past| past.hash).collect::<Vec<_>>(), vec![shared.hash()]);
    assert!(registry.destroy_unit("b.service").await.unwrap());
    assert!(!registry.destroy_unit("b.service").await.unwrap(), "a second destroy finds nothing");
    eventually("the body is collected after its last unit and version", async || {
        collected(registry, chores, &shared.hash()).await
    })
    .await;
    eventually("the other body is collected too", async || collected(registry, chores, &other.hash()).await).await;
}

/// Each change of a unit's content or desired state makes a version, by its writer; the newest
/// kept past versions stay in the unit, and their bodies with them until no version names them.
pub async fn a_unit_keeps_its_versions_and_the_bodies_they_name(
    registry: &dyn Registry,
    chores: Option<&dyn StoreChores>,
) {
    use fleet_core::unit_history::ChangedBy;
    let (ci, alice) = (Writer::identity("token:ci", false), Writer::identity("cert:alice", false));
    let (first, second, third) = (unit("/bin/first"), unit("/bin/second"), unit("/bin/third"));
    let versions = async || registry.unit("a.service").await.expect("read").expect("the unit").versions;
    registry.put_unit_as("a.service", &first, DesiredState::Inactive, &ci).await.unwrap();
    let made = versions().await;
    assert_eq!(
        made.current.as_ref().map(|stamp| (stamp.version, &stamp.by)),
        Some((1, &ChangedBy::identity("token:ci")))
    );
    assert!(made.past.is_empty(), "creating a unit keeps no version before it");
    assert!(registry.set_desired_state_as("a.service", DesiredState::Launched, &alice).await.unwrap());
    registry.put_unit_as("a.service", &second, DesiredState::Launched, &ci).await.unwrap();
    registry.put_unit_as("a.service", &second, DesiredState::Launched, &alice).await.unwrap();
    let after = versions().await;
    assert_eq!(after.number(), 3, "a write that changes nothing makes no version");
    let past: Vec<_> = after.past.iter().map(|past| (past.version, past.hash, past.desired, past.by.clone())).collect();
    assert_eq!(
        past,
        vec![
            (1, first.hash(), DesiredState::Inactive, ChangedBy::identity("token:ci")),
            (2, first.hash(), DesiredState::Launched, ChangedBy::identity("cert:alice")),
        ]
    );
    assert!(past_times_are_set(&after), "{after:?}");
    // A batch writes versions as single writes do.
    let batch = [UnitChange { name: "a.service".into(), file: Some(third.clone()), desired: DesiredState::Launched }];
    assert_eq!(registry.change_units_as(&batch, &alice).await.unwrap().len(), 1);
    assert_eq!(versions().await.number(), 4);
    // Fewer kept: the next write trims the oldest; their content goes once nothing names it.
    registry.keep_versions(1);
    registry.put_unit_as("a.service", &unit("/bin/fourth"), DesiredState::Launched, &ci).await.unwrap();
    let trimmed = versions().await;
    assert_eq!(trimmed.past.iter().map(|past| (past.version, past.hash)).collect::<Vec<_>>(), vec![(4, third.hash())]);
    eventually("a content no version names any more is collected", async || {
        collected(registry, chores, &first.hash()).await && collected(registry, chores, &second.hash()).await
    })
    .await;
    assert_eq!(registry.unit_body(&third.hash()).await.unwrap(), Some(third.clone()), "version 4 names it");
    registry.keep_versions(fleet_core::unit_history::DEFAULT_KEPT);
    assert!(registry.destroy_unit_as("a.service", &ci).await.unwrap());
    eventually("a destroyed unit's versions go with it", async || collected(registry, chores, &third.hash()).await)
        .await;
    registry.put_unit_as("a.service", &first, DesiredState::Launched, &ci).await.unwrap();
    let again = versions().await;
    assert_eq!((again.number(), again.past.len()), (1, 0), "a unit made again starts afresh");
}

fn past_times_are_set(versions: &fleet_core::unit_history::Versions) -> bool {
    versions.past.iter().all(|past| past.at.is_some_and(|at| at > 1_700_000_000))
}

/// A lease that is not the current leader's writes nothing and says so.
pub async fn a_stale_lease_cannot_write(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    registry.put_unit("a.service", &unit("/bin/true"), DesiredState::Launched).await.unwrap();
    let current = lease(registry).await;
    let stale = EngineLease { machine_id: "m9".into(), token: current.token + 1_000 };
    let decision = Decision::Schedule { unit: "a.service".into(), machine: "m1".into() };
    let refused = registry.apply(&stale, &[decision], &[]).await;
    assert!(matches!(refused, Err(RegistryError::LeadershipLost)), "{refused:?}");
    assert_eq!(registry.unit("a.service").await.unwrap().unwrap().machine_id, None);
}

/// The API names the machine whose engine leads, from the moment it leads until it gives the
/// leadership back.
pub async fn the_engine_leader_is_named_while_it_leads(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    assert_eq!(registry.engine_leader().await.unwrap(), None, "no engine leads yet");
    let held = lease(registry).await;
    eventually("the leader is named", async || {
        registry.engine_leader().await.is_ok_and(|m| m.as_deref() == Some("m1"))
    })
    .await;
    registry.release_leadership(&held).await.unwrap();
    eventually("no leader is named once it let go", async || registry.engine_leader().await.is_ok_and(|m| m.is_none()))
        .await;
}

/// A schedule write wakes the machine it concerns and no other, and reaches its work.
pub async fn a_schedule_change_wakes_only_its_machine(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    for id in ["m1", "m2"] {
        agent_for(id).register_machine(&machine(id)).await.unwrap();
    }
    registry.put_unit("x.service", &unit("/bin/sleep 1000"), DesiredState::Launched).await.unwrap();
    eventually("both machines' work can be read", async || {
        agent_for("m1").machine_work("m1").await.is_ok() && agent_for("m2").machine_work("m2").await.is_ok()
    })
    .await;
    eventually("the engine sees the unit", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 1)).await;
    let (mut m1, mut m2) = (agent_for("m1").machine_changes("m1"), agent_for("m2").machine_changes("m2"));
    m1.mark_unchanged();
    m2.mark_unchanged();
    place(registry, "x.service", "m1").await;
    eventually("m1's work has the unit", async || {
        agent_for("m1")
            .machine_work("m1")
            .await
            .is_ok_and(|work| work.scheduled.iter().any(|unit| unit.name == "x.service"))
    })
    .await;
    // A store that serves the work by request and the wake-up on a stream of its own (the
    // remote store) may answer the read before the wake-up arrives: wait for it.
    eventually("m1 is woken", async || m1.has_changed().unwrap_or(false)).await;
    assert!(!m2.has_changed().unwrap_or(false), "m2 was woken by a change to m1's schedule");
    assert_eq!(registry.unit("x.service").await.unwrap().unwrap().machine_id.as_deref(), Some("m1"));
}

/// A change of desired state reaches the placed unit's machine, and an unschedule with a
/// reason takes it away and records why.
pub async fn desired_state_changes_reach_the_agent(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    registry.put_unit("x.service", &unit("/bin/sleep 1000"), DesiredState::Launched).await.unwrap();
    eventually("the engine sees the unit", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 1)).await;
    place(registry, "x.service", "m1").await;
    assert!(registry.set_desired_state("x.service", DesiredState::Loaded).await.unwrap());
    assert!(!registry.set_desired_state("nothing.service", DesiredState::Loaded).await.unwrap());
    eventually("m1 sees the new desired state", async || {
        registry
            .machine_work("m1")
            .await
            .is_ok_and(|work| work.scheduled.first().is_some_and(|unit| unit.desired == DesiredState::Loaded))
    })
    .await;
    let away = Decision::Unschedule {
        unit: "x.service".into(),
        machine: "m1".into(),
        reason: UnscheduleReason::TargetStateInactive,
    };
    // The engine's view is a copy of its own: a decision made from one that has not seen the
    // new desired state is not written (the unit changed since), as a stale plan is not.
    eventually("the engine sees the placement and the new desired state", async || {
        registry.snapshot().await.is_ok_and(|s| {
            s.units.iter().any(|u| u.machine_id.as_deref() == Some("m1") && u.desired == DesiredState::Loaded)
        })
    })
    .await;
    registry.apply(&lease(registry).await, &[away], &[("x.service".into(), "no machine".into())]).await.unwrap();
    eventually("m1's work is empty", async || {
        agent_for("m1").machine_work("m1").await.is_ok_and(|work| work.scheduled.is_empty())
    })
    .await;
    assert_eq!(registry.unit("x.service").await.unwrap().unwrap().reason.as_deref(), Some("no machine"));
}

/// The versions of its secrets a unit is pinned to reach its machine, are shown with it, hold
/// when its content changes, and change nothing else of it.
pub async fn secret_pins_reach_the_agent_and_hold_across_new_content(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    use fleet_core::secrets::SecretPins;
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    registry.put_unit("x.service", &unit("/bin/sleep 1000"), DesiredState::Launched).await.unwrap();
    eventually("the engine sees the unit", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 1)).await;
    place(registry, "x.service", "m1").await;
    let pins = SecretPins { versions: BTreeMap::from([("db".to_string(), 3)]), in_place: true };
    assert!(registry.set_secret_pins("x.service", &pins).await.unwrap());
    assert!(!registry.set_secret_pins("nothing.service", &pins).await.unwrap(), "no such unit");
    let pinned = |work: &crate::MachineWork, wanted: &SecretPins| {
        work.scheduled.first().is_some_and(|unit| unit.secrets == *wanted && unit.desired == DesiredState::Launched)
    };
    eventually("m1 sees the pins", async || agent_for("m1").machine_work("m1").await.is_ok_and(|w| pinned(&w, &pins)))
        .await;
    let view = registry.unit("x.service").await.unwrap().unwrap();
    assert_eq!(
        (view.secrets.clone(), view.desired, view.machine_id.as_deref()),
        (pins.clone(), DesiredState::Launched, Some("m1"))
    );
    registry.put_unit("x.service", &unit("/bin/sleep 2000"), DesiredState::Launched).await.unwrap();
    let new_hash = unit("/bin/sleep 2000").hash();
    eventually("m1 sees the new content, still pinned", async || {
        agent_for("m1")
            .machine_work("m1")
            .await
            .is_ok_and(|work| pinned(&work, &pins) && work.scheduled.first().is_some_and(|unit| unit.hash == new_hash))
    })
    .await;
    assert!(registry.set_secret_pins("x.service", &SecretPins::default()).await.unwrap());
    eventually("m1 sees the pins gone", async || {
        agent_for("m1").machine_work("m1").await.is_ok_and(|work| pinned(&work, &SecretPins::default()))
    })
    .await;
}

/// Runtime metadata overlays the machine's configured metadata, in every reading of it.
pub async fn runtime_metadata_overlays_the_machine(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    let mut configured = machine("m1");
    configured.metadata.insert("hostname".into(), "smoke".into());
    agent_for("m1").register_machine(&configured).await.unwrap();
    let set =
        |key: &str, value: &str| MetadataChange::Set { machine_id: "m1".into(), key: key.into(), value: value.into() };
    registry.change_metadata(&[set("foo", "bar"), set("hostname", "other")]).await.unwrap();
    let metadata = registry.machines().await.unwrap()[0].metadata.clone();
    assert_eq!((metadata["foo"].as_str(), metadata["hostname"].as_str()), ("bar", "other"));
    eventually("the engine and the agent read the overrides", async || {
        let engine = registry.snapshot().await.is_ok_and(|s| s.machines.iter().any(|m| m.metadata.contains_key("foo")));
        let agent = agent_for("m1").machine_work("m1").await.is_ok_and(|work| {
            work.machine.is_some_and(|m| m.metadata.get("hostname").map(String::as_str) == Some("other"))
        });
        engine && agent
    })
    .await;
    let remove = |key: &str| MetadataChange::Remove { machine_id: "m1".into(), key: key.into() };
    registry.change_metadata(&[remove("foo"), remove("hostname")]).await.unwrap();
    assert!(registry.machines().await.unwrap()[0].metadata.is_empty(), "a removed override hides the configured value");
}

/// A machine's taints (its configured ones, with the runtime changes laid over them as its
/// metadata's are) read the same to the API, the engine and the machine's own agent, and never
/// show as metadata.
pub async fn taints_overlay_the_machine_as_metadata_does(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    use fleet_core::taint::{override_entry, parse_taint, parse_taints, written};
    let mut configured = machine("m1");
    configured.taints = parse_taints("gpu=yes,zone=a").unwrap();
    agent_for("m1").register_machine(&configured).await.unwrap();
    assert_eq!(written(&registry.machines().await.unwrap()[0].taints), ["gpu=yes", "zone=a"]);
    let (key, value) = override_entry("db", Some(&parse_taint("db:evict").unwrap().1));
    let tainted = MetadataChange::Set { machine_id: "m1".into(), key, value };
    let (key, _) = override_entry("gpu", None);
    let untainted = MetadataChange::Remove { machine_id: "m1".into(), key };
    registry.change_metadata(&[tainted, untainted]).await.unwrap();
    let wanted = ["db:evict".to_string(), "zone=a".to_string()];
    let machine = registry.machines().await.unwrap().remove(0);
    assert_eq!(written(&machine.taints), wanted);
    let no_taint_in =
        |metadata: &std::collections::BTreeMap<String, String>| !metadata.keys().any(|key| key.contains(':'));
    assert!(no_taint_in(&machine.metadata), "a taint is not metadata: {:?}", machine.metadata);
    eventually("the engine and the agent read the taints", async || {
        let engine = registry.snapshot().await.is_ok_and(|s| s.machines.iter().any(|m| written(&m.taints) == wanted));
        let agent = agent_for("m1")
            .machine_work("m1")
            .await
            .is_ok_and(|work| work.machine.is_some_and(|m| written(&m.taints) == wanted && no_taint_in(&m.metadata)));
        engine && agent
    })
    .await;
}

/// A machine's drain reads with the machine (to the API and the engine) and outlives the
/// machine's own record; a step is stored only while the drain it steps stands.
pub async fn a_drain_reads_with_its_machine_and_is_stepped_only_while_it_stands(
    registry: &dyn Registry,
    agent_for: AgentFor<'_>,
) {
    use fleet_core::drain::Drain;
    use fleet_core::rollout::MaxUnavailable;
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    agent_for("m2").register_machine(&machine("m2")).await.unwrap();
    let drain = Drain::new(MaxUnavailable::Count(2), 1000);
    registry.set_drain("m1", Some(&drain)).await.unwrap();
    let drained = |machines: Vec<MachineState>| -> Vec<(String, Option<Drain>)> {
        machines.into_iter().map(|machine| (machine.id, machine.drain)).collect()
    };
    let expected = vec![("m1".to_string(), Some(drain.clone())), ("m2".to_string(), None)];
    assert_eq!(drained(registry.machines().await.unwrap()), expected);
    eventually("the engine, the API's pages and the drains read the drain", async || {
        let engine = registry.snapshot().await.is_ok_and(|s| drained(s.machines) == expected);
        let paged = registry.machines_page(every(0, 10)).await.is_ok_and(|page| drained(page.items) == expected);
        let drains = registry.drains().await.is_ok_and(|drains| drains == vec![("m1".to_string(), drain.clone())]);
        engine && paged && drains
    })
    .await;
    // The machine restarts: its record is written again, the drain stays.
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    assert_eq!(drained(registry.machines().await.unwrap()), expected);
    let mut stepped = drain.clone();
    stepped.released.insert("a.service".into(), 1001);
    assert!(registry.step_drain("m1", &stepped).await.unwrap());
    assert_eq!(registry.machines().await.unwrap()[0].drain.as_ref(), Some(&stepped));
    // Drained again meanwhile (a new start): the old drain's step is not stored.
    let again = Drain::new(MaxUnavailable::Count(1), 2000);
    registry.set_drain("m1", Some(&again)).await.unwrap();
    assert!(!registry.step_drain("m1", &stepped).await.unwrap());
    registry.set_drain("m1", None).await.unwrap();
    assert!(!registry.step_drain("m1", &again).await.unwrap(), "an ended drain takes no step");
    assert_eq!(drained(registry.machines().await.unwrap()), vec![("m1".into(), None), ("m2".into(), None)]);
    eventually("no drain is read once it ended", async || registry.drains().await.is_ok_and(|d| d.is_empty())).await;
    // A drain of a machine that is gone is not read with the live machines' drains.
    registry.set_drain("m2", Some(&again)).await.unwrap();
    agent_for("m2").unregister_machine("m2").await.unwrap();
    eventually("a gone machine's drain is not read", async || registry.drains().await.is_ok_and(|d| d.is_empty()))
        .await;
}

/// A machine's unit states are dropped when it leaves.
pub async fn states_go_with_their_machine(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    let file = unit("/bin/sleep 1000");
    registry.put_unit("a.service", &file, DesiredState::Launched).await.unwrap();
    // A machine reports only what it holds.
    eventually("the engine sees the unit", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 1)).await;
    place(registry, "a.service", "m1").await;
    eventually("m1 holds the unit", async || {
        agent_for("m1").machine_work("m1").await.is_ok_and(|work| !work.scheduled.is_empty())
    })
    .await;
    let state = UnitState {
        run: None,
        name: "a.service".into(),
        machine_id: "m1".into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    let before = registry.revision().await.unwrap().expect("the store has a revision");
    agent_for("m1").report_states("m1", &[StateReport::Set(state.clone())]).await.unwrap();
    assert_eq!(registry.unit_states().await.unwrap().len(), 1);
    let reported = registry.revision().await.unwrap().expect("the store has a revision");
    assert!(reported > before, "a state report moves the revision");
    assert_eq!(registry.revision().await.unwrap(), Some(reported), "a read does not");
    // The engine asks which machines run the units it waits to place (stop before start).
    let asked: std::collections::BTreeSet<String> = ["a.service".to_string(), "b.service".to_string()].into();
    let running_on_m1 = std::collections::BTreeSet::from([("a.service".to_string(), "m1".to_string())]);
    let running = async || {
        let states = registry.reported_states(&asked).await.ok()?;
        Some(fleet_core::schedule::departures::Reports::of(states.iter().map(|state| &**state)).running)
    };
    eventually("m1 is seen running a.service", async || running().await == Some(running_on_m1.clone())).await;
    let stopped = UnitState { systemd: SystemdState::new("loaded", "inactive", "dead"), ..state };
    agent_for("m1").report_states("m1", &[StateReport::Set(stopped)]).await.unwrap();
    eventually("a.service stopped on m1 runs nowhere", async || {
        running().await.is_some_and(|running| running.is_empty())
    })
    .await;
    agent_for("m1").unregister_machine("m1").await.unwrap();
    eventually("the states went with the machine", async || registry.unit_states().await.unwrap().is_empty()).await;
    assert!(registry.machines().await.unwrap().is_empty());
}

/// Tokens are kept by name, a second of the same name is refused without touching the first,
/// and a revoked token is gone from the next read (every fleetd reads the same records).
pub async fn tokens_are_unique_by_name_and_revocable(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    let record = |name: &str, sha256: &str| TokenRecord {
        name: name.to_string(),
        role: "operator".into(),
        units: Some("web-*".into()),
        secrets: Some("web-*".into()),
        sha256: sha256.to_string(),
        created: 1_700_000_000,
        expires: Some(1_800_000_000),
    };
    assert!(registry.tokens().await.expect("a fresh store lists none").is_empty());
    assert!(registry.create_token(&record("ci", "aa")).await.expect("create"));
    assert!(registry.create_token(&record("alice", "bb")).await.expect("create"));
    assert!(!registry.create_token(&record("ci", "cc")).await.expect("create"), "a name is taken once");
    let tokens = registry.tokens().await.expect("list");
    assert_eq!(tokens, vec![record("alice", "bb"), record("ci", "aa")]);
    assert!(registry.revoke_token("ci").await.expect("revoke"));
    assert!(!registry.revoke_token("ci").await.expect("revoke"), "already gone");
    assert_eq!(registry.tokens().await.expect("list"), vec![record("alice", "bb")]);
}

/// A secret is written only over the version its writer read (a first one only where there
/// is none), listed in name order, and removed once.
pub async fn secrets_are_set_over_the_version_read(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    let record = |name: &str, version: u64| crate::SecretRecord {
        name: name.to_string(),
        version,
        size: 7,
        set_by: "token:ci".into(),
        set_at: 1_700_000_000 + version,
        sealed: format!("fleet-secret-1:0011223344556677:{name}{version}"),
        kept: (1..version).map(|older| (older, format!("sealed {name}{older}"))).collect(),
    };
    assert!(registry.secrets().await.expect("a fresh store lists none").is_empty());
    assert!(registry.put_secret(&record("db", 1), None).await.expect("put"));
    assert!(!registry.put_secret(&record("db", 1), None).await.expect("put"), "a first value only where none is");
    assert!(registry.put_secret(&record("api", 1), None).await.expect("put"));
    assert!(!registry.put_secret(&record("db", 3), Some(2)).await.expect("put"), "not over a version never read");
    assert!(registry.put_secret(&record("db", 2), Some(1)).await.expect("put"));
    assert!(!registry.put_secret(&record("db", 2), Some(1)).await.expect("put"), "a second writer of 1 loses");
    assert_eq!(registry.secrets().await.expect("list"), vec![record("api", 1), record("db", 2)]);
    assert_eq!(registry.secret("db").await.expect("read"), Some(record("db", 2)));
    let db = registry.secret("db").await.expect("read").expect("db");
    assert_eq!((db.sealed_version(1), db.sealed_version(3)), (Some("sealed db1"), None), "an older version is kept");
    assert_eq!(registry.secret("none").await.expect("read"), None);
    assert!(registry.remove_secret("db").await.expect("remove"));
    assert!(!registry.remove_secret("db").await.expect("remove"), "already gone");
    assert_eq!(registry.secrets().await.expect("list"), vec![record("api", 1)]);
}

/// A registration token is used at most `max_uses` times (each use counted atomically, even
/// when concurrent), never after it expires (the etcd store also drops it then), and not at
/// all once revoked.
pub async fn registrations_are_counted_bounded_and_expire(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let record = |name: &str, sha256: &str, max_uses: Option<u32>, expires: Option<u64>| RegistrationRecord {
        name: name.to_string(),
        sha256: sha256.to_string(),
        created: now,
        expires,
        max_uses,
        uses: 0,
        metadata: [("rack".to_string(), "r1".to_string())].into(),
        machine_ids: None,
    };
    assert!(registry.registrations().await.expect("a fresh store lists none").is_empty());
    assert!(registry.create_registration(&record("rack1", "aa", Some(3), Some(now + 3600))).await.expect("create"));
    assert!(!registry.create_registration(&record("rack1", "bb", None, None)).await.expect("create"), "once");
    assert!(registry.create_registration(&record("brief", "cc", None, Some(now + 1))).await.expect("create"));

    let redeem = |id: &'static str| registry.join_machine("aa", now, id, id);
    let (a, b, c, d, e) = tokio::join!(redeem("j1"), redeem("j2"), redeem("j3"), redeem("j4"), redeem("j5"));
    let uses = [a, b, c, d, e];
    let granted = uses.iter().filter(|used| matches!(used, Ok(Ok(_)))).count();
    let exhausted =
        uses.iter().filter(|used| matches!(used, Ok(Err(JoinRefused::Token(RegistrationRefused::Exhausted))))).count();
    assert_eq!((granted, exhausted), (3, 2), "{uses:?}");
    let listed = registry.registrations().await.expect("list");
    assert_eq!(
        listed.iter().find(|r| r.name == "rack1").map(|r| (r.uses, r.metadata["rack"].clone())),
        Some((3, "r1".into()))
    );
    let unknown = Err(JoinRefused::Token(RegistrationRefused::Unknown));
    assert_eq!(registry.join_machine("zz", now, "j9", "k").await.expect("join"), unknown);

    assert!(registry.join_machine("cc", now, "j6", "k6").await.expect("join").is_ok());
    let expired = Err(JoinRefused::Token(RegistrationRefused::Expired));
    assert_eq!(registry.join_machine("cc", now + 2, "j7", "k7").await.expect("join"), expired);

    assert!(registry.revoke_registration("rack1").await.expect("revoke"));
    assert!(!registry.revoke_registration("rack1").await.expect("revoke"));
    assert_eq!(registry.join_machine("aa", now, "j8", "k8").await.expect("join"), unknown);
}

/// A machine ID belongs to the key that first joined with it: the same key may join again,
/// another may not, until the machine is revoked (which records its key) and forgotten; the
/// token's grants and the IDs it may create hold; two joins of one ID at once bind one key.
pub async fn a_machine_id_belongs_to_the_key_that_first_joined(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let token = |name: &str, sha256: &str, machine_ids: Option<&str>| RegistrationRecord {
        name: name.into(),
        sha256: sha256.into(),
        created: now,
        expires: None,
        max_uses: None,
        uses: 0,
        metadata: [("rack".to_string(), "r9".to_string())].into(),
        machine_ids: machine_ids.map(str::to_string),
    };
    assert!(registry.create_registration(&token("any", "aa", None)).await.expect("create"));
    assert!(registry.create_registration(&token("edge", "bb", Some("edge-*"))).await.expect("create"));
    let join = |sha256: &'static str, id: &'static str, key: &'static str| registry.join_machine(sha256, now, id, key);

    let (first, second) = tokio::join!(join("aa", "m1", "k1"), join("aa", "m1", "k2"));
    let joined: Vec<_> = [first, second].into_iter().filter_map(|answer| answer.expect("join").ok()).collect();
    assert_eq!(joined.len(), 1, "one key takes the ID");
    let (_, identity) = &joined[0];
    assert_eq!(identity.metadata["rack"], "r9", "the token's grant");
    let (owner, other) = if identity.key_sha256 == "k1" { ("k1", "k2") } else { ("k2", "k1") };
    assert_eq!(join("aa", "m1", other).await.expect("join"), Err(JoinRefused::Taken("m1".into())));
    assert!(join("aa", "m1", owner).await.expect("join").is_ok(), "the machine's own key joins again");
    assert_eq!(registry.machine_identity("m1").await.expect("read").map(|i| i.key_sha256), Some(owner.to_string()));

    assert!(join("bb", "edge-1", "k3").await.expect("join").is_ok());
    assert_eq!(
        join("bb", "core-1", "k4").await.expect("join"),
        Err(JoinRefused::NotNamed { pattern: "edge-*".into() })
    );

    let mut bound = registry.machine_identity("edge-1").await.expect("read").expect("bound");
    bound.public_ip = Some("10.0.0.7".into());
    registry.put_machine_identity(&bound).await.expect("put");
    assert_eq!(registry.machine_identity("edge-1").await.expect("read"), Some(bound));

    assert!(!registry.forget_machine("m1").await.expect("forget"), "only a revoked machine is forgotten");
    let revoked = RevokedMachine { id: "m1".into(), at: now, key_sha256: Some(owner.into()), forgotten: false };
    registry.revoke_machine(&revoked).await.expect("revoke");
    assert_eq!(join("aa", "m1", "k5").await.expect("join"), Err(JoinRefused::Revoked("m1".into())));
    assert!(registry.forget_machine("m1").await.expect("forget"));
    assert_eq!(registry.machine_identity("m1").await.expect("read"), None);
    assert_eq!(join("aa", "m1", owner).await.expect("join"), Err(JoinRefused::RevokedKey("m1".into())));
    let (_, renewed) = join("aa", "m1", "k5").await.expect("join").expect("a new key joins once forgotten");
    assert_eq!(renewed.key_sha256, "k5");

    // A machine of the store's own (a member) is bound to it when it registers: no key takes
    // its ID while it is alive, nor once it is gone (issue 67: a stopped member's ID was joined
    // with a plain registration token), until an administrator revokes and forgets it.
    agent_for("etcd-1").register_machine(&machine("etcd-1")).await.expect("register");
    assert_eq!(join("aa", "etcd-1", "k6").await.expect("join"), Err(JoinRefused::Alive("etcd-1".into())));
    let bound = registry.machine_identity("etcd-1").await.expect("read");
    assert!(bound.as_ref().is_some_and(|bound| bound.member && bound.key_sha256.is_empty()), "{bound:?}");
    agent_for("etcd-1").unregister_machine("etcd-1").await.expect("unregister");
    eventually("the member is gone", async || {
        registry.machines().await.is_ok_and(|machines| machines.iter().all(|m| m.id != "etcd-1"))
    })
    .await;
    assert_eq!(join("aa", "etcd-1", "k6").await.expect("join"), Err(JoinRefused::Member("etcd-1".into())));
    agent_for("etcd-1").register_machine(&machine("etcd-1")).await.expect("the member comes back");
    assert!(registry.machine_identity("etcd-1").await.expect("read").is_some_and(|bound| bound.member), "still its");
    agent_for("etcd-1").unregister_machine("etcd-1").await.expect("unregister");
    let revoked = RevokedMachine { id: "etcd-1".into(), at: now, key_sha256: None, forgotten: false };
    registry.revoke_machine(&revoked).await.expect("revoke");
    assert!(registry.forget_machine("etcd-1").await.expect("forget"));
    assert!(join("aa", "etcd-1", "k6").await.expect("join").is_ok(), "an administrator gave the ID up");
    agent_for("m1").register_machine(&machine("m1")).await.expect("register");
    assert!(join("aa", "m1", "k5").await.expect("join").is_ok(), "the live machine's own key");
    assert_eq!(join("aa", "m1", "k7").await.expect("join"), Err(JoinRefused::Alive("m1".into())));
}

/// Revoking a machine records it and removes it and its states in one write; the other
/// machines stay.
pub async fn a_revoked_machine_goes_with_its_states(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    agent_for("m1").register_machine(&machine("m1")).await.expect("register");
    agent_for("m2").register_machine(&machine("m2")).await.expect("register");
    // A global unit: both machines hold it, so both may report it.
    let file = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nGlobal=true\n").expect("a unit file");
    registry.put_unit("a.service", &file, DesiredState::Launched).await.expect("put");
    for id in ["m1", "m2"] {
        eventually("the machine holds the global unit", async || {
            agent_for(id).machine_work(id).await.is_ok_and(|work| !work.globals.is_empty())
        })
        .await;
    }
    let state = |machine: &str| UnitState {
        run: None,
        name: "a.service".into(),
        machine_id: machine.into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    agent_for("m1").report_states("m1", &[StateReport::Set(state("m1"))]).await.expect("report");
    agent_for("m2").report_states("m2", &[StateReport::Set(state("m2"))]).await.expect("report");
    assert!(registry.revoked_machines().await.expect("list").is_empty());
    let revoked = RevokedMachine { id: "m1".into(), at: 1_800_000_000, key_sha256: None, forgotten: false };
    registry.revoke_machine(&revoked).await.expect("revoke");
    let ids = |machines: Vec<MachineState>| machines.into_iter().map(|m| m.id).collect::<Vec<_>>();
    eventually("m1 and its states are gone", async || {
        ids(registry.machines().await.expect("machines")) == ["m2"]
            && registry.unit_states().await.expect("states").iter().all(|s| s.machine_id == "m2")
    })
    .await;
    assert_eq!(registry.unit_states().await.expect("states").len(), 1);
    assert_eq!(registry.revoked_machines().await.expect("list"), vec![revoked]);
}

/// The drift policy a source writes its units with reaches the agents that hold them, for
/// scheduled and global units alike, and stays through desired-state changes.
pub async fn a_sources_drift_policy_reaches_the_agents(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    use fleet_core::drift::DriftPolicy;
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    let reporting =
        Writer::Source { name: "git".into(), take_over: false, drift: DriftPolicy::Report, by: Default::default() };
    registry.put_source(&source_record("git", 1)).await.unwrap();
    let global = UnitFile::parse("[Service]\nExecStart=/bin/g\n\n[X-Fleet]\nGlobal=true\n").expect("a unit file");
    registry.put_unit_as("x.service", &unit("/bin/x"), DesiredState::Launched, &reporting).await.unwrap();
    registry.put_unit_as("g.service", &global, DesiredState::Launched, &reporting).await.unwrap();
    registry.put_unit("h.service", &unit("/bin/h"), DesiredState::Launched).await.unwrap();
    eventually("the engine sees the units", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 3)).await;
    place(registry, "x.service", "m1").await;
    place(registry, "h.service", "m1").await;
    assert!(registry.set_desired_state_as("x.service", DesiredState::Loaded, &reporting).await.unwrap());
    let policies = async || -> Option<Vec<(String, DriftPolicy)>> {
        let work = agent_for("m1").machine_work("m1").await.ok()?;
        let mut policies: Vec<(String, DriftPolicy)> =
            work.scheduled.iter().chain(&work.globals).map(|unit| (unit.name.clone(), unit.drift)).collect();
        policies.sort_by(|a, b| a.0.cmp(&b.0));
        Some(policies)
    };
    let wanted = vec![
        ("g.service".to_string(), DriftPolicy::Report),
        ("h.service".to_string(), DriftPolicy::Correct),
        ("x.service".to_string(), DriftPolicy::Report),
    ];
    eventually("m1 sees each unit's policy", async || policies().await.as_ref() == Some(&wanted)).await;
    let view = registry.unit("x.service").await.unwrap().expect("the unit");
    assert_eq!((view.drift, view.desired), (DriftPolicy::Report, DesiredState::Loaded));
}

/// A unit made by a source is its own: a hand write or another source is refused (and
/// changes nothing) unless it takes the unit over; the unit shows its owner.
/// A write guarded by a plan (`?ifUnchanged=`) is checked by the store inside the write, unit
/// by unit: a unit changed (or created) since the plan is refused in every form of write and
/// keeps what it has; a unit as the plan saw it is written, alone or in a batch beside a
/// refused one.
pub async fn a_write_guarded_by_a_plan_refuses_units_changed_since(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    use crate::PlanGuard;
    registry.put_unit("a.service", &unit("/bin/a"), DesiredState::Launched).await.expect("a");
    registry.put_unit("b.service", &unit("/bin/b"), DesiredState::Launched).await.expect("b");
    let seen = registry.units().await.expect("the plan's view");
    let guarded = Writer::identity("token:ci", false).guarded_by(Arc::new(PlanGuard::of(7, &seen)));
    registry.put_unit("a.service", &unit("/bin/a2"), DesiredState::Launched).await.expect("a changes");
    registry.put_unit("c.service", &unit("/bin/c"), DesiredState::Launched).await.expect("c is made");
    let changed = |result: Result<(), RegistryError>, name: &str| {
        assert!(
            matches!(&result, Err(RegistryError::ChangedSincePlan { unit, index: 7 }) if unit == name),
            "{name}: {result:?}"
        );
    };
    changed(registry.put_unit_as("a.service", &unit("/bin/a3"), DesiredState::Launched, &guarded).await, "a.service");
    changed(registry.set_desired_state_as("a.service", DesiredState::Loaded, &guarded).await.map(drop), "a.service");
    changed(registry.destroy_unit_as("a.service", &guarded).await.map(drop), "a.service");
    changed(registry.put_unit_as("c.service", &unit("/bin/c2"), DesiredState::Launched, &guarded).await, "c.service");
    let view = registry.unit("a.service").await.expect("read").expect("a is kept");
    assert_eq!(
        (view.hash, view.desired),
        (unit("/bin/a2").hash(), DesiredState::Launched),
        "refused writes change nothing"
    );
    let c = registry.unit("c.service").await.expect("read").expect("c is kept");
    assert_eq!(c.hash, unit("/bin/c").hash());
    let batch = [
        crate::UnitChange { name: "b.service".into(), file: None, desired: DesiredState::Loaded },
        crate::UnitChange { name: "a.service".into(), file: None, desired: DesiredState::Loaded },
    ];
    let mut answers = registry.change_units_as(&batch, &guarded).await.expect("the batch is answered").into_iter();
    let (b, a) = (answers.next(), answers.next());
    assert!(matches!(b, Some(Ok(crate::UnitChanged::Written))), "{b:?}");
    changed(a.expect("an answer for a.service").map(drop), "a.service");
    assert_eq!(registry.unit("b.service").await.expect("read").expect("b").desired, DesiredState::Loaded);
    registry.put_unit_as("d.service", &unit("/bin/d"), DesiredState::Launched, &guarded).await.expect("d was absent");
}

pub async fn units_belong_to_the_source_that_made_them(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    let git =
        Writer::Source { name: "git".into(), take_over: false, drift: Default::default(), by: Default::default() };
    let other =
        Writer::Source { name: "other".into(), take_over: false, drift: Default::default(), by: Default::default() };
    registry.put_source(&source_record("git", 1)).await.expect("a source");
    registry.put_source(&source_record("other", 1)).await.expect("a source");
    registry.put_unit_as("a.service", &unit("/bin/a"), DesiredState::Launched, &git).await.expect("a source creates");
    let owner = |view: Option<UnitView>| view.expect("the unit").source;
    assert_eq!(owner(registry.unit("a.service").await.expect("read")), Some("git".into()));
    let refused = registry.put_unit("a.service", &unit("/bin/b"), DesiredState::Launched).await;
    assert!(
        matches!(&refused, Err(RegistryError::Owned { owner: Some(source), .. }) if source == "git"),
        "{refused:?}"
    );
    assert!(matches!(
        registry.set_desired_state("a.service", DesiredState::Loaded).await,
        Err(RegistryError::Owned { .. })
    ));
    assert!(matches!(registry.destroy_unit("a.service").await, Err(RegistryError::Owned { .. })));
    assert!(matches!(
        registry.set_desired_state_as("a.service", DesiredState::Loaded, &other).await,
        Err(RegistryError::Owned { .. })
    ));
    let view = registry.unit("a.service").await.expect("read").expect("the unit");
    assert_eq!(
        (view.hash, view.desired),
        (unit("/bin/a").hash(), DesiredState::Launched),
        "refused writes change nothing"
    );
    assert!(registry.set_desired_state_as("a.service", DesiredState::Loaded, &git).await.expect("its source may"));
    registry.put_unit("b.service", &unit("/bin/b"), DesiredState::Launched).await.expect("by hand");
    assert!(matches!(
        registry.put_unit_as("b.service", &unit("/bin/c"), DesiredState::Launched, &git).await,
        Err(RegistryError::Owned { owner: None, .. })
    ));
    let taking =
        Writer::Source { name: "git".into(), take_over: true, drift: Default::default(), by: Default::default() };
    registry.put_unit_as("b.service", &unit("/bin/b"), DesiredState::Launched, &taking).await.expect("taken over");
    assert_eq!(owner(registry.unit("b.service").await.expect("read")), Some("git".into()));
    let by_hand = Writer::identity("token:ci", true);
    registry.put_unit_as("b.service", &unit("/bin/b"), DesiredState::Launched, &by_hand).await.expect("taken back");
    assert_eq!(owner(registry.unit("b.service").await.expect("read")), None);
    assert!(registry.destroy_unit_as("a.service", &git).await.expect("its source destroys it"));
    // A removed source writes nothing more (a sync under way when it was removed), and keeps
    // no status.
    registry.put_unit_as("c.service", &unit("/bin/c"), DesiredState::Launched, &git).await.expect("a source creates");
    assert!(registry.remove_source("git").await.expect("removed"));
    for refused in [
        registry.put_unit_as("d.service", &unit("/bin/d"), DesiredState::Launched, &git).await,
        registry.set_desired_state_as("c.service", DesiredState::Loaded, &git).await.map(drop),
        registry.destroy_unit_as("c.service", &git).await.map(drop),
    ] {
        assert!(matches!(&refused, Err(RegistryError::SourceRemoved { name }) if name == "git"), "{refused:?}");
    }
    let batch = [UnitChange { name: "d.service".into(), file: Some(unit("/bin/d")), desired: DesiredState::Launched }];
    let answers = registry.change_units_as(&batch, &git).await.expect("tried");
    assert!(matches!(&answers[0], Err(RegistryError::SourceRemoved { .. })), "{answers:?}");
    assert!(registry.unit("d.service").await.expect("read").is_none());
    assert_eq!(registry.unit("c.service").await.expect("read").expect("kept").desired, DesiredState::Launched);
    registry.set_source_status("git", &SourceStatus::default()).await.expect("nothing to do");
    assert!(registry.source_statuses().await.expect("statuses").iter().all(|(name, _)| name != "git"));
}

/// A source named `name`, as stored.
fn source_record(name: &str, generation: u64) -> SourceRecord {
    SourceRecord {
        branch: Some("main".into()),
        paths: vec!["units".into()],
        drift: fleet_core::drift::DriftPolicy::Report,
        deadline_seconds: 300,
        generation,
        forced: 2,
        ..SourceRecord::new(name, "https://git.example/units.git")
    }
}

/// Sources are stored and replaced by name, listed in name order, and removed with their
/// status.
pub async fn sources_and_their_statuses_are_kept_by_name(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    let source = source_record;
    assert!(registry.sources().await.expect("none yet").is_empty());
    registry.put_source(&source("web", 1)).await.expect("store");
    registry.put_source(&source("apps", 1)).await.expect("store");
    registry.put_source(&source("web", 2)).await.expect("replace");
    assert_eq!(registry.sources().await.expect("list"), vec![source("apps", 1), source("web", 2)]);
    let halted = Some("halted on commit abc: its rollout source-web reverted itself (…)".to_string());
    let status = SourceStatus { commit: Some("abc".into()), units: 3, halted, ..SourceStatus::default() };
    registry.set_source_status("web", &status).await.expect("status");
    assert_eq!(registry.source_statuses().await.expect("statuses"), vec![("web".to_string(), status)]);
    assert!(registry.remove_source("web").await.expect("remove"));
    assert!(!registry.remove_source("web").await.expect("remove"), "already gone");
    assert_eq!(registry.sources().await.expect("list"), vec![source("apps", 1)]);
    assert!(registry.source_statuses().await.expect("statuses").is_empty());
}

/// Rollouts are stored and replaced by name, listed in name order, and removed.
pub async fn rollouts_are_kept_by_name(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    use fleet_core::rollout::{MaxUnavailable, Rollout, RolloutState, RolloutUnit, Step};
    let record = |name: &str, state: RolloutState| RolloutRecord {
        name: name.into(),
        rollout: Rollout {
            units: vec![RolloutUnit {
                name: "web@1.service".into(),
                from: unit("/bin/a").hash(),
                to: unit("/bin/b").hash(),
                step: Step::Replacing { since: 7 },
            }],
            max_unavailable: MaxUnavailable::Percent(25),
            min_ready: 5,
            deadline: 60,
            state,
            undo: false,
            canary: None,
            auto_revert: false,
            reverted: None,
            held: None,
        },
        bodies: [(unit("/bin/b").hash().to_string(), unit("/bin/b").serialize())].into(),
        created: 1_700_000_000,
        source_commit: Some(fleet_core::source::halt::RolledFrom { commit: "c0ffee".into(), forced: 1 }),
        secret: None,
        started_by: Some("token:ci".into()),
    };
    assert!(registry.rollouts().await.expect("none yet").is_empty());
    registry.put_rollout(&record("web", RolloutState::Running)).await.expect("store");
    registry.put_rollout(&record("api", RolloutState::Done)).await.expect("store");
    let paused = RolloutState::Paused { reason: "web@1.service is down".into() };
    registry.put_rollout(&record("web", paused.clone())).await.expect("replace");
    assert_eq!(
        registry.rollouts().await.expect("list"),
        vec![Arc::new(record("api", RolloutState::Done)), Arc::new(record("web", paused.clone()))]
    );
    // The driver's step is written only over the record it stepped from (regression: on etcd
    // a pause by hand was overwritten by the step of the record read before it).
    let stepped = record("web", RolloutState::Done);
    let read_before_the_pause = record("web", RolloutState::Running);
    assert!(!registry.put_rollout_over(&stepped, &read_before_the_pause).await.expect("step"), "not over the pause");
    let web = |rollouts: Vec<Arc<RolloutRecord>>| rollouts.into_iter().find(|stored| stored.name == "web");
    assert_eq!(web(registry.rollouts().await.expect("list")), Some(Arc::new(record("web", paused.clone()))));
    assert!(registry.put_rollout_over(&stepped, &record("web", paused)).await.expect("step"), "over what it read");
    assert_eq!(web(registry.rollouts().await.expect("list")), Some(Arc::new(stepped.clone())));
    assert!(
        !registry.put_rollout_over(&record("gone", RolloutState::Done), &stepped).await.expect("step"),
        "none stored"
    );
    assert!(registry.remove_rollout("api").await.expect("remove"));
    assert!(!registry.remove_rollout("api").await.expect("remove"), "already gone");
    assert_eq!(registry.rollouts().await.expect("list").len(), 1);
}

/// A rollout of the most units the API takes (100,000), each with content of its own, is
/// stored, stepped and read back whole: several megabytes, more than one etcd request may carry.
pub async fn a_rollout_of_the_most_units_is_kept_whole(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    use fleet_core::rollout::{MaxUnavailable, Rollout, RolloutState, RolloutUnit, Step};
    const UNITS: usize = 100_000;
    const OWN_CONTENT: usize = 10_000;
    let old = unit("/bin/a").hash();
    let mut bodies = std::collections::BTreeMap::new();
    let units: Vec<RolloutUnit> = (0..UNITS)
        .map(|index| {
            let to = if index < OWN_CONTENT {
                let file = unit(&format!("/usr/local/bin/a-service-of-its-own --instance {index} --with-a-long-line"));
                bodies.insert(file.hash().to_string(), file.serialize());
                file.hash()
            } else {
                unit("/bin/b").hash()
            };
            RolloutUnit {
                name: format!("a-rather-long-unit-name-{index:06}@instance.service"),
                from: old,
                to,
                step: Step::Waiting,
            }
        })
        .collect();
    let mut record = RolloutRecord {
        name: "everything".into(),
        rollout: Rollout {
            units,
            max_unavailable: MaxUnavailable::Percent(10),
            min_ready: 0,
            deadline: 60,
            state: RolloutState::Running,
            undo: false,
            canary: None,
            auto_revert: false,
            reverted: None,
            held: None,
        },
        bodies,
        created: 1_700_000_000,
        source_commit: None,
        secret: None,
        started_by: Some("token:ci".into()),
    };
    registry.put_rollout(&record).await.expect("store a rollout of 100,000 units");
    let read = registry.rollouts().await.expect("list");
    assert!(read.len() == 1 && *read[0] == record, "read back whole");
    // A driver's pass: the first wave is being replaced.
    for unit in record.rollout.units.iter_mut().take(10_000) {
        unit.step = Step::Replacing { since: 1_700_000_100 };
    }
    registry.put_rollout(&record).await.expect("step it");
    let read = registry.rollouts().await.expect("list");
    assert!(read.len() == 1 && *read[0] == record, "read back stepped");
    assert!(registry.remove_rollout("everything").await.expect("remove"));
    assert!(registry.rollouts().await.expect("list").is_empty());
}

/// Writing a source, a source's status or a rollout moves `source_changes`: the engine
/// leader's loops wake on it instead of reading the store on a timer.
pub async fn sources_statuses_and_rollouts_signal_their_changes(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    use fleet_core::rollout::{MaxUnavailable, Rollout, RolloutState};
    let mut changes = registry.source_changes();
    let mut seen = async |what: &str| {
        eventually(what, async || changes.has_changed().unwrap_or(false)).await;
        changes.mark_unchanged();
    };
    registry.put_source(&source_record("web", 1)).await.expect("store");
    seen("a new source moves the signal").await;
    registry.set_source_status("web", &SourceStatus::default()).await.expect("status");
    seen("a status moves the signal").await;
    let rollout = Rollout {
        units: Vec::new(),
        max_unavailable: MaxUnavailable::Percent(25),
        min_ready: 5,
        deadline: 60,
        state: RolloutState::Running,
        undo: false,
        canary: None,
        auto_revert: false,
        reverted: None,
        held: None,
    };
    let record = RolloutRecord {
        name: "web".into(),
        rollout,
        bodies: Default::default(),
        created: 1_700_000_000,
        source_commit: None,
        secret: None,
        started_by: Some("token:ci".into()),
    };
    registry.put_rollout(&record).await.expect("store");
    seen("a rollout moves the signal").await;
    assert!(registry.remove_source("web").await.expect("remove"));
    seen("a removed source moves the signal").await;
}

/// While pages of units and states are read, the unit signal moves on a unit write and on a
/// state report (what the rollout driver wakes on).
pub async fn units_and_states_signal_their_changes_while_paged(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    let agent = agent_for("m1");
    agent.register_machine(&machine("m1")).await.expect("register");
    let mut changes = registry.unit_changes();
    let page = async || {
        registry.units_page(every(0, 10)).await.is_ok() && registry.unit_states_page(every(0, 10), None).await.is_ok()
    };
    eventually("the pages are served", page).await;
    changes.mark_unchanged();
    let file = unit("/bin/sleep 1000");
    registry.put_unit("web.service", &file, DesiredState::Launched).await.expect("put");
    eventually("a unit write moves the signal", async || changes.has_changed().unwrap_or(false)).await;
    eventually("the unit is paged", async || {
        registry.units_page(every(0, 10)).await.is_ok_and(|page| page.items.len() == 1)
    })
    .await;
    changes.mark_unchanged();
    let state = UnitState {
        run: None,
        name: "web.service".into(),
        machine_id: "m1".into(),
        hash: file.hash(),
        systemd: SystemdState::new("loaded", "active", "running"),
        launched: true,
        drift: None,
        health: None,
        secrets: Default::default(),
    };
    agent.report_states("m1", &[StateReport::Set(state)]).await.expect("report");
    eventually("a state report moves the signal", async || changes.has_changed().unwrap_or(false)).await;
    eventually("the state is paged", async || {
        registry.unit_states_page(every(0, 10), None).await.is_ok_and(|page| page.items.len() == 1)
    })
    .await;
}

fn every(start: usize, limit: usize) -> PageRequest {
    PageRequest { start, limit, admits: Arc::new(|_: &str| true), after: None }
}

fn only(name: &str) -> PageRequest {
    let name = name.to_string();
    PageRequest { start: 0, limit: 10, admits: Arc::new(move |unit: &str| unit == name), after: None }
}

/// Every page of `limit` items, one after the other, from what `page` reads.
async fn all_pages<T, F, Fut>(limit: usize, page: F) -> Vec<T>
where
    F: Fn(PageRequest) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T>, RegistryError>>,
{
    let mut items = Vec::new();
    loop {
        let next = page(every(items.len(), limit)).await.expect("a page");
        assert!(next.items.len() <= limit, "a page holds at most its limit");
        let more = next.more;
        items.extend(next.items);
        if !more {
            return items;
        }
    }
}

/// A list read a page at a time is the list: units in name order, unit states in unit then
/// machine order, one machine's states, a filter by name; and a page shows at once what the
/// same store just acknowledged writing.
pub async fn pages_are_the_lists_cut_up(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    for id in ["m1", "m2"] {
        agent_for(id).register_machine(&machine(id)).await.unwrap();
    }
    for n in 0..12 {
        registry
            .put_unit(&format!("u{n:02}.service"), &unit(&format!("/bin/sleep {n}")), DesiredState::Launched)
            .await
            .unwrap();
    }
    let global = UnitFile::parse("[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\n").unwrap();
    registry.put_unit("all.service", &global, DesiredState::Launched).await.unwrap();
    eventually("the engine sees the units", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 13))
        .await;
    let decisions: Vec<Decision> = (0..12)
        .map(|n| Decision::Schedule {
            unit: format!("u{n:02}.service"),
            machine: if n % 2 == 0 { "m1" } else { "m2" }.into(),
        })
        .collect();
    registry.apply(&lease(registry).await, &decisions, &[]).await.unwrap();
    for (id, units) in
        [("m1", vec!["u00.service", "u02.service", "all.service"]), ("m2", vec!["u01.service", "all.service"])]
    {
        let reports = units
            .iter()
            .map(|name| {
                StateReport::Set(UnitState {
                    run: None,
                    name: name.to_string(),
                    machine_id: id.into(),
                    hash: if *name == "all.service" {
                        global.hash()
                    } else {
                        unit(&format!("/bin/sleep {}", &name[1..3].trim_start_matches('0').parse::<u32>().unwrap_or(0)))
                            .hash()
                    },
                    systemd: SystemdState::new("loaded", "active", "running"),
                    launched: true,
                    drift: None,
                    health: None,
                    secrets: Default::default(),
                })
            })
            .collect::<Vec<_>>();
        agent_for(id).report_states(id, &reports).await.unwrap();
    }
    let names = |views: Vec<UnitView>| {
        views.into_iter().map(|view| (view.name, view.machine_id, view.current)).collect::<Vec<_>>()
    };
    let listed = names(registry.units().await.unwrap());
    assert_eq!(listed.len(), 13);
    for limit in [1, 5, 13, 100] {
        eventually("units page by page are the list", async || {
            names(all_pages(limit, |request| registry.units_page(request)).await) == listed
        })
        .await;
    }
    let states = registry.unit_states().await.unwrap();
    assert_eq!(states.len(), 5);
    for limit in [2, 100] {
        eventually("unit states page by page are the list", async || {
            all_pages(limit, |request| registry.unit_states_page(request, None)).await == states
        })
        .await;
    }
    let on_m2: Vec<UnitState> = states.iter().filter(|state| state.machine_id == "m2").cloned().collect();
    assert_eq!(all_pages(1, |request| registry.unit_states_page(request, Some("m2"))).await, on_m2);
    // The states of some units, from every machine, in whatever order the store finds them.
    let named: std::collections::BTreeSet<String> =
        ["all.service", "u01.service", "gone.service"].map(String::from).into();
    let mut of_named: Vec<UnitState> =
        registry.states_of_units(&named).await.unwrap().iter().map(|state| UnitState::clone(state)).collect();
    of_named.sort_by(|a, b| (&a.name, &a.machine_id).cmp(&(&b.name, &b.machine_id)));
    let expected: Vec<UnitState> = states.iter().filter(|state| named.contains(&state.name)).cloned().collect();
    assert_eq!(expected.len(), 3, "all.service on both machines, u01.service on m2");
    assert_eq!(of_named, expected);
    let machines = registry.machines().await.unwrap();
    assert_eq!(machines.len(), 2);
    eventually("machines page by page are the list", async || {
        all_pages(1, |request| registry.machines_page(request)).await == machines
    })
    .await;
    // A page that resumes after the item the page before ended with is the same page.
    let resume =
        |after: &str| PageRequest { start: 999, limit: 2, admits: Arc::new(|_: &str| true), after: Some(after.into()) };
    let resumed = registry.units_page(resume("u03.service")).await.unwrap();
    assert_eq!(resumed.items.iter().map(|view| view.name.as_str()).collect::<Vec<_>>(), ["u04.service", "u05.service"]);
    assert!(resumed.more);
    let resumed = registry.unit_states_page(resume("all.service\0m1"), None).await.unwrap();
    let keys: Vec<(&str, &str)> =
        resumed.items.iter().map(|state| (state.name.as_str(), state.machine_id.as_str())).collect();
    assert_eq!(keys, [("all.service", "m2"), ("u00.service", "m1")]);
    let resumed = registry.unit_states_page(resume("all.service\0m2"), Some("m2")).await.unwrap();
    assert_eq!(resumed.items.iter().map(|state| state.name.as_str()).collect::<Vec<_>>(), ["u01.service"]);
    assert!(!resumed.more);
    let resumed = registry.machines_page(resume("m1")).await.unwrap();
    assert_eq!(resumed.items.iter().map(|machine| machine.id.as_str()).collect::<Vec<_>>(), ["m2"]);
    assert!(!resumed.more);
    let filtered = registry.units_page(PageRequest {
        start: 1,
        limit: 2,
        admits: Arc::new(|name: &str| name.starts_with("u1")),
        after: None,
    });
    let filtered = filtered.await.unwrap();
    assert_eq!(filtered.items.iter().map(|view| view.name.as_str()).collect::<Vec<_>>(), ["u11.service"]);
    assert!(!filtered.more);

    // Read your writes: no waiting.
    registry.put_unit("fresh.service", &unit("/bin/fresh"), DesiredState::Loaded).await.unwrap();
    assert_eq!(
        registry.units_page(only("fresh.service")).await.unwrap().items.len(),
        1,
        "a page shows a write at once"
    );
    registry.destroy_unit("fresh.service").await.unwrap();
    assert!(registry.units_page(only("fresh.service")).await.unwrap().items.is_empty(), "and a destroy");
}

/// `change_units_as`: every change is the write a single call would make, answered on its
/// own; more changes than one store request holds, instances sharing a body, a desired state
/// alone, a unit that is not there, a unit another writer owns; lists show them at once.
pub async fn a_batch_of_unit_writes_is_each_write_alone(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    let git =
        Writer::Source { name: "git".into(), take_over: false, drift: Default::default(), by: Default::default() };
    registry.put_source(&source_record("git", 1)).await.expect("a source");
    registry.put_unit_as("owned.service", &unit("/bin/owned"), DesiredState::Loaded, &git).await.expect("a source");
    registry.put_unit("old.service", &unit("/bin/old"), DesiredState::Launched).await.expect("by hand");
    let template = unit("/bin/sleep %i");
    let mut changes: Vec<UnitChange> = (0..300)
        .map(|index| UnitChange {
            name: format!("batch@{index:03}.service"),
            file: Some(template.clone()),
            desired: DesiredState::Inactive,
        })
        .collect();
    changes.push(UnitChange {
        name: "old.service".into(),
        file: Some(unit("/bin/new")),
        desired: DesiredState::Loaded,
    });
    changes.push(UnitChange {
        name: "owned.service".into(),
        file: Some(unit("/bin/mine")),
        desired: DesiredState::Loaded,
    });
    changes.push(UnitChange { name: "absent.service".into(), file: None, desired: DesiredState::Launched });
    let answers = registry.change_units_as(&changes, &Writer::BY_HAND).await.expect("the batch is tried");
    assert_eq!(answers.len(), changes.len());
    assert!(answers[..301].iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))), "{:?}", &answers[..301]);
    assert!(matches!(&answers[301], Err(RegistryError::Owned { owner: Some(source), .. }) if source == "git"));
    assert!(matches!(answers[302], Ok(UnitChanged::NoSuchUnit)));
    // Read your writes: the list shows every one at once, with its body.
    let batch = |name: &str| name.starts_with("batch@");
    let listed = registry
        .units_page(PageRequest { start: 0, limit: 1000, admits: Arc::new(batch), after: None })
        .await
        .expect("a page");
    assert_eq!(listed.items.len(), 300);
    assert!(listed.items.iter().all(|view| view.hash == template.hash() && view.desired == DesiredState::Inactive));
    let view = |name: &'static str| async move { registry.unit(name).await.expect("read").expect("the unit") };
    assert_eq!(
        (view("old.service").await.hash, view("old.service").await.desired),
        (unit("/bin/new").hash(), DesiredState::Loaded)
    );
    assert_eq!(view("owned.service").await.hash, unit("/bin/owned").hash(), "a refused change changes nothing");
    assert!(registry.unit("absent.service").await.expect("read").is_none());
    // A desired state alone, for units there.
    let launch: Vec<UnitChange> = (0..300)
        .map(|index| UnitChange {
            name: format!("batch@{index:03}.service"),
            file: None,
            desired: DesiredState::Launched,
        })
        .collect();
    let answers = registry.change_units_as(&launch, &Writer::BY_HAND).await.expect("the batch is tried");
    assert!(answers.iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))));
    let launched = registry.units().await.expect("units");
    assert_eq!(
        launched.iter().filter(|view| batch(&view.name) && view.desired == DesiredState::Launched).count(),
        300,
        "every desired state set, content kept"
    );
    assert!(launched.iter().filter(|view| batch(&view.name)).all(|view| view.hash == template.hash()));
    // A unit changed twice in one batch, the changes a store request apart (a store that
    // writes several requests at once must not let the first land last): the later wins.
    let mut twice: Vec<UnitChange> = (0..300)
        .map(|index| UnitChange {
            name: format!("batch@{index:03}.service"),
            file: Some(unit("/bin/sleep 5 %i")),
            desired: DesiredState::Launched,
        })
        .collect();
    twice[0] =
        UnitChange { name: "twice.service".into(), file: Some(unit("/bin/first")), desired: DesiredState::Loaded };
    twice[150] =
        UnitChange { name: "twice.service".into(), file: Some(unit("/bin/second")), desired: DesiredState::Launched };
    let answers = registry.change_units_as(&twice, &Writer::BY_HAND).await.expect("the batch is tried");
    assert!(answers.iter().all(|answer| matches!(answer, Ok(UnitChanged::Written))), "{answers:?}");
    let last = view("twice.service").await;
    assert_eq!((last.hash, last.desired), (unit("/bin/second").hash(), DesiredState::Launched), "the later change");
}

/// A unit record that cannot be read hides itself, and nothing else: every listing, page and
/// snapshot goes on with the others, and the unit can still be destroyed. `corrupt` writes
/// something that is not a unit record where the store keeps `bad.service`'s.
pub async fn an_unreadable_unit_hides_only_itself(registry: &dyn Registry, corrupt: impl AsyncFnOnce()) {
    registry.register_machine(&machine("m1")).await.expect("register");
    registry.put_unit("bad.service", &unit("/bin/true"), DesiredState::Launched).await.expect("put");
    registry.put_unit("good.service", &unit("/bin/sleep 1000"), DesiredState::Launched).await.expect("put");
    place(registry, "good.service", "m1").await;
    corrupt().await;
    let only_good = vec!["good.service".to_string()];
    eventually("every reading shows the good unit alone", async || {
        let names = |names: Vec<String>| names == only_good;
        let listed = registry.units().await.map(|views| views.into_iter().map(|view| view.name).collect());
        let request = PageRequest { start: 0, limit: 10, admits: Arc::new(|_: &str| true), after: None };
        let paged = registry.units_page(request).await.map(|page| page.items.into_iter().map(|v| v.name).collect());
        let planned = registry.snapshot().await.map(|snapshot| snapshot.units.into_iter().map(|u| u.name).collect());
        let work = registry.machine_work("m1").await.map(|work| work.scheduled.into_iter().map(|u| u.name).collect());
        listed.is_ok_and(names) && paged.is_ok_and(names) && planned.is_ok_and(names) && work.is_ok_and(names)
    })
    .await;
    assert!(registry.machines().await.is_ok_and(|machines| machines.len() == 1));
    assert!(registry.destroy_unit("bad.service").await.expect("destroy"), "the unreadable unit can be destroyed");
    registry.put_unit("bad.service", &unit("/bin/true"), DesiredState::Loaded).await.expect("put again");
    eventually("the unit written again is listed", async || registry.units().await.is_ok_and(|views| views.len() == 2))
        .await;
}

/// A store records its format once, by compare-and-swap: nothing recorded at first (a store of
/// fleet 0.1), then what one fleetd recorded; a fleetd that expected another record records
/// nothing. Leaves format 2 recorded, for the caller to find again on reopening.
pub async fn a_store_records_its_format_once(record: &dyn crate::FormatRecord) {
    use fleet_core::store_format::StoredFormat;
    let one = StoredFormat { format: 1, oldest_fleetd: 1 };
    let two = StoredFormat { format: 2, oldest_fleetd: 1 };
    assert_eq!(record.stored_format().await.expect("read"), None, "a new store records nothing");
    assert!(record.record_format(None, one).await.expect("record"), "the first record is written");
    assert!(!record.record_format(None, two).await.expect("record"), "not over another's record");
    assert_eq!(record.stored_format().await.expect("read"), Some(one));
    assert!(record.record_format(Some(one), two).await.expect("record"), "a migration's record replaces it");
    assert_eq!(record.stored_format().await.expect("read"), Some(two));
}

/// An import writes every unit with its placement (the machine's work has it, the engine's
/// snapshot shows it placed), or nothing at all when one of its names is taken; enough units
/// to take several of a store's transactions.
pub async fn an_import_writes_its_units_where_they_run_or_nothing(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    registry.put_unit("taken.service", &unit("/bin/sleep 1"), DesiredState::Inactive).await.unwrap();
    let imported = |name: String, machine: Option<&str>| ImportedUnit {
        file: unit(&format!("/bin/sleep {}", name.len())),
        name,
        desired: DesiredState::Launched,
        machine: machine.map(str::to_string),
    };
    let mut units: Vec<ImportedUnit> =
        (0..300).map(|index| imported(format!("app-{index:03}.service"), Some("m1"))).collect();
    units.push(imported("waits.service".into(), None));
    let mut with_taken = units.clone();
    with_taken.insert(150, imported("taken.service".into(), Some("m1")));
    assert_eq!(
        registry.import_units(&with_taken, &Writer::BY_HAND).await.unwrap(),
        Imported::Existing(vec!["taken.service".to_string()])
    );
    assert!(registry.unit("app-000.service").await.unwrap().is_none(), "an import refused wrote a unit");
    assert_eq!(registry.import_units(&units, &Writer::BY_HAND).await.unwrap(), Imported::Written);
    let placed = registry.unit("app-299.service").await.unwrap().expect("an imported unit");
    assert_eq!((placed.machine_id.as_deref(), placed.desired), (Some("m1"), DesiredState::Launched));
    assert_eq!(registry.unit("waits.service").await.unwrap().expect("an imported unit").machine_id, None);
    eventually("m1's work has every imported unit placed there", async || {
        agent_for("m1").machine_work("m1").await.is_ok_and(|work| work.scheduled.len() == 300)
    })
    .await;
    eventually("the engine sees them placed", async || {
        registry.snapshot().await.is_ok_and(|snapshot| {
            snapshot.units.iter().filter(|unit| unit.machine_id.as_deref() == Some("m1")).count() == 300
        })
    })
    .await;
    assert_eq!(
        registry.import_units(&units[..1], &Writer::BY_HAND).await.unwrap(),
        Imported::Existing(vec!["app-000.service".to_string()]),
        "an import again finds its units there"
    );
    // Large unit files, more of them than one request to the store may carry.
    let large: Vec<ImportedUnit> = (0..60)
        .map(|index| ImportedUnit {
            name: format!("large-{index:02}.service"),
            file: UnitFile::parse(&format!(
                "[Service]\nExecStart=/bin/echo {index}\n{}",
                (0..15).map(|line| format!("Environment=K{line}={}\n", "x".repeat(2_000))).collect::<String>()
            ))
            .expect("a large unit file"),
            desired: DesiredState::Launched,
            machine: Some("m1".to_string()),
        })
        .collect();
    assert_eq!(registry.import_units(&large, &Writer::BY_HAND).await.unwrap(), Imported::Written);
    let last = registry.unit("large-59.service").await.unwrap().expect("the last large unit");
    assert_eq!(last.hash, large[59].file.hash());
}

/// A job record is written only over the version read (0: none), and only by the engine
/// leader: the one way a run is claimed, so that no elapse is claimed twice.
pub async fn job_records_are_replaced_only_over_the_version_read(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    use fleet_core::job::runs::JobRecord;
    agent_for("m1").register_machine(&machine("m1")).await.unwrap();
    let lease = lease(registry).await;
    assert_eq!(registry.job_records().await.unwrap(), vec![]);
    let first = JobRecord::new(1_000);
    assert!(registry.put_job_record(&lease, "backup.service", Some(&first), 0).await.unwrap(), "a new record");
    let stored = registry.job_records().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0].unit.as_str(), &stored[0].record), ("backup.service", &first));
    let version = stored[0].version;
    assert!(version > 0);
    assert!(!registry.put_job_record(&lease, "backup.service", Some(&first), 0).await.unwrap(), "one exists");
    let mut claimed = first.clone();
    claimed.cursor = 2_000;
    assert!(registry.put_job_record(&lease, "backup.service", Some(&claimed), version).await.unwrap());
    let newer = registry.job_records().await.unwrap()[0].clone();
    assert_eq!(newer.record, claimed);
    assert_ne!(newer.version, version);
    assert!(
        !registry.put_job_record(&lease, "backup.service", Some(&first), version).await.unwrap(),
        "a write over a version read before another write is refused"
    );
    let stale = EngineLease { machine_id: "m9".into(), token: lease.token + 1_000 };
    let refused = registry.put_job_record(&stale, "backup.service", None, newer.version).await;
    assert!(matches!(refused, Err(RegistryError::LeadershipLost)), "{refused:?}");
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("leads again");
    assert!(registry.put_job_record(&lease, "backup.service", None, newer.version).await.unwrap(), "removed");
    assert_eq!(registry.job_records().await.unwrap(), vec![]);
}

/// The ticket of a global unit on a calendar reaches every machine's work with the unit, is
/// written only under the leadership, and goes when removed.
pub async fn a_run_ticket_reaches_every_machine_with_its_global_unit(registry: &dyn Registry, agent_for: AgentFor<'_>) {
    use fleet_core::job::global_runs::RunTicket;
    for id in ["m1", "m2"] {
        agent_for(id).register_machine(&machine(id)).await.unwrap();
    }
    let sweep = UnitFile::parse("[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\nSchedule=daily\n").unwrap();
    registry.put_unit("sweep.service", &sweep, DesiredState::Launched).await.unwrap();
    let lease = lease(registry).await;
    assert_eq!(registry.run_tickets().await.unwrap(), BTreeMap::new());
    let ticket = RunTicket { id: 3, elapse: 1_796_342_400_000_000 };
    registry.put_run_ticket(&lease, "sweep.service", Some(&ticket)).await.unwrap();
    assert_eq!(registry.run_tickets().await.unwrap(), BTreeMap::from([("sweep.service".to_string(), ticket)]));
    for id in ["m1", "m2"] {
        eventually("the machine's work carries the ticket", async || {
            agent_for(id).machine_work(id).await.is_ok_and(|work| {
                work.globals.iter().any(|unit| unit.name == "sweep.service" && unit.run == Some(ticket))
            })
        })
        .await;
    }
    let stale = EngineLease { machine_id: "m9".into(), token: lease.token + 1_000 };
    let refused = registry.put_run_ticket(&stale, "sweep.service", None).await;
    assert!(matches!(refused, Err(RegistryError::LeadershipLost)), "{refused:?}");
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("leads again");
    registry.put_run_ticket(&lease, "sweep.service", None).await.unwrap();
    assert_eq!(registry.run_tickets().await.unwrap(), BTreeMap::new());
    eventually("the ticket is gone from the work", async || {
        agent_for("m1")
            .machine_work("m1")
            .await
            .is_ok_and(|work| work.globals.iter().any(|unit| unit.name == "sweep.service" && unit.run.is_none()))
    })
    .await;
}

/// The leading engine's record of machines out of touch that units wait for: replaced whole,
/// read back by the engine and listed by the API, written only under the leadership.
pub async fn machines_out_of_touch_are_recorded_by_the_leader_and_listed(
    registry: &dyn Registry,
    _agent_for: AgentFor<'_>,
) {
    use fleet_core::OutOfTouch;
    let lease = lease(registry).await;
    assert_eq!(registry.machines_out_of_touch().await.unwrap(), vec![]);
    let gone = |id: &str, since: i64| OutOfTouch {
        id: id.into(),
        since,
        last: Some(machine(id)),
        units: vec![format!("{id}-db.service"), format!("{id}-web.service")],
    };
    registry.record_out_of_touch(&lease, &[gone("m7", 1_000), gone("m8", 2_000)]).await.unwrap();
    eventually("the API lists both", async || {
        registry.machines_out_of_touch().await.is_ok_and(|listed| listed == [gone("m7", 1_000), gone("m8", 2_000)])
    })
    .await;
    assert_eq!(registry.recorded_out_of_touch().await.unwrap(), [gone("m7", 1_000), gone("m8", 2_000)]);
    registry.record_out_of_touch(&lease, &[gone("m8", 2_000)]).await.unwrap();
    eventually("m7 is back: gone from the list", async || {
        registry.machines_out_of_touch().await.is_ok_and(|listed| listed == [gone("m8", 2_000)])
    })
    .await;
    let stale = EngineLease { machine_id: "m9".into(), token: lease.token + 1_000 };
    let refused = registry.record_out_of_touch(&stale, &[]).await;
    assert!(matches!(refused, Err(RegistryError::LeadershipLost)), "{refused:?}");
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("leads again");
    assert_eq!(registry.recorded_out_of_touch().await.unwrap(), [gone("m8", 2_000)]);
    registry.record_out_of_touch(&lease, &[]).await.unwrap();
    eventually("none is left", async || registry.machines_out_of_touch().await.is_ok_and(|listed| listed.is_empty()))
        .await;
}

/// The leading engine's record of silent departures: replaced whole, read back by a leader
/// that takes over, written only under the leadership.
pub async fn silent_departures_are_recorded_by_the_leader(registry: &dyn Registry, _agent_for: AgentFor<'_>) {
    use crate::SilentDeparture;
    let lease = lease(registry).await;
    assert_eq!(registry.recorded_silent_departures().await.unwrap(), vec![]);
    let leaving = |unit: &str, machine: &str| SilentDeparture { unit: unit.into(), machine: machine.into() };
    registry.record_silent_departures(&lease, &[leaving("a.service", "m1"), leaving("b.service", "m2")]).await.unwrap();
    assert_eq!(
        registry.recorded_silent_departures().await.unwrap(),
        [leaving("a.service", "m1"), leaving("b.service", "m2")]
    );
    registry.record_silent_departures(&lease, &[leaving("b.service", "m3")]).await.unwrap();
    assert_eq!(registry.recorded_silent_departures().await.unwrap(), [leaving("b.service", "m3")]);
    let stale = EngineLease { machine_id: "m9".into(), token: lease.token + 1_000 };
    let refused = registry.record_silent_departures(&stale, &[]).await;
    assert!(matches!(refused, Err(RegistryError::LeadershipLost)), "{refused:?}");
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("leads again");
    assert_eq!(registry.recorded_silent_departures().await.unwrap(), [leaving("b.service", "m3")]);
    registry.record_silent_departures(&lease, &[]).await.unwrap();
    assert_eq!(registry.recorded_silent_departures().await.unwrap(), vec![]);
}

/// The leading engine's record of where what a unit requires runs: carried by the work of the
/// machine the unit is placed on (which it wakes, and no other), read by the API for that
/// machine, read back by a leader, written only under the leadership.
pub async fn where_requirements_run_reaches_the_machine_of_their_unit(
    registry: &dyn Registry,
    agent_for: AgentFor<'_>,
) {
    use crate::{RequiredPlace, RequiredPlaces};
    for id in ["m1", "m2"] {
        agent_for(id).register_machine(&machine(id)).await.unwrap();
    }
    registry.put_unit("app.service", &unit("/bin/sleep 1000"), DesiredState::Launched).await.unwrap();
    eventually("the engine sees the unit", async || registry.snapshot().await.is_ok_and(|s| s.units.len() == 1)).await;
    place(registry, "app.service", "m1").await;
    let work_of = async |id: &str| {
        let work = agent_for(id).machine_work(id).await.ok()?;
        work.scheduled.into_iter().find(|unit| unit.name == "app.service").map(|unit| unit.required_at)
    };
    eventually("m1's work has the unit", async || work_of("m1").await.is_some()).await;
    // m2's own registration is behind it before its wake-ups are counted.
    eventually("m2's work can be read", async || agent_for("m2").machine_work("m2").await.is_ok()).await;
    assert_eq!(work_of("m1").await, Some(vec![]), "nothing recorded yet");
    let (mut m1, mut m2) = (agent_for("m1").machine_changes("m1"), agent_for("m2").machine_changes("m2"));
    m1.mark_unchanged();
    m2.mark_unchanged();
    let lease = lease(registry).await;
    let db = RequiredPlace { unit: "db.service".into(), machine_id: "m2".into(), public_ip: "10.0.0.2".into() };
    let record = RequiredPlaces { unit: "app.service".into(), machine: "m1".into(), places: vec![db.clone()] };
    registry.record_required_places(&lease, std::slice::from_ref(&record)).await.unwrap();
    eventually("m1's work names where the db runs", async || work_of("m1").await == Some(vec![db.clone()])).await;
    eventually("m1 is woken", async || m1.has_changed().unwrap_or(false)).await;
    assert!(!m2.has_changed().unwrap_or(false), "m2 was woken by a record of m1's unit");
    eventually("the API reads it for m1", async || {
        registry.required_places_of("app.service", "m1").await.is_ok_and(|places| places == [db.clone()])
    })
    .await;
    assert_eq!(registry.required_places_of("app.service", "m2").await.unwrap(), vec![], "not placed there");
    assert_eq!(registry.recorded_required_places().await.unwrap(), vec![record]);
    let stale = EngineLease { machine_id: "m9".into(), token: lease.token + 1_000 };
    let refused = registry.record_required_places(&stale, &[]).await;
    assert!(matches!(refused, Err(RegistryError::LeadershipLost)), "{refused:?}");
    let lease = registry.acquire_leadership("m1").await.unwrap().expect("leads again");
    registry.record_required_places(&lease, &[]).await.unwrap();
    eventually("the record is gone from m1's work", async || work_of("m1").await == Some(vec![])).await;
    assert_eq!(registry.recorded_required_places().await.unwrap(), vec![]);
}

/// Events come back in the order their batches were stored, each batch in its own order, from
/// any index on and a page at a time; their signal moves when a batch is stored; trimming
/// takes whole batches, oldest first, by count and by age, and says how far it went, so that
/// a reader resuming from before it learns that it missed events.
pub async fn events_are_one_stream_read_from_any_index_and_trimmed_oldest_first(
    registry: &dyn Registry,
    _agent_for: AgentFor<'_>,
) {
    use fleet_core::events::{EventKind, EventPage, NewEvent};
    let event = |second: i64, unit: &str| {
        NewEvent::new(second * 1_000_000, EventKind::Placed, format!("e{second}")).of_unit(unit).on_machine("m1")
    };
    let read = async |after: u64, limit: usize| registry.events_after(after, limit).await.expect("events read");
    let messages = |page: &EventPage| page.events.iter().map(|e| e.event.message.clone()).collect::<Vec<_>>();
    let mut changes = registry.event_changes();
    changes.borrow_and_update();
    registry.append_events(&[event(1, "a.service"), event(2, "b.service")]).await.expect("a batch");
    registry.append_events(&[event(3, "a.service")]).await.expect("another");
    registry.append_events(&[]).await.expect("no batch at all");
    eventually("both batches are read back", async || read(0, 100).await.events.len() == 3).await;
    assert!(changes.has_changed().expect("the signal lives"), "storing a batch moves the signal");

    let page = read(0, 100).await;
    assert_eq!(messages(&page), ["e1", "e2", "e3"]);
    let indexes: Vec<u64> = page.events.iter().map(|e| e.index).collect();
    assert!(indexes.windows(2).all(|pair| pair[0] < pair[1]), "indexes grow: {indexes:?}");
    assert!(page.oldest.is_some_and(|oldest| oldest <= indexes[0]));
    assert_eq!((page.trimmed_through, page.more), (0, false));
    assert_eq!(page.events[0].event, event(1, "a.service"));
    assert_eq!(messages(&read(indexes[0], 100).await), ["e2", "e3"]);
    assert_eq!(messages(&read(indexes[2], 100).await), Vec::<String>::new());
    let first_two = read(0, 2).await;
    assert_eq!((messages(&first_two), first_two.more), (vec!["e1".to_string(), "e2".to_string()], true));
    // Backwards, newest first, from before any index: what a view of the latest reads.
    let before = async |before: u64, limit: usize| {
        let events = registry.events_before(before, limit).await.expect("events read back");
        events.iter().map(|e| (e.index, e.event.message.clone())).collect::<Vec<_>>()
    };
    let newest_first: Vec<(u64, String)> =
        page.events.iter().rev().map(|e| (e.index, e.event.message.clone())).collect();
    assert_eq!(before(u64::MAX, 100).await, newest_first);
    assert_eq!(before(u64::MAX, 2).await, newest_first[..2]);
    assert_eq!(before(indexes[2], 100).await, newest_first[1..], "inside a batch's range and between batches");
    assert_eq!(before(indexes[1], 1).await, newest_first[2..]);
    assert_eq!(before(indexes[0], 100).await, Vec::<(u64, String)>::new());

    // The newest one kept: the first batch goes whole, and readers from before it are told.
    assert_eq!(registry.trim_events(1, 0).await.expect("a trim"), 2);
    eventually("the first batch is gone", async || messages(&read(0, 100).await) == ["e3"]).await;
    let page = read(0, 100).await;
    assert_eq!(page.trimmed_through, indexes[1]);
    assert!(!page.missed_after(0) && page.missed_after(indexes[0]) && !page.missed_after(indexes[1]));
    assert_eq!(page.oldest, Some(indexes[2] - indexes[2] % fleet_core::events::PER_BATCH));

    // By age: what was made before second 4 goes; what comes after still follows it.
    assert_eq!(registry.trim_events(100, 4_000_000).await.expect("a trim"), 1);
    eventually("every event is gone", async || read(0, 100).await.events.is_empty()).await;
    registry.append_events(&[event(5, "c.service")]).await.expect("a batch after");
    eventually("the new one is read", async || read(indexes[2], 100).await.events.len() == 1).await;
    let page = read(0, 100).await;
    assert!(page.events[0].index > indexes[2] && page.trimmed_through == indexes[2]);
}
