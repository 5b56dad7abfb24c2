//! The simulation in the suite: a seed replays the same run, the seeds that found double
//! runs pass now, and a slice of seeds not tried before passes (its first seed is printed;
//! `fleet-sim --seed N` replays any of them). `scripts/test.sh` runs thousands more with the
//! `fleet-sim` binary.

use fleet_sim::{SimConfig, run, run_traced};

#[test]
fn a_seed_replays_the_same_run() {
    let config = SimConfig::default();
    let first = run_traced(7, &config, true);
    let again = run_traced(7, &config, true);
    assert_eq!(first.trace, again.trace);
    assert_eq!(first.digest, again.digest);
    assert!(first.faults.values().sum::<usize>() >= 10, "enough faults: {first}");
    assert_ne!(run(8, &config).digest, first.digest, "another seed, another run");
}

/// Seeds on which a machine back from an expired lease kept running what the engine had
/// moved, while its copy of its work lagged behind its registering again (issue 33's chaos
/// episode) or while its agent's pass waited on a slow store: each fails without the agent
/// stopping its units as soon as the store says the presence lapsed.
#[test]
fn the_seeds_that_found_a_double_run_pass() {
    let config = SimConfig::default();
    for seed in [268, 378, 421, 469, 746, 768, 782, 1056, 118_844] {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
    }
}

/// Seeds on which a machine claimed its presence again while running units the engine had
/// moved, then froze before its agent stopped them (the chaos run's seed 3, 2026-11-25):
/// 202, 217, 402, 2743 and 3133 fail without the store waiting for the agent to have
/// stopped its units before registering again; 3054 without a registration that got no
/// answer counting as a lapse until one is confirmed; 3574 without a fresh claim at start
/// waiting for the agent too (a fleetd killed again right after it).
#[test]
fn the_seeds_that_found_a_presence_claimed_too_soon_pass() {
    let config = SimConfig::default();
    for seed in [202, 217, 402, 2743, 3133, 3054, 3574] {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
    }
}

/// Seeds on which a unit was started on another machine while the machine it was taken off
/// still ran it with its presence holding (its fleetd restarting, its lease kept alive by
/// elections or not yet expired): the unit was unloaded and loaded again meanwhile. Both
/// fail without the engine placing such a unit only once that machine stopped it
/// (`schedule::departures`); 795754710 also needs the engine that took over to learn it from
/// the machines' reports.
#[test]
fn the_seeds_that_found_a_unit_started_before_its_old_machine_stopped_it_pass() {
    let config = SimConfig::default();
    for seed in [795_754_710, 910_012_049] {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
    }
}

/// Seeds on which a unit that asked to run at most once ran on two machines: 2013, an engine
/// that led again counted a machine's absence from when it had seen it gone while it led
/// before (the machine had come back and gone again meanwhile), so it moved the unit at once.
#[test]
fn the_seeds_that_found_an_at_most_once_unit_twice_pass() {
    let outcome = run(2013, &SimConfig::default());
    assert!(outcome.passed(), "{outcome}");
}

#[test]
fn a_fresh_slice_of_seeds_passes() {
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!("seeds {first}..{} (replay one: fleet-sim --seed N)", first + 50);
    let config = SimConfig::default();
    for seed in first..first + 50 {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
    }
}

/// Units on a calendar under the same faults: each elapse claimed at most once, no run started
/// twice, every elapse run, waiting or skipped with its reason. Seed 17 found an agent starting
/// a run again after it had stopped it while out of touch and was given the unit back;
/// 796408244 the same with a unit a restarted fleetd had taken over (reported lost, then set
/// aside when its presence lapsed, then given back).
#[test]
fn units_on_a_calendar_run_each_elapse_at_most_once_under_faults() {
    let config = fleet_sim::SimConfig { scheduled: 4, ..SimConfig::default() };
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!("seeds {first}..{} with units on a calendar (replay one: fleet-sim --scheduled 4 --seed N)", first + 20);
    for seed in [14, 17, 796_408_244].into_iter().chain(first..first + 20) {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
        assert!(outcome.runs_claimed > 0, "runs were claimed: {outcome}");
    }
    // 796451714, in CI's whole mix: a restarted fleetd whose first pass could not read a run's
    // body took itself for caught up, and started that run when it could (started 9 times for
    // 8 runs claimed).
    let all = fleet_sim::SimConfig {
        scheduled: 4,
        moving: 3,
        prioritized: 8,
        lost_after: 6,
        budgeted: 6,
        ..SimConfig::default()
    };
    let outcome = run(796_451_714, &all);
    assert!(outcome.passed(), "{outcome}");
}

