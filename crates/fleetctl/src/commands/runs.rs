//! `fleetctl runs UNIT`: a unit's calendar, when it next runs, and its runs; `fleetctl run
//! UNIT`: a run of it now (our additions).

use fleet_api_schema::{RunMachines, UnitRuns};

use fleet_core::unit_name::mangle;

use crate::Outcome;
use crate::context::Context;
use crate::output::{OutputFormat, print_json};
use crate::table::tab_table;

pub async fn run(context: &Context, argument: &str) -> Outcome {
    let name = mangle(argument);
    match context.client.start_run(&name).await {
        Ok(run) => {
            println!("Started run {} of {name}; fleetctl runs {name} shows how it ends", run.id);
            Outcome::Success
        }
        Err(error) if error.is_not_found() => {
            eprintln!("Unit {name} does not exist.");
            Outcome::Failure
        }
        Err(error) => {
            eprintln!("Error starting a run of {name}: {error}");
            Outcome::Failure
        }
    }
}

pub async fn runs(context: &Context, argument: &str, output: OutputFormat) -> Outcome {
    let name = mangle(argument);
    let runs = match context.client.unit_runs(&name).await {
        Ok(Some(runs)) => runs,
        Ok(None) => {
            eprintln!("Unit {name} does not exist.");
            return Outcome::Failure;
        }
        Err(error) => {
            eprintln!("Error retrieving the runs of {name}: {error}");
            return Outcome::Failure;
        }
    };
    if output == OutputFormat::Json {
        print_json(&runs);
        return Outcome::Success;
    }
    print!("{}", shown(&runs));
    Outcome::Success
}

/// How a global unit's run ended on the machines: `3 succeeded, 1 failed (5d5d5d5d: status 4)`.
fn machines_result(machines: &RunMachines) -> String {
    let counts = [
        (machines.succeeded, "succeeded"),
        (machines.failed, "failed"),
        (machines.lost, "lost"),
        (machines.stopped, "stopped"),
    ];
    let mut parts: Vec<String> =
        counts.iter().filter(|(count, _)| *count > 0).map(|(count, word)| format!("{count} {word}")).collect();
    if parts.is_empty() {
        parts.push("no machine reported an end yet".to_string());
    }
    let failures: Vec<String> = machines
        .failures
        .iter()
        .take(3)
        .map(|failure| {
            let machine: String = failure.machine_id.chars().take(8).collect();
            match (&failure.status, &failure.signal) {
                (Some(status), _) => format!("{machine}: status {status}"),
                (None, Some(signal)) => format!("{machine}: {signal}"),
                _ => format!("{machine}: {}", failure.state),
            }
        })
        .collect();
    let mut text = parts.join(", ");
    if !failures.is_empty() {
        text.push_str(&format!(" ({})", failures.join(", ")));
    }
    text
}

