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

/// How many leading characters tell `id` apart from every other of `ids`: the original's 8, or
/// more where machine IDs share a longer prefix.
fn distinct_prefix<'a>(id: &str, ids: impl IntoIterator<Item = &'a str>) -> usize {
    let shared = |other: &str| id.chars().zip(other.chars()).take_while(|(a, b)| a == b).count();
    let longest = ids.into_iter().filter(|other| *other != id).map(shared).max().unwrap_or(0);
    (longest + 1).max(LEGEND_WIDTH)
}

/// `3d1219c7...`, longer where another of `ids` shares those characters, or the full ID
/// with `--full`.
pub fn machine_id_legend<'a>(id: &str, ids: impl IntoIterator<Item = &'a str>, full: bool) -> String {
    let width = distinct_prefix(id, ids);
    if full || id.chars().count() <= width {
        id.to_string()
    } else {
        format!("{}...", id.chars().take(width).collect::<String>())
    }
}

/// The address of machine `id`, when the cluster knows it.
pub fn machine_ip<'a>(machines: &'a BTreeMap<String, Machine>, id: &str) -> Option<&'a str> {
    machines.get(id).map(|machine| machine.primary_ip.as_str()).filter(|ip| !ip.is_empty())
}

/// The ID legend followed by `/<ip>` when the machine's address is known.
pub fn machine_full_legend(id: &str, machines: &BTreeMap<String, Machine>, full: bool) -> String {
    let legend = machine_id_legend(id, machines.keys().map(String::as_str), full);
    match machine_ip(machines, id) {
        Some(ip) => format!("{legend}/{ip}"),
        None => legend,
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
        assert_eq!(machine_full_legend("3d1219c7abcdef", &machines, false), "3d1219c7.../127.0.0.1");
        assert_eq!(machine_full_legend("3d1219c7abcdef", &machines, true), "3d1219c7abcdef/127.0.0.1");
        assert_eq!(machine_full_legend("ffffffff0000", &machines, false), "ffffffff...");
    }

    #[test]
    fn machine_ids_that_share_a_prefix_are_shown_long_enough_to_tell_apart() {
        let ids = ["00000000aa11", "00000000ab22", "3d1219c7ffff"];
        assert_eq!(machine_id_legend("00000000aa11", ids, false), "00000000aa...");
        assert_eq!(machine_id_legend("00000000ab22", ids, false), "00000000ab...");
        assert_eq!(machine_id_legend("3d1219c7ffff", ids, false), "3d1219c7...", "the original's 8 otherwise");
        assert_eq!(machine_id_legend("00000000aa11", ["00000000aa11", "00000000aa1"], false), "00000000aa11");
        assert_eq!(machine_id_legend("ééééééééé", [], false), "éééééééé...", "cut by characters, not bytes");
    }
}