/// Services that fail on m0 move elsewhere under the same faults: each ends running on another
/// machine, or off with its retries spent having failed on m0 only (20804 and 20987: the other
/// machines were out of touch through four tries, so each went back to m0). 108083 (with units
/// on a calendar besides) found an agent whose report of a failed unit committed but lost its
/// answer: it forgot the report, never removed it once it let the unit go, and the service
/// waited for that machine to let it go for good.
#[test]
fn services_that_fail_move_elsewhere_under_faults() {
    let moving = fleet_sim::SimConfig { moving: 3, ..SimConfig::default() };
    let both = fleet_sim::SimConfig { scheduled: 4, moving: 3, ..SimConfig::default() };
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!(
        "seeds {first}..{} with services that move (replay one: fleet-sim --scheduled 4 --moving 3 --seed N)",
        first + 20
    );
    let mut failures = 0;
    let seeds = [(20_804, &moving), (20_987, &moving), (108_083, &both)];
    for (seed, config) in seeds.into_iter().chain((first..first + 20).map(|seed| (seed, &both))) {
        let outcome = run(seed, config);
        assert!(outcome.passed(), "{outcome}");
        failures += outcome.stays_failed;
    }
    assert!(failures >= 12, "the two seeds named first spent their retries on m0 at least: {failures} failures");
}

/// Units with priorities on machines with room for all of them only while every machine is
/// up, preemption on: under the same faults the high ones take the room of the low ones while
/// machines are out of touch, nothing runs twice past the judge's window, and once the faults
/// end every unit runs again where it is placed. Seeds 50503 and 50784 (with units on a
/// calendar and services that move besides) found a machine whose presence lapsed starting a
/// unit again without reporting it (its report equalled the one the store had dropped with the
/// presence): the engine took the preempted unit for stopped there and started it elsewhere.
/// 796431134 (CI's slice) found a machine cut off right after it started a unit, its report
/// lost: preempted off it, the unit was started elsewhere at once, the machine's silence taken
/// for a stop.
#[test]
fn units_of_a_higher_priority_take_the_room_of_lower_ones_under_faults() {
    let prioritized = fleet_sim::SimConfig { prioritized: 8, ..SimConfig::default() };
    let all = fleet_sim::SimConfig { scheduled: 4, moving: 3, prioritized: 12, ..SimConfig::default() };
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!("seeds {first}..{} with priorities (replay one: fleet-sim --prioritized 8 --seed N)", first + 20);
    let mut preempted = 0;
    // Seeds 1, 2 and 5 preempt 3, 6 and 5 units.
    let ci = fleet_sim::SimConfig { scheduled: 4, moving: 3, prioritized: 8, ..SimConfig::default() };
    // 796436631: a unit preempted off a machine cut off that had not reported it, then a new
    // leader: it must hold the silent departure its predecessor recorded.
    let named = [
        (1, &prioritized),
        (2, &prioritized),
        (5, &prioritized),
        (50_503, &all),
        (50_784, &all),
        (796_431_134, &ci),
        (796_436_631, &ci),
    ];
    for (seed, config) in named.into_iter().chain((first..first + 20).map(|seed| (seed, &prioritized))) {
        let outcome = run(seed, config);
        assert!(outcome.passed(), "{outcome}");
        preempted += outcome.preempted;
    }
    assert!(preempted >= 14, "the seeds named first preempt 14 units at least: {preempted}");
}