/// The schedule and the next elapse, the runs as a table, then the elapses skipped.
fn shown(runs: &UnitRuns) -> String {
    let mut text = String::new();
    match &runs.schedule {
        Some(schedule) => {
            let next = runs.next_elapse.as_deref().unwrap_or("never again");
            text.push_str(&format!("Schedule: {schedule}\nNext run: {next}\n"));
        }
        None if runs.batch => text.push_str(&format!("Unit {} is a batch unit: each start is one run.\n", runs.name)),
        None if runs.retries > 0 => text.push_str(&format!(
            "Unit {} is a service that moves when it fails (Retries={}): each stay on a machine is a run.\n",
            runs.name, runs.retries
        )),
        None => text.push_str(&format!("Unit {} has no schedule.\n", runs.name)),
    }
    if let Some(queued) = &runs.queued {
        text.push_str(&format!("Waiting: the elapse of {queued}, for the run before it to end\n"));
    }
    if runs.runs.is_empty() {
        text.push_str("No runs yet.\n");
    } else {
        let dash = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".to_string());
        let mut table = vec![["RUN", "ELAPSE", "MACHINE", "STARTED", "ENDED", "RESULT"].map(String::from).to_vec()];
        for run in &runs.runs {
            let result = match (&run.status, &run.signal, &run.why) {
                (Some(status), _, _) => format!("{} (status {status})", run.state),
                (None, Some(signal), _) => format!("{} ({signal})", run.state),
                (None, None, Some(why)) => format!("{} ({why})", run.state),
                _ => run.state.clone(),
            };
            let result = if run.attempt > 1 { format!("{result}, attempt {}", run.attempt) } else { result };
            let result = run.machines.as_ref().map_or(result, machines_result);
            let machine = match &run.machines {
                Some(_) => Some("every".to_string()),
                None => run.machine_id.as_ref().map(|id| id.chars().take(8).collect()),
            };
            table.push(vec![
                run.id.to_string(),
                dash(&run.elapse),
                dash(&machine),
                dash(&run.started),
                dash(&run.ended),
                result,
            ]);
        }
        text.push_str(&tab_table(&table));
    }
    if let Some((run, log)) = runs.runs.iter().rev().find_map(|run| Some((run, run.log.as_ref()?))) {
        text.push_str(&format!("The last lines of run {}'s log:\n", run.id));
        for line in log.lines() {
            text.push_str(&format!("  {line}\n"));
        }
    }
    if let Some(retry_at) = &runs.retry_at {
        text.push_str(&format!("Retry: at {retry_at} (Retries={})\n", runs.retries));
    }
    for skipped in &runs.skipped {
        let range = if skipped.first == skipped.last {
            skipped.first.clone()
        } else {
            format!("{} to {}", skipped.first, skipped.last)
        };
        text.push_str(&format!("Skipped {range}: {}\n", skipped.why));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api_schema::{SkippedElapses, UnitRun};

    #[test]
    fn runs_are_shown_with_their_results_and_what_was_skipped() {
        let runs = UnitRuns {
            name: "backup.service".into(),
            schedule: Some("*-*-* 02:00:00 Europe/Berlin".into()),
            next_elapse: Some("2026-12-05T01:00:00Z".into()),
            queued: None,
            batch: false,
            runs: vec![
                UnitRun {
                    id: 7,
                    elapse: Some("2026-12-03T01:00:00Z".into()),
                    claimed: "2026-12-03T01:00:00Z".into(),
                    machine_id: Some("5d5d5d5d0000000000000000000000ab".into()),
                    started: Some("2026-12-03T01:00:01Z".into()),
                    ended: Some("2026-12-03T01:04:10Z".into()),
                    state: "failed".into(),
                    status: Some(3),
                    log: Some("copying /srv\nno space left on device".into()),
                    ..UnitRun::default()
                },
                UnitRun {
                    id: 8,
                    elapse: Some("2026-12-03T01:00:00Z".into()),
                    attempt: 2,
                    claimed: "2026-12-03T01:04:20Z".into(),
                    state: "waiting".into(),
                    ..UnitRun::default()
                },
                UnitRun {
                    id: 9,
                    claimed: "2026-12-03T09:00:00Z".into(),
                    state: "running".into(),
                    ..UnitRun::default()
                },
            ],
            retries: 2,
            retry_at: Some("2026-12-03T01:05:00Z".into()),
            skipped: vec![SkippedElapses {
                first: "2026-12-02T01:00:00Z".into(),
                last: "2026-12-02T01:00:00Z".into(),
                why: "missed: no engine leader saw it in time".into(),
            }],
        };
        assert_eq!(
            shown(&runs),
            "Schedule: *-*-* 02:00:00 Europe/Berlin\n\
             Next run: 2026-12-05T01:00:00Z\n\
             RUN\tELAPSE\t\t\tMACHINE\t\tSTARTED\t\t\tENDED\t\t\tRESULT\n\
             7\t2026-12-03T01:00:00Z\t5d5d5d5d\t2026-12-03T01:00:01Z\t2026-12-03T01:04:10Z\tfailed (status 3)\n\
             8\t2026-12-03T01:00:00Z\t-\t\t-\t\t\t-\t\t\twaiting, attempt 2\n\
             9\t-\t\t\t-\t\t-\t\t\t-\t\t\trunning\n\
             The last lines of run 7's log:\n  copying /srv\n  no space left on device\n\
             Retry: at 2026-12-03T01:05:00Z (Retries=2)\n\
             Skipped 2026-12-02T01:00:00Z: missed: no engine leader saw it in time\n"
        );
    }

    #[test]
    fn a_moving_service_says_what_its_runs_are() {
        let runs = UnitRuns { name: "web.service".into(), retries: 3, ..UnitRuns::default() };
        assert_eq!(
            shown(&runs),
            "Unit web.service is a service that moves when it fails (Retries=3): each stay on a machine is a run.\n\
             No runs yet.\n"
        );
        let plain = UnitRuns { name: "web.service".into(), ..UnitRuns::default() };
        assert_eq!(shown(&plain), "Unit web.service has no schedule.\nNo runs yet.\n");
    }

    #[test]
    fn a_global_run_shows_how_it_ended_on_the_machines() {
        let machines = RunMachines {
            succeeded: 3,
            failed: 1,
            failures: vec![fleet_api_schema::MachineFailure {
                machine_id: "5d5d5d5d0000000000000000000000ab".into(),
                state: "failed".into(),
                status: Some(4),
                signal: None,
            }],
            ..RunMachines::default()
        };
        assert_eq!(machines_result(&machines), "3 succeeded, 1 failed (5d5d5d5d: status 4)");
        assert_eq!(machines_result(&RunMachines::default()), "no machine reported an end yet");
    }
}
