//! `[X-Fleet] DisruptionBudget=` and `DisruptionBudgetBy=`: how many units of one group may be
//! down at once by a voluntary disruption (a rollout's wave, a drain, a taint's `:evict`,
//! preemption). The group is the unit's `SpreadGroup=`, else its template: a template's
//! instances share one budget. `DisruptionBudget=1` (a count) or `25%` (of the group's units that
//! should run, rounded down, at least 1); with `DisruptionBudgetBy=zone` the budget holds per
//! value of that metadata key of the units' machines.
//!
//! [`Budgets`] is the ledger every disruption asks: built from the group's units and which of
//! them are down now (for any reason, voluntary or not), it lets a disruption of a unit that
//! is up through only while its group (and value) has fewer than its budget down, and counts
//! it down from then on. A unit down already costs nothing.

use std::collections::HashMap;
use std::fmt;

use crate::max_unavailable::MaxUnavailable;
use crate::unit_file::{UnitOption, last_value};
use crate::unit_name::UnitNameInfo;

/// The option's name in `[X-Fleet]`.
pub const KEY: &str = "DisruptionBudget";

/// The option that groups the budget by a metadata key's values.
pub const BY_KEY: &str = "DisruptionBudgetBy";

/// A unit's disruption budget, as its unit file states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisruptionBudget {
    /// How many of the group may be down at once.
    pub size: MaxUnavailable,
    /// The metadata key whose values each have the whole budget, if any.
    pub by: Option<String>,
}

impl DisruptionBudget {
    /// As lists show it: `1`, `25%`, `1 per zone`.
    pub fn short(&self) -> String {
        match &self.by {
            Some(key) => format!("{} per {key}", self.size),
            None => self.size.to_string(),
        }
    }
}

impl fmt::Display for DisruptionBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{KEY}={}", self.size)?;
        match &self.by {
            Some(key) => write!(f, ", {BY_KEY}={key}"),
            None => Ok(()),
        }
    }
}

/// The unit's budget (the last of each option given); `None` without `DisruptionBudget=`. An
/// error names the option and the value: a budget of 0 (nothing could ever roll or drain), a
/// value that is no count or percentage, a `DisruptionBudgetBy=` that is no metadata key or
/// comes without a budget, and a budget on a unit that belongs to no group.
pub fn budget_of(unit_name: &str, options: &[UnitOption]) -> Result<Option<DisruptionBudget>, String> {
    let section = crate::unit_file::X_FLEET;
    let by = last_value(options, section, BY_KEY).map(|key| key.trim().to_string());
    let Some(value) = last_value(options, section, KEY) else {
        return match by {
            Some(_) => Err(format!("[X-Fleet] {BY_KEY}= needs a {KEY}= to group")),
            None => Ok(None),
        };
    };
    let trimmed = value.trim();
    if trimmed.strip_suffix('%').unwrap_or(trimmed).parse::<u64>() == Ok(0) {
        return Err(format!(
            "invalid value {value:?} for [X-Fleet] {KEY}: a budget of 0 would hold every rollout and drain of the group for ever; expected 1 or more units, or 1% to 100%"
        ));
    }
    let size = MaxUnavailable::parse(trimmed).map_err(|_| {
        format!("invalid value {value:?} for [X-Fleet] {KEY}: expected a number of units (1 or more) or a percentage (1% to 100%)")
    })?;
    if let Some(key) = by.as_deref().filter(|key| !crate::metadata_key::valid_metadata_key(key)) {
        return Err(format!("invalid value {key:?} for [X-Fleet] {BY_KEY}: expected a metadata key"));
    }
    let info = UnitNameInfo::new(unit_name);
    let grouped = info.is_template() || info.is_instance() || last_value(options, section, "SpreadGroup").is_some();
    if !grouped {
        return Err(format!(
            "[X-Fleet] {KEY}= counts a group of units, and {unit_name} is in none: give it to a template's instances or to units that share a SpreadGroup="
        ));
    }
    Ok(Some(DisruptionBudget { size, by }))
}

/// One unit of a budgeted group, as the ledger sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Its group: its `SpreadGroup=`, else its template (`Requirements::spread_group_of`).
    pub group: String,
    pub budget: DisruptionBudget,
    /// The value of the budget's `by` key on the machine it is on (`None`: not placed, or the
    /// machine has no such key: these count as one more value).
    pub value: Option<String>,
    /// Whether it is down now: it should run and does not, as it should, where it is
    /// scheduled (or is being moved or replaced already).
    pub down: bool,
}

