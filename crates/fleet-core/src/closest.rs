//! The known name nearest a mistyped one, for "did you mean …?" hints.

/// The name among `known` nearest `typed` (case aside), when it is near enough to be what
/// was meant: within one edit for short names, two from six characters, three from twelve;
/// ties go to the first given.
pub fn closest<'a>(typed: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let typed = typed.to_ascii_lowercase();
    let allowed = match typed.chars().count() {
        0..=5 => 1,
        6..=11 => 2,
        _ => 3,
    };
    known
        .into_iter()
        .map(|name| (distance(&typed, &name.to_ascii_lowercase()), name))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Edits from `a` to `b`: characters inserted, deleted, replaced, or two neighbours swapped
/// (the optimal string alignment distance).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows of the table: two back, one back, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let replace = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j] + 1).min(current[j - 1] + 1).min(previous[j - 1] + replace);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_count_swaps_of_neighbours_as_one() {
        assert_eq!(distance("execstrat", "execstart"), 1);
        assert_eq!(distance("servce", "service"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("abc", ""), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn the_nearest_known_name_is_suggested_only_when_near() {
        let known = ["ExecStart", "ExecStop", "Restart", "MachineMetadata"];
        assert_eq!(closest("ExecStrat", known), Some("ExecStart"));
        assert_eq!(closest("execstart", known), Some("ExecStart"), "case aside");
        assert_eq!(closest("MachineMetdata", known), Some("MachineMetadata"));
        assert_eq!(closest("Restrat", known), Some("Restart"));
        assert_eq!(closest("Frobnicate", known), None, "nothing near");
        assert_eq!(closest("Tpe", ["Tp", "Type"]), Some("Tp"), "the first of equals");
    }
}
