//! A line diff of two unit files, printed the way `diff -u` does (without hunk headers'
//! context trimming: unit files are short, every line is shown).

/// One line of a diff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// The lines of `old` and `new`, aligned on their longest common subsequence.
pub fn diff_lines<'a>(old: &'a str, new: &'a str) -> Vec<Line<'a>> {
    let old: Vec<&str> = old.lines().collect();
    let new: Vec<&str> = new.lines().collect();
    // common[i][j]: the longest common subsequence of old[i..] and new[j..].
    let mut common = vec![vec![0usize; new.len() + 1]; old.len() + 1];
    for i in (0..old.len()).rev() {
        for j in (0..new.len()).rev() {
            common[i][j] =
                if old[i] == new[j] { common[i + 1][j + 1] + 1 } else { common[i + 1][j].max(common[i][j + 1]) };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut lines = Vec::with_capacity(old.len().max(new.len()));
    while i < old.len() || j < new.len() {
        if i < old.len() && j < new.len() && old[i] == new[j] {
            lines.push(Line::Same(old[i]));
            i += 1;
            j += 1;
        } else if i < old.len() && (j == new.len() || common[i + 1][j] >= common[i][j + 1]) {
            lines.push(Line::Removed(old[i]));
            i += 1;
        } else {
            lines.push(Line::Added(new[j]));
            j += 1;
        }
    }
    lines
}

/// `old` against `new` as text: `--- old_label`, `+++ new_label`, then every line marked
/// with ` `, `-` or `+`.
pub fn unified(old_label: &str, old: &str, new_label: &str, new: &str) -> String {
    let mut text = format!("--- {old_label}\n+++ {new_label}\n");
    for line in diff_lines(old, new) {
        let (mark, content) = match line {
            Line::Same(content) => (' ', content),
            Line::Removed(content) => ('-', content),
            Line::Added(content) => ('+', content),
        };
        text.push(mark);
        text.push_str(content);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_lines_show_as_removed_then_added() {
        let old = "[Service]\nExecStart=/bin/sleep 1\nRestart=always\n";
        let new = "[Service]\nExecStart=/bin/sleep 2\nRestart=always\nUser=nobody\n";
        assert_eq!(
            diff_lines(old, new),
            vec![
                Line::Same("[Service]"),
                Line::Removed("ExecStart=/bin/sleep 1"),
                Line::Added("ExecStart=/bin/sleep 2"),
                Line::Same("Restart=always"),
                Line::Added("User=nobody"),
            ]
        );
        assert_eq!(unified("cluster", "a\n", "git", "b\n"), "--- cluster\n+++ git\n-a\n+b\n");
    }

    #[test]
    fn equal_and_empty_texts() {
        assert!(diff_lines("a\nb\n", "a\nb\n").iter().all(|line| matches!(line, Line::Same(_))));
        assert_eq!(diff_lines("", "x\n"), vec![Line::Added("x")]);
        assert_eq!(diff_lines("x\n", ""), vec![Line::Removed("x")]);
    }
}
