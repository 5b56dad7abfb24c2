//! How many units may be down at once: a rollout's and a drain's `max-unavailable`, and a
//! group's `DisruptionBudget=`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How many units may be down at once: a count, or a percentage of the units counted
/// (rounded down, at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaxUnavailable {
    Count(usize),
    Percent(u8),
}

impl MaxUnavailable {
    /// Reads `2` or `25%`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid max-unavailable {text:?}: a number of units (1 or more) or a percentage (1% to 100%)");
        match text.strip_suffix('%') {
            Some(percent) => match percent.parse::<u8>() {
                Ok(percent) if (1..=100).contains(&percent) => Ok(Self::Percent(percent)),
                _ => Err(bad()),
            },
            None => match text.parse::<usize>() {
                Ok(count) if count >= 1 => Ok(Self::Count(count)),
                _ => Err(bad()),
            },
        }
    }

    /// The number of units of a rollout of `total` that may be down at once.
    pub fn of(self, total: usize) -> usize {
        match self {
            Self::Count(count) => count,
            Self::Percent(percent) => (total * usize::from(percent) / 100).max(1),
        }
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(count) => write!(f, "{count}"),
            Self::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}
