//! What a change does to the units that wait for units it takes down or moves: what `fleetctl
//! plan` says of a running unit that `Requires=` a unit being stopped, destroyed or drained.
//!
//! A running unit is never stopped at once for what it requires: with `RequiresGrace=` it is
//! taken off once that has been down for the grace, without it it keeps running. A unit it names
//! that moves makes it restart (or reload, per `RequiresChange=`) once it is up on its new
//! machine, because its list of where they run changes.

use std::collections::HashMap;

use super::{Dependencies, Dependency, Kind, Matched, Standing, unmet};
use crate::glob::Glob;
use crate::required_places::OnChange;

/// What a change does to one unit that another unit may wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Going {
    /// Not up after the change (stopped, destroyed, left unplaced).
    Down,
    /// Up again on another machine, by full ID.
    Moved { to: String },
}

/// For each unit of `dependents` (running units, with their dependencies) that a change of
/// `going` touches, what it then does, one line. `names` is every unit of the cluster, which an
/// item's pattern is matched over; `standing` how each of them stands now (absent: down).
/// Only an item met now and unmet after is a change for the unit.
pub fn affected(
    dependents: &[(&str, &Dependencies)],
    going: &HashMap<&str, Going>,
    names: &[&str],
    standing: &HashMap<&str, Standing>,
) -> Vec<(String, String)> {
    let down = Standing::Down(String::new());
    let now_of = |name: &str| standing.get(name).unwrap_or(&down);
    let mut lines = Vec::new();
    for (dependent, dependencies) in dependents {
        let mut effects = Vec::new();
        for item in &dependencies.items {
            let Some(glob) = Glob::new(&item.pattern) else { continue };
            let matched: Vec<&str> = names.iter().copied().filter(|name| glob.matches(name)).collect();
            if !matched.iter().any(|name| going.contains_key(name)) {
                continue;
            }
            let now = Matched::of(matched.iter().map(|name| now_of(name)));
            let after = Matched::of(matched.iter().map(|name| match going.get(name) {
                Some(Going::Down) => &down,
                _ => now_of(name),
            }));
            if item.kind == Kind::Requires && unmet(item, &now).is_none() && unmet(item, &after).is_some() {
                effects.push(match dependencies.grace {
                    Some(grace) => format!(
                        "taken off if {} not up again within {} (RequiresGrace=)",
                        wanted(item),
                        crate::duration::short_span(grace)
                    ),
                    None => format!("keeps running without {} (no RequiresGrace=)", item.pattern),
                });
                continue;
            }
            let moved = matched.iter().filter_map(|name| match going.get(name) {
                Some(Going::Moved { to }) if now_of(name) == &Standing::Up => Some((*name, to)),
                _ => None,
            });
            for (name, to) in moved {
                let short = to.get(..8).unwrap_or(to);
                match dependencies.on_change {
                    OnChange::Restart => effects.push(format!("restarted once {name} is up on {short}")),
                    OnChange::Reload => effects.push(format!("reloaded once {name} is up on {short}")),
                    OnChange::None => {}
                }
            }
        }
        if !effects.is_empty() {
            lines.push((dependent.to_string(), effects.join("; ")));
        }
    }
    lines
}

/// What an item waits for, as a sentence's subject: `db.service is`, `2 of db@*.service are`.
fn wanted(item: &Dependency) -> String {
    match item.count {
        1 => format!("{} is", item.pattern),
        count => format!("{count} of {} are", item.pattern),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::dependency::dependencies_of;
    use crate::unit_file::UnitFile;

    fn dependencies(name: &str, x_fleet: &str) -> Dependencies {
        let file =
            UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\nExecReload=/bin/true\n[X-Fleet]\n{x_fleet}\n"))
                .expect("a unit file");
        dependencies_of(name, file.options()).expect("dependencies")
    }

    fn up(names: &[&'static str]) -> HashMap<&'static str, Standing> {
        names.iter().map(|name| (*name, Standing::Up)).collect()
    }

    #[test]
    fn a_required_unit_going_down_takes_off_a_unit_with_a_grace_and_leaves_one_without() {
        let graced = dependencies("app.service", "Requires=db.service\nRequiresGrace=30s");
        let plain = dependencies("web.service", "Requires=db.service");
        let ordered = dependencies("job.service", "After=db.service");
        let names = ["app.service", "db.service", "job.service", "web.service"];
        let going = HashMap::from([("db.service", Going::Down)]);
        let dependents = [("app.service", &graced), ("job.service", &ordered), ("web.service", &plain)];
        let lines = affected(&dependents, &going, &names, &up(&names));
        assert_eq!(
            lines,
            vec![
                (
                    "app.service".to_string(),
                    "taken off if db.service is not up again within 30s (RequiresGrace=)".to_string()
                ),
                ("web.service".to_string(), "keeps running without db.service (no RequiresGrace=)".to_string()),
            ]
        );
        assert_eq!(graced.grace, Some(Duration::from_secs(30)));
    }

    #[test]
    fn a_count_still_met_after_the_change_changes_nothing_and_one_no_longer_met_does() {
        let two = dependencies("app.service", "Requires=db@*.service:2\nRequiresGrace=1m");
        let names = ["app.service", "db@1.service", "db@2.service", "db@3.service"];
        let going = HashMap::from([("db@1.service", Going::Down)]);
        assert_eq!(affected(&[("app.service", &two)], &going, &names, &up(&names)), vec![]);
        let going = HashMap::from([("db@1.service", Going::Down), ("db@2.service", Going::Down)]);
        let lines = affected(&[("app.service", &two)], &going, &names, &up(&names));
        assert_eq!(lines[0].1, "taken off if 2 of db@*.service are not up again within 1m (RequiresGrace=)");
    }

    #[test]
    fn an_item_unmet_already_is_no_change() {
        let graced = dependencies("app.service", "Requires=db.service\nRequiresGrace=30s");
        let names = ["app.service", "db.service"];
        let going = HashMap::from([("db.service", Going::Down)]);
        assert_eq!(affected(&[("app.service", &graced)], &going, &names, &HashMap::new()), vec![]);
    }

    #[test]
    fn a_required_unit_that_moves_restarts_or_reloads_its_dependents_as_they_ask() {
        let restart = dependencies("app.service", "Requires=db.service");
        let reload = dependencies("api.service", "After=db.service\nRequiresChange=reload");
        let none = dependencies("cron.service", "Requires=db.service\nRequiresChange=none");
        let names = ["api.service", "app.service", "cron.service", "db.service"];
        let going = HashMap::from([("db.service", Going::Moved { to: "3f2a1b0c99".to_string() })]);
        let dependents = [("api.service", &reload), ("app.service", &restart), ("cron.service", &none)];
        let lines = affected(&dependents, &going, &names, &up(&names));
        assert_eq!(
            lines,
            vec![
                ("api.service".to_string(), "reloaded once db.service is up on 3f2a1b0c".to_string()),
                ("app.service".to_string(), "restarted once db.service is up on 3f2a1b0c".to_string()),
            ]
        );
    }
}