/// Who holds a disruption back: the budget, its group and value, and how many are down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub group: String,
    /// `key=value` when the budget is grouped by a key.
    pub value: Option<String>,
    pub budget: DisruptionBudget,
    pub down: usize,
    pub limit: usize,
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "held by the disruption budget of {}", self.group)?;
        if let Some(value) = &self.value {
            write!(f, " in {value}")?;
        }
        write!(f, ": {} down of the {} it allows ({})", self.down, self.limit, self.budget)
    }
}

/// One group's budget for one value of its key: how many may be down, and how many are.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Bucket {
    group: String,
    value: Option<String>,
    budget: DisruptionBudget,
    limit: usize,
    down: usize,
}

/// The disruption ledger of one decision: every budgeted unit's bucket, and which are down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budgets {
    buckets: Vec<Bucket>,
    /// Each budgeted unit: its bucket and whether it counts as down.
    units: HashMap<String, (usize, bool)>,
}

impl Budgets {
    /// The ledger of `members`. A group's units that state different budgets are each counted
    /// in the bucket of their own `by` key; a bucket's limit is the smallest any of its units
    /// states, of the bucket's units.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Self {
        let mut ledger = Self::default();
        let mut at: HashMap<(String, Option<String>, Option<String>), usize> = HashMap::new();
        let mut sizes: Vec<(Vec<MaxUnavailable>, usize)> = Vec::new();
        for member in members {
            let value = member.budget.by.as_ref().map(|key| format!("{key}={}", member.value.as_deref().unwrap_or("")));
            let key = (member.group.clone(), member.budget.by.clone(), value.clone());
            let index = *at.entry(key).or_insert_with(|| {
                ledger.buckets.push(Bucket {
                    group: member.group.clone(),
                    value,
                    budget: member.budget.clone(),
                    limit: 0,
                    down: 0,
                });
                sizes.push((Vec::new(), 0));
                ledger.buckets.len() - 1
            });
            let (stated, count) = &mut sizes[index];
            stated.push(member.budget.size);
            *count += 1;
            if member.down {
                ledger.buckets[index].down += 1;
            }
            ledger.units.insert(member.name, (index, member.down));
        }
        for (bucket, (stated, count)) in ledger.buckets.iter_mut().zip(sizes) {
            let (limit, budget) = stated
                .iter()
                .map(|size| (size.of(count), *size))
                .min_by_key(|(limit, _)| *limit)
                .unwrap_or((1, MaxUnavailable::Count(1)));
            bucket.limit = limit;
            bucket.budget.size = budget;
        }
        ledger
    }

    /// Whether `unit` counts as down in the ledger (down now, or taken down by this decision).
    pub fn is_down(&self, unit: &str) -> bool {
        self.units.get(unit).is_some_and(|(_, down)| *down)
    }

    /// Takes `units` down together if every budget they count in allows it, else takes none
    /// and says which budget holds them. Units without a budget and units down already cost
    /// nothing.
    pub fn take<'a>(&mut self, units: impl IntoIterator<Item = &'a str> + Clone) -> Result<(), Held> {
        let mut cost: HashMap<usize, usize> = HashMap::new();
        for unit in units.clone() {
            if let Some((bucket, false)) = self.units.get(unit) {
                *cost.entry(*bucket).or_default() += 1;
            }
        }
        let mut order: Vec<(usize, usize)> = cost.into_iter().collect();
        order.sort_unstable();
        if let Some(&(index, _)) = order.iter().find(|(index, more)| {
            let bucket = &self.buckets[*index];
            bucket.down + more > bucket.limit
        }) {
            let bucket = &self.buckets[index];
            return Err(Held {
                group: bucket.group.clone(),
                value: bucket.value.clone(),
                budget: bucket.budget.clone(),
                down: bucket.down,
                limit: bucket.limit,
            });
        }
        for unit in units {
            if let Some((bucket, down)) = self.units.get_mut(unit)
                && !*down
            {
                *down = true;
                self.buckets[*bucket].down += 1;
            }
        }
        Ok(())
    }

    /// The units taken down by [`Budgets::take`] that were not down in `before`.
    pub fn taken_since(&self, before: &Budgets) -> Vec<String> {
        let mut taken: Vec<String> = self
            .units
            .iter()
            .filter(|(name, (_, down))| *down && !before.is_down(name))
            .map(|(name, _)| name.clone())
            .collect();
        taken.sort_unstable();
        taken
    }
}

#[cfg(test)]
mod tests;
