//! The native supervisor's side of an upgrade in place: parking every unit's runner, handing
//! the units over to the next image of fleetd and `execve`; in that image, taking them over
//! as they run. A unit that could not be handed over (it was starting or stopping, or is
//! gone) is killed by the next image and started again by its agent.

use std::collections::BTreeSet;
use std::io;
use std::time::Duration;

use fleet_core::{SystemdState, UnitFile};

use super::handover::{self, HandedProcess, HandedUnit, Handover, ParkedProcess};
use super::keeper::KeeperPipe;
use super::main_process::{AdoptedChild, MainProcess, parent_of};
use super::process::{copy_handed_output, kill_unit_leftovers};
use super::{NativeManager, ServiceConfig, Slot};
use crate::reexec::Reexec;

/// How long a unit that is starting or stopping has to settle before the upgrade goes on
/// without it.
const PARK_WAIT: Duration = Duration::from_secs(30);

/// A handover read by the next image.
pub struct Handed {
    handover: Handover,
}

impl Handed {
    pub fn of(handover: Handover) -> Self {
        Self { handover }
    }

    /// The keeper's pipes, if they were handed over and are still pipes (taken once).
    pub fn take_keeper(&mut self) -> Option<KeeperPipe> {
        let (input, acknowledgements) = self.handover.keeper.take()?;
        let pipe = KeeperPipe::adopt(input, acknowledgements);
        if pipe.is_none() {
            tracing::warn!("the keeper's pipes handed over are gone: starting a new keeper");
        }
        pipe
    }

    /// The units handed over, whose processes run on.
    pub fn names(&self) -> BTreeSet<String> {
        self.handover.units.iter().map(|unit| unit.name.clone()).collect()
    }
}

impl NativeManager {
    /// Takes over the units an earlier image handed over, each as it runs; one that cannot
    /// be (its file or processes are not what was handed over) is killed, for its agent to
    /// start again. Then reaps every other child of the earlier image.
    pub(super) fn take_over(&self, handed: Handed) {
        let mut adopted = Vec::new();
        let mut taken = 0;
        for unit in handed.handover.units {
            let name = unit.name.clone();
            match self.take_over_unit(unit) {
                Ok(pid) => {
                    taken += 1;
                    adopted.extend(pid);
                }
                Err(reason) => {
                    tracing::warn!(
                        unit = name,
                        "cannot take over the unit as it runs ({reason}): it is stopped, to start again"
                    );
                    self.kill_unit_processes(&name);
                    if let Some(slot) = self.shared.slots().get_mut(&name) {
                        slot.log.line(
                            "fleetd",
                            None,
                            &format!("{name}: not taken over by the upgraded fleetd ({reason}); stopped"),
                        );
                        slot.state = SystemdState::new("loaded", "failed", "failed");
                    }
                }
            }
        }
        tracing::info!(units = taken, "took over the units the previous fleetd handed over, as they run");
        reap_other_children(&adopted);
        self.shared.changed();
    }

    /// One unit: its slot as `load` makes it, its runner resumed on its processes. The
    /// main process's PID when it has one.
    fn take_over_unit(&self, unit: HandedUnit) -> Result<Option<u32>, String> {
        let file = UnitFile::from_options(unit.options);
        if file.hash() != unit.hash {
            return Err("its unit file does not read back the same".into());
        }
        let config = ServiceConfig::from_unit(&unit.name, &file).map_err(|error| error.to_string())?.0;
        let log = self.log_sink(&unit.name);
        let (parked, main_pid) = match unit.process {
            HandedProcess::Main { pid, output, ident } => {
                let main = AdoptedChild::adopt(pid).map_err(|error| error.to_string())?;
                let output = copy_handed_output(&output, &log, &ident, pid);
                (ParkedProcess::Main { main: Box::new(MainProcess::Adopted(main)), output, ident }, Some(pid))
            }
            HandedProcess::Forking { pgid, main_pid } => (ParkedProcess::Forking { pgid, main_pid }, None),
            HandedProcess::Exited => (ParkedProcess::Exited, None),
        };
        let slot = Slot {
            hash: unit.hash,
            file,
            config: Ok(config),
            state: SystemdState::new("loaded", &unit.active, &unit.sub),
            generation: self.shared.next_generation(),
            running: None,
            log,
            last_end: None,
            since: fleet_runtime::wall_clock::now_micros(),
            main_pid,
        };
        self.shared.slots().insert(unit.name.clone(), slot);
        self.launch(&unit.name, Some(parked)).map_err(|error| error.to_string())?;
        Ok(main_pid)
    }

