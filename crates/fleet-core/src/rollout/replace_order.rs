//! The order a new rollout replaces its units in.

use std::collections::HashMap;

/// `units` as asked, reordered for replacement: the first `canary` stay first as asked; the
/// rest go machine by machine, each machine's units together at the place of its first one
/// asked, in the order asked, and a unit no machine holds (`machine_of` says `None`) keeps its
/// place among them. A wave then replaces a machine's units together, so its agent restarts
/// them in one pass and reports them in one write, and fewer machines are disturbed at once:
/// in the order asked (by name, usually) the instances of a template sit on different
/// machines, and a wave touched one unit on each of as many machines as it had units.
pub fn machine_by_machine<'m, T>(units: Vec<T>, canary: usize, machine_of: impl Fn(&T) -> Option<&'m str>) -> Vec<T> {
    let mut group_of_machine: HashMap<String, usize> = HashMap::new();
    let mut keyed: Vec<(usize, T)> = Vec::with_capacity(units.len());
    for (position, unit) in units.into_iter().enumerate() {
        let group = match machine_of(&unit) {
            Some(machine) if position >= canary => match group_of_machine.get(machine) {
                Some(&group) => group,
                None => {
                    group_of_machine.insert(machine.to_string(), position);
                    position
                }
            },
            _ => position,
        };
        keyed.push((group, unit));
    }
    // Stable: within a group, the order asked.
    keyed.sort_by_key(|(group, _)| *group);
    keyed.into_iter().map(|(_, unit)| unit).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered(units: &[(&'static str, Option<&'static str>)], canary: usize) -> Vec<&'static str> {
        machine_by_machine(units.to_vec(), canary, |(_, machine)| *machine).into_iter().map(|(name, _)| name).collect()
    }

    #[test]
    fn after_the_canary_each_machine_s_units_go_together_where_its_first_was_asked() {
        let units = [
            ("a@1", Some("m1")),
            ("a@2", Some("m2")),
            ("a@3", Some("m3")),
            ("a@4", Some("m1")),
            ("a@5", None),
            ("a@6", Some("m2")),
            ("a@7", Some("m1")),
            ("a@8", Some("m3")),
        ];
        assert_eq!(ordered(&units, 0), ["a@1", "a@4", "a@7", "a@2", "a@6", "a@3", "a@8", "a@5"]);
        // The canary is replaced as asked; a machine it touched still has its other units
        // together, at the place of the first one after the canary.
        assert_eq!(ordered(&units, 2), ["a@1", "a@2", "a@3", "a@8", "a@4", "a@7", "a@5", "a@6"]);
        // Every unit once, whatever the canary.
        for canary in 0..=units.len() + 1 {
            let mut names = ordered(&units, canary);
            names.sort();
            assert_eq!(names, ["a@1", "a@2", "a@3", "a@4", "a@5", "a@6", "a@7", "a@8"]);
        }
        assert_eq!(ordered(&units, units.len()), units.map(|(name, _)| name));
    }
}
