//! Fleet's own placement terms of a unit that no listing has a column of, each said as a short
//! phrase: what it reserves, the taints it tolerates, how long its machine may be out of touch,
//! whether it runs at most once, what its instances spread by. `list-unit-files --fields terms`,
//! its `-o json` (`terms`) and the web view's TERMS column show them.

use super::Requirements;

impl Requirements {
    /// The terms, in a fixed order; none for a unit that asks none of them.
    pub fn terms(&self) -> Vec<String> {
        let mut terms = Vec::new();
        if self.reservation != crate::Resources::default() {
            terms.push(format!("reserves {}", self.reservation));
        }
        if !self.tolerate.is_empty() {
            let tolerated: Vec<String> = self.tolerate.iter().map(ToString::to_string).collect();
            terms.push(format!("tolerates {}", tolerated.join(" ")));
        }
        match self.lost_after.written() {
            Some(never) if never == "never" => terms.push("never lost".to_string()),
            Some(span) => terms.push(format!("lost after {span}")),
            None => {}
        }
        if self.at_most_once {
            terms.push("at most once".to_string());
        }
        if let Some(key) = &self.spread_by {
            terms.push(format!("spread by {key}"));
        }
        terms
    }
}

#[cfg(test)]
mod tests {
    use crate::{Requirements, UnitFile};

    fn terms(x_fleet: &str) -> Vec<String> {
        let file = UnitFile::parse(&format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{x_fleet}")).expect("a unit");
        Requirements::from_unit("app@1.service", &file).terms()
    }

    #[test]
    fn each_term_a_unit_asks_is_said_in_order() {
        assert_eq!(
            terms("SpreadBy=zone\nAtMostOnce=true\nLostAfter=10min\nTolerate=gpu=yes db\nMemory=1G\nCPU=0.5\n"),
            [
                "reserves 1 GiB memory, 0.5 CPU",
                "tolerates db gpu=yes",
                "lost after 10m",
                "at most once",
                "spread by zone"
            ]
        );
        assert_eq!(terms("LostAfter=never\n"), ["never lost"]);
    }

    #[test]
    fn a_unit_that_asks_none_has_none() {
        assert_eq!(terms("MachineMetadata=role=web\nPriority=900\n"), Vec::<String>::new());
    }
}