/// `LostAfter=` units under every fault: none moves off a machine gone before its span (less
/// `agent_ttl`), none with `never`, and none runs on a second machine sooner (the judge's
/// `look_lost_after`). Seeds 2028 and 2030 move three of them each in their time (2017 did
/// until a stale report that a unit stopped stopped ending its departure: its faults fell
/// otherwise, as any change to how many writes a run makes may).
#[test]
fn units_with_lost_after_wait_their_span_for_a_machine_gone_and_never_with_never() {
    let config = fleet_sim::SimConfig { lost_after: 6, ..SimConfig::default() };
    let all = fleet_sim::SimConfig { scheduled: 4, moving: 3, prioritized: 8, lost_after: 6, ..SimConfig::default() };
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!("seeds {first}..{} with LostAfter= (replay one: fleet-sim --lost-after 6 --seed N)", first + 20);
    let mut moved = 0;
    // 796436904: the leader's store did not answer while a machine came back and went again.
    // 796460972: the leader's store answered, but a write hung while a machine came back for
    // 4 s and went again, and the engine moved a unit off it as if it had been gone all along.
    let budgeted = fleet_sim::SimConfig { budgeted: 6, ..all.clone() };
    let named = [(2028, &config), (2030, &config), (796_436_904, &all), (796_460_972, &budgeted)];
    for (seed, config) in named.into_iter().chain((first..first + 20).map(|seed| (seed, &config))) {
        let outcome = run(seed, config);
        assert!(outcome.passed(), "{outcome}");
        moved += outcome.lost_after_moves;
    }
    assert!(moved >= 6, "seeds 2028 and 2030 move three units with LostAfter= each once their span is over: {moved}");
}

/// Units in one group with `DisruptionBudget=1` beside units of a higher priority under every
/// fault: no preemption of one that runs while another preempted before is not back (the
/// store's `BudgetJudge`). Seeds 1076 and 1298 preempt five of them in all, one at a time;
/// 1076 and 1177 once found the judge counting a unit up on a machine it had left (1177
/// preempts none since machines register again without a retry's wait: its faults fall
/// otherwise). Seed 796,512,763 of
/// the whole workload found it counting three units up whose reports had gone with the fleetd
/// a restarted one took its lease over from (the engine rightly preempted them as down).
#[test]
fn units_with_a_disruption_budget_are_preempted_one_at_a_time() {
    let everything = fleet_sim::SimConfig {
        scheduled: 4,
        moving: 3,
        prioritized: 8,
        lost_after: 6,
        budgeted: 6,
        dependent: 6,
        ..SimConfig::default()
    };
    let outcome = run(796_512_763, &everything);
    assert!(outcome.passed() && outcome.budgeted_preempted >= 3, "{outcome}");
    let config = fleet_sim::SimConfig { prioritized: 8, budgeted: 6, ..SimConfig::default() };
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!(
        "seeds {first}..{} with budgets (replay one: fleet-sim --prioritized 8 --budgeted 6 --seed N)",
        first + 20
    );
    let mut preempted = 0;
    for seed in [1076, 1177, 1298].into_iter().chain(first..first + 20) {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
        preempted += outcome.budgeted_preempted;
    }
    assert!(preempted >= 5, "seeds 1076 and 1298 preempt units with a budget: {preempted}");
}

/// Units that wait for units (`w<k>` requires `r<k>`, launched a quarter into the run) under
/// every fault: none is placed while what it requires does not run (the store's
/// `DependencyJudge`), and each runs once the faults end (the cluster settles).
#[test]
fn units_that_wait_for_units_are_placed_only_once_those_run() {
    let config = fleet_sim::SimConfig { dependent: 6, ..SimConfig::default() };
    let first = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 1_000_000_007;
    println!("seeds {first}..{} with dependents (replay one: fleet-sim --dependent 6 --seed N)", first + 20);
    let mut placed = 0;
    for seed in [1000, 1001].into_iter().chain(first..first + 20) {
        let outcome = run(seed, &config);
        assert!(outcome.passed(), "{outcome}");
        placed += outcome.dependents_placed;
    }
    assert!(placed >= 12, "every dependent of seeds 1000 and 1001 is placed once at least: {placed}");
}
