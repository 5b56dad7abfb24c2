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

/// `3d1219c7...`, or the full ID with `--full`.
pub fn machine_id_legend(id: &str, full: bool) -> String {
    if full || id.len() <= 8 { id.to_string() } else { format!("{}...", &id[..8]) }
}

/// The address of machine `id`, when the cluster knows it.
pub fn machine_ip<'a>(machines: &'a BTreeMap<String, Machine>, id: &str) -> Option<&'a str> {
    machines.get(id).map(|machine| machine.primary_ip.as_str()).filter(|ip| !ip.is_empty())
}

/// The ID legend followed by `/<ip>` when the machine's address is known.
pub fn machine_full_legend(id: &str, machines: &BTreeMap<String, Machine>, full: bool) -> String {
    let legend = machine_id_legend(id, full);
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
}
