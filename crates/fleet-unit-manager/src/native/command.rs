//! `Exec*=` command lines: prefixes, quoting, specifiers and environment variables, as
//! systemd reads them. Pure.

use std::collections::BTreeMap;

/// One command to run, with what its prefixes asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecCommand {
    pub argv: Vec<String>,
    /// `-`: a failure of this command is not a failure of the unit.
    pub ignore_failure: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("command line is empty")]
    Empty,
    #[error("unbalanced quotes in {0:?}")]
    UnbalancedQuotes(String),
}

/// What specifiers expand to for one unit.
#[derive(Clone, Debug, Default)]
pub struct Specifiers {
    pub name: String,
    pub stem: String,
    pub prefix: String,
    pub instance: String,
    pub hostname: String,
    pub machine_id: String,
}

impl Specifiers {
    /// Replaces `%n %N %p %P %i %I %H %m %%`; unknown specifiers are kept as written.
    pub fn expand(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push_str(&self.name),
                Some('N') => out.push_str(&self.stem),
                Some('p' | 'P') => out.push_str(&self.prefix),
                Some('i' | 'I') => out.push_str(&self.instance),
                Some('H') => out.push_str(&self.hostname),
                Some('m') => out.push_str(&self.machine_id),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// Splits a command line into words: double and single quotes group, backslash escapes,
/// a backslash-newline continuation joins lines.
pub fn split_words(line: &str) -> Result<Vec<String>, CommandError> {
    let mut words = Vec::new();
    let mut current: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if let Some(word) = current.take() {
                    words.push(word);
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                current.get_or_insert_with(String::new);
            }
            (Some(open), c) if c == open => quote = None,
            (_, '\\') => match chars.next() {
                Some('\n') | None => {}
                Some('n') => current.get_or_insert_with(String::new).push('\n'),
                Some('t') => current.get_or_insert_with(String::new).push('\t'),
                Some(escaped) => current.get_or_insert_with(String::new).push(escaped),
            },
            (_, c) => current.get_or_insert_with(String::new).push(c),
        }
    }
    if quote.is_some() {
        return Err(CommandError::UnbalancedQuotes(line.to_string()));
    }
    words.extend(current);
    Ok(words)
}

/// Substitutes `${VAR}` (one word) and `$VAR` (split on whitespace) in each argument.
fn expand_environment(words: Vec<String>, environment: &BTreeMap<String, String>) -> Vec<String> {
    let mut result = Vec::new();
    for word in words {
        if let Some(name) = word.strip_prefix('$').filter(|name| is_variable_name(name)) {
            result.extend(
                environment.get(name).into_iter().flat_map(|value| value.split_whitespace().map(str::to_string)),
            );
            continue;
        }
        let mut out = String::new();
        let mut rest = word.as_str();
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            match rest[start + 2..].find('}') {
                Some(end) => {
                    let name = &rest[start + 2..start + 2 + end];
                    out.push_str(environment.get(name).map_or("", String::as_str));
                    rest = &rest[start + 3 + end..];
                }
                None => {
                    out.push_str(&rest[start..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
        result.push(out);
    }
    result
}

fn is_variable_name(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads one `Exec*=` value into a command.
pub fn parse_command(
    value: &str,
    specifiers: &Specifiers,
    environment: &BTreeMap<String, String>,
) -> Result<ExecCommand, CommandError> {
    let mut text = value.trim_start();
    let mut ignore_failure = false;
    while let Some(first) = text.chars().next().filter(|c| "-@+!:".contains(*c)) {
        ignore_failure |= first == '-';
        text = &text[1..];
    }
    let words = split_words(&specifiers.expand(text))?;
    let argv = expand_environment(words, environment);
    if argv.is_empty() {
        return Err(CommandError::Empty);
    }
    Ok(ExecCommand { argv, ignore_failure })
}

/// Reads `Environment=` values: whitespace-separated, quotable `NAME=value` assignments.
pub fn parse_assignments(value: &str, into: &mut BTreeMap<String, String>) {
    for word in split_words(value).unwrap_or_default() {
        if let Some((name, value)) = word.split_once('=') {
            into.insert(name.to_string(), value.to_string());
        }
    }
}

/// Reads an `EnvironmentFile=`: `NAME=value` lines, `#`/`;` comments, optional quotes.
pub fn parse_environment_file(text: &str, into: &mut BTreeMap<String, String>) {
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some((name, value)) = line.split_once('=') {
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            into.insert(name.trim().to_string(), unquoted.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specifiers() -> Specifiers {
        Specifiers {
            name: "web@8080.service".into(),
            stem: "web@8080".into(),
            prefix: "web".into(),
            instance: "8080".into(),
            hostname: "host".into(),
            machine_id: "abc".into(),
        }
    }

    #[test]
    fn prefixes_quotes_and_specifiers() {
        let env = BTreeMap::from([("PORT".to_string(), "1 2".to_string())]);
        let command = parse_command("-/bin/sh -c \"echo %i on %H; exit 1\" 'a b' 100%%", &specifiers(), &env).unwrap();
        assert!(command.ignore_failure);
        assert_eq!(command.argv, vec!["/bin/sh", "-c", "echo 8080 on host; exit 1", "a b", "100%"]);
        let command = parse_command("/bin/echo $PORT ${PORT} x${MISSING}y \"\"", &specifiers(), &env).unwrap();
        assert_eq!(command.argv, vec!["/bin/echo", "1", "2", "1 2", "xy", ""]);
        assert!(!command.ignore_failure);
    }

    #[test]
    fn continuation_and_errors() {
        assert_eq!(split_words("/bin/echo a \\\n   b").unwrap(), vec!["/bin/echo", "a", "b"]);
        assert_eq!(parse_command("  ", &specifiers(), &BTreeMap::new()), Err(CommandError::Empty));
        assert!(matches!(split_words("echo \"open"), Err(CommandError::UnbalancedQuotes(_))));
    }

    #[test]
    fn environment_values() {
        let mut env = BTreeMap::new();
        parse_assignments("A=1 \"B=two words\" junk", &mut env);
        parse_environment_file("# c\nC=\"3\"\n D = 4 \n;x\n", &mut env);
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two words");
        assert_eq!(env["C"], "3");
        assert_eq!(env["D"], "4");
        assert!(!env.contains_key("junk"));
    }
}
