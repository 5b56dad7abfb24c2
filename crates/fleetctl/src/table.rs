//! Output the way the original prints it: tab-padded tables and machine legends.

use std::collections::BTreeMap;

use fleet_api_schema::Machine;

const TAB_WIDTH: usize = 8;
const PADDING: usize = 1;

/// Lays out rows as Go's tabwriter does with a tab pad character: each column but the last
/// is padded with tabs to its widest cell plus one, rounded up to a tab stop.
pub fn tab_table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; columns.saturating_sub(1)];
    for row in rows {
        for (column, cell) in row.iter().enumerate().take(columns.saturating_sub(1)) {
            widths[column] = widths[column].max(cell.chars().count() + PADDING);
        }
    }
    let mut out = String::new();
    for row in rows {
        for (column, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if column + 1 < row.len() {
                let cell_width = widths[column].div_ceil(TAB_WIDTH) * TAB_WIDTH;
                let tabs = (cell_width - cell.chars().count()).div_ceil(TAB_WIDTH);
                out.push_str(&"\t".repeat(tabs.max(1)));
            }
        }
        out.push('\n');
    }
    out
}

/// The original's width of a shortened machine ID.
const LEGEND_WIDTH: usize = 8;

/// The machine IDs of a listing, sorted once, so that each row's legend is found in O(log M):
/// the ID sharing the longest prefix with another sits next to it in order. (Compared with
/// every ID for every row, a list of 100,000 units on 10,000 machines took 22 s in fleetctl.)
pub struct MachineIds {
    sorted: Vec<String>,
}

impl MachineIds {
    pub fn of<'a>(ids: impl IntoIterator<Item = &'a str>) -> Self {
        let mut sorted: Vec<String> = ids.into_iter().map(str::to_string).collect();
        sorted.sort_unstable();
        sorted.dedup();
        Self { sorted }
    }

    /// How many leading characters tell `id` apart from every other ID: the original's 8, or
    /// more where another ID shares a longer prefix.
    fn distinct_prefix(&self, id: &str) -> usize {
        let shared = |other: &str| id.chars().zip(other.chars()).take_while(|(a, b)| a == b).count();
        let at = self.sorted.partition_point(|other| other.as_str() < id);
        let before = at.checked_sub(1).and_then(|index| self.sorted.get(index));
        let after = self.sorted[at..].iter().find(|other| other.as_str() != id);
        let longest = before.into_iter().chain(after).map(|other| shared(other)).max().unwrap_or(0);
        (longest + 1).max(LEGEND_WIDTH)
    }

    /// `3d1219c7...`, longer where another ID shares those characters, or the full ID with
    /// `--full`.
    pub fn legend(&self, id: &str, full: bool) -> String {
        let width = self.distinct_prefix(id);
        if full || id.chars().count() <= width {
            id.to_string()
        } else {
            format!("{}...", id.chars().take(width).collect::<String>())
        }
    }
}

/// The address of machine `id`, when the cluster knows it.
pub fn machine_ip<'a>(machines: &'a BTreeMap<String, Machine>, id: &str) -> Option<&'a str> {
    machines.get(id).map(|machine| machine.primary_ip.as_str()).filter(|ip| !ip.is_empty())
}

/// The machines of a listing, with their IDs in order: each row's `ID.../IP` legend.
pub struct MachineLegends {
    addresses: BTreeMap<String, String>,
    ids: MachineIds,
}

impl MachineLegends {
    pub fn of(machines: &BTreeMap<String, Machine>) -> Self {
        let addresses =
            machines.keys().filter_map(|id| Some((id.clone(), machine_ip(machines, id)?.to_string()))).collect();
        Self { addresses, ids: MachineIds::of(machines.keys().map(String::as_str)) }
    }

    /// The ID legend followed by `/<ip>` when the machine's address is known.
    pub fn full_legend(&self, id: &str, full: bool) -> String {
        let legend = self.ids.legend(id, full);
        match self.addresses.get(id) {
            Some(ip) => format!("{legend}/{ip}"),
            None => legend,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_original_layout() {
        let rows = vec![
            vec!["MACHINE".to_string(), "IP".to_string(), "METADATA".to_string()],
            vec!["3d1219c7...".to_string(), "127.0.0.1".to_string(), "region=local".to_string()],
        ];
        assert_eq!(tab_table(&rows), "MACHINE\t\tIP\t\tMETADATA\n3d1219c7...\t127.0.0.1\tregion=local\n");
        let units = vec![
            vec!["UNIT".into(), "HASH".into(), "DSTATE".into(), "STATE".into(), "TARGET".into()],
            vec![
                "described.service".into(),
                "5b850b3".into(),
                "launched".into(),
                "loaded".into(),
                "3d1219c7.../127.0.0.1".into(),
            ],
            vec!["hello.service".into(), "3750b3e".into(), "inactive".into(), "inactive".into(), "-".into()],
        ];
        assert_eq!(
            tab_table(&units),
            "UNIT\t\t\tHASH\tDSTATE\t\tSTATE\t\tTARGET\ndescribed.service\t5b850b3\tlaunched\tloaded\t\t3d1219c7.../127.0.0.1\nhello.service\t\t3750b3e\tinactive\tinactive\t-\n"
        );
    }

    #[test]
    fn legends() {
        let machines = BTreeMap::from([(
            "3d1219c7abcdef".to_string(),
            Machine { id: "3d1219c7abcdef".into(), primary_ip: "127.0.0.1".into(), ..Default::default() },
        )]);
        let legends = MachineLegends::of(&machines);
        assert_eq!(legends.full_legend("3d1219c7abcdef", false), "3d1219c7.../127.0.0.1");
        assert_eq!(legends.full_legend("3d1219c7abcdef", true), "3d1219c7abcdef/127.0.0.1");
        assert_eq!(legends.full_legend("ffffffff0000", false), "ffffffff...");
    }

    #[test]
    fn machine_ids_that_share_a_prefix_are_shown_long_enough_to_tell_apart() {
        let ids = MachineIds::of(["3d1219c7ffff", "00000000ab22", "00000000aa11"]);
        assert_eq!(ids.legend("00000000aa11", false), "00000000aa...");
        assert_eq!(ids.legend("00000000ab22", false), "00000000ab...");
        assert_eq!(ids.legend("3d1219c7ffff", false), "3d1219c7...", "the original's 8 otherwise");
        assert_eq!(MachineIds::of(["00000000aa11", "00000000aa1"]).legend("00000000aa11", false), "00000000aa11");
        assert_eq!(MachineIds::of([]).legend("ééééééééé", false), "éééééééé...", "cut by characters, not bytes");
        // An ID not among them (a state of a machine gone) is told apart from its neighbours.
        assert_eq!(ids.legend("00000000ab2f", false), "00000000ab2f");
    }

    /// The legend of every ID matches comparing it with every other ID, the way it was found
    /// before the IDs were sorted once.
    #[test]
    fn neighbours_in_order_give_the_longest_shared_prefix() {
        let ids: Vec<String> = (0..300u32)
            .map(|n| format!("{:08x}{:04x}", n / 7 * 0x1111, n.wrapping_mul(2_654_435_761) % 65536))
            .collect();
        let order = MachineIds::of(ids.iter().map(String::as_str));
        for id in &ids {
            let shared = |other: &String| id.chars().zip(other.chars()).take_while(|(a, b)| a == b).count();
            let longest = ids.iter().filter(|other| *other != id).map(shared).max().unwrap_or(0);
            assert_eq!(order.distinct_prefix(id), (longest + 1).max(LEGEND_WIDTH), "{id}");
        }
    }
}