    fn kill_unit_processes(&self, unit: &str) {
        if let Some(base) = &self.shared.cgroups {
            base.kill_unit(unit);
        }
        kill_unit_leftovers(&self.shared.marker, unit);
    }

    /// Parks every runner, hands the units over and replaces fleetd with `reexec`. Returns
    /// only if that failed: the units are then supervised on as before.
    pub(super) async fn hand_over_and_exec(&self, reexec: &Reexec) -> io::Error {
        let image = match reexec.image() {
            Ok(image) => image,
            Err(error) => return error,
        };
        let running = self.take_running();
        for (_, unit) in &running {
            let _ = unit.park.send(true);
        }
        let deadline = tokio::time::Instant::now() + PARK_WAIT;
        let mut parked = Vec::new();
        let mut unsettled = Vec::new();
        for (name, mut unit) in running {
            match tokio::time::timeout_at(deadline, &mut unit.done).await {
                Ok(Ok(Some(process))) => parked.push((name, process)),
                // It ended meanwhile (its state says how).
                Ok(_) => {}
                Err(_) => unsettled.push((name, unit)),
            }
        }
        // Held until the exec: no fence line is half written when the image goes.
        let keeper_pipe = self.shared.keeper_pipe.lock().await;
        let handover = {
            let slots = self.shared.slots();
            Handover::of(
                &reexec.nonce,
                keeper_pipe.as_ref().map(KeeperPipe::descriptors),
                parked.iter().filter_map(|(name, process)| {
                    let slot = slots.get(name)?;
                    let state = (slot.state.active.clone(), slot.state.sub.clone());
                    Some((name.as_str(), slot.file.options().to_vec(), slot.hash, state, process))
                }),
            )
        };
        let written = handover.write(&self.shared.state_dir);
        let error = match written {
            Ok(()) => {
                let unsettled_names: Vec<&str> = unsettled.iter().map(|(name, _)| name.as_str()).collect();
                tracing::info!(
                    handed_over = handover.units.len(),
                    starting_or_stopping = ?unsettled_names,
                    "replacing fleetd in place: the units run on"
                );
                let error = self.shared.spawner.exec(image, handover.descriptors()).await;
                handover::discard(&self.shared.state_dir);
                error
            }
            Err(error) => error,
        };
        drop(keeper_pipe);
        // Still this image: every unit goes on as it was.
        for (name, unit) in unsettled {
            let _ = unit.park.send(false);
            if let Some(slot) = self.shared.slots().get_mut(&name) {
                slot.running = Some(unit);
            }
        }
        for (name, process) in parked {
            if let Err(reason) = self.launch(&name, Some(process)) {
                tracing::warn!(unit = name, %reason, "cannot go on supervising the unit: it is stopped");
                self.kill_unit_processes(&name);
            }
        }
        error
    }
}

/// Kills and reaps every child of this process but `kept` and the keeper: what the earlier
/// image's other threads had running (health checks, commands of units that were starting
/// or stopping), which nothing here waits for.
fn reap_other_children(kept: &[u32]) {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for pid in entries.flatten().filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok()) {
        if kept.contains(&pid) || parent_of(pid).ok() != Some(own) || is_keeper(pid) {
            continue;
        }
        super::process::signal_process(pid, libc::SIGKILL);
        if let Ok(child) = AdoptedChild::adopt(pid) {
            tokio::spawn(async move {
                let _ = MainProcess::Adopted(child).wait().await;
            });
        }
    }
}

/// Whether `pid` runs as a keeper (`fleetd --native-unit-keeper`).
fn is_keeper(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| cmdline.split(|byte| *byte == 0).any(|arg| arg == super::KEEPER_ARGUMENT.as_bytes()))
}
