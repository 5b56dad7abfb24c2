//! Unit names: validation with the original's messages, templates and instances.

/// Every unit type suffix systemd knows.
pub const UNIT_TYPES: &[&str] = &[
    "automount",
    "busname",
    "device",
    "mount",
    "path",
    "scope",
    "service",
    "slice",
    "snapshot",
    "socket",
    "swap",
    "target",
    "timer",
];

/// The unit types a template or instance may have.
pub const TEMPLATE_TYPES: &[&str] = &["path", "service", "socket", "target", "timer"];

pub const NAME_MAX: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("unit name cannot be empty")]
    Empty,
    #[error("unit name exceeds maximum length ({NAME_MAX})")]
    TooLong,
    #[error("unit name must contain \".\"")]
    NoDot,
    #[error("unit name cannot end in \".\"")]
    EndsInDot,
    #[error("invalid unit type: {0:?}")]
    InvalidType(String),
    #[error("invalid unit type for template: {0:?}")]
    InvalidTemplateType(String),
    #[error("invalid character {} in unit name", quote_rune(*.0))]
    InvalidCharacter(char),
    #[error("unit name cannot start in \"@\"")]
    StartsWithAt,
    /// Ours: a name starting with `-` reads as an option in the argument lists it reaches
    /// (`systemctl`, `journalctl`), and one starting with `.` names a hidden file or none
    /// (`.service`, `...service`).
    #[error("unit name cannot start in \"{0}\"")]
    StartsWith(char),
}

/// Formats a character the way Go's `%q` does for a rune.
fn quote_rune(c: char) -> String {
    match c {
        '\'' => "'\\''".to_string(),
        '\\' => "'\\\\'".to_string(),
        '\n' => "'\\n'".to_string(),
        '\t' => "'\\t'".to_string(),
        '\r' => "'\\r'".to_string(),
        c if c.is_control() => format!("'\\x{:02x}'", c as u32),
        c => format!("'{c}'"),
    }
}

/// Checks a unit name as the API does before storing anything.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > NAME_MAX {
        return Err(NameError::TooLong);
    }
    let Some(dot) = name.rfind('.') else {
        return Err(NameError::NoDot);
    };
    let (stem, suffix) = (&name[..dot], &name[dot + 1..]);
    if suffix.is_empty() {
        return Err(NameError::EndsInDot);
    }
    if !UNIT_TYPES.contains(&suffix) {
        return Err(NameError::InvalidType(suffix.to_string()));
    }
    if name.contains('@') && !TEMPLATE_TYPES.contains(&suffix) {
        return Err(NameError::InvalidTemplateType(suffix.to_string()));
    }
    if let Some(bad) = stem.chars().find(|c| !(c.is_ascii_alphanumeric() || ":_.@-\\".contains(*c))) {
        return Err(NameError::InvalidCharacter(bad));
    }
    if name.starts_with('@') {
        return Err(NameError::StartsWithAt);
    }
    if let Some(first @ ('-' | '.')) = name.chars().next() {
        return Err(NameError::StartsWith(first));
    }
    Ok(())
}

/// The parts of a unit name that templates and specifiers use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitNameInfo<'a> {
    /// The whole name (`%n`).
    pub full: &'a str,
    /// The name without its type suffix (`%N`).
    pub stem: &'a str,
    /// The part before `@`, or the stem when there is none (`%p`).
    pub prefix: &'a str,
    /// The text between the first `@` and the last `.` (`%i`); empty for templates.
    pub instance: &'a str,
    /// Whether the name has an `@` at all.
    has_at: bool,
}

impl<'a> UnitNameInfo<'a> {
    pub fn new(full: &'a str) -> Self {
        let stem = full.rfind('.').map_or(full, |dot| &full[..dot]);
        match stem.find('@') {
            Some(at) => Self { full, stem, prefix: &stem[..at], instance: &stem[at + 1..], has_at: true },
            None => Self { full, stem, prefix: stem, instance: "", has_at: false },
        }
    }

    /// `foo@.service`: a template, which is never scheduled itself.
    pub fn is_template(&self) -> bool {
        self.has_at && self.instance.is_empty()
    }

    /// `foo@bar.service`: an instance of `foo@.service`.
    pub fn is_instance(&self) -> bool {
        self.has_at && !self.instance.is_empty()
    }

    /// The template an instance comes from (`foo@bar.service` → `foo@.service`).
    pub fn template(&self) -> Option<String> {
        self.is_instance().then(|| format!("{}@{}", self.prefix, &self.full[self.stem.len()..]))
    }
}

/// What fleetctl makes of a unit argument: its file name, with `.service` added unless it
/// already ends in a valid unit type (the original only knew seven of them).
pub fn mangle(argument: &str) -> String {
    let argument = with_default_unit_type(argument);
    argument.trim_end_matches('/').rsplit('/').next().unwrap_or(&argument).to_string()
}

/// A command-line argument with `.service` appended unless it ends in a unit type, as the
/// original does before it reads the file: `hello` reads `hello.service`, `sub/web` reads
/// `sub/web.service`, and `bad.unittype` reads `bad.unittype.service`.
pub fn with_default_unit_type(argument: &str) -> String {
    let trimmed = argument.trim_end_matches('/');
    let base = trimmed.rsplit('/').next().unwrap_or(trimmed);
    let known = base.rsplit_once('.').is_some_and(|(_, suffix)| UNIT_TYPES.contains(&suffix));
    if known { trimmed.to_string() } else { format!("{trimmed}.service") }
}

/// Substitutes `%n %N %p %i` with the parts of the unit's name.
pub fn expand_specifiers(value: &str, name: &UnitNameInfo<'_>) -> String {
    value.replace("%n", name.full).replace("%N", name.stem).replace("%p", name.prefix).replace("%i", name.instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_messages() {
        let long = format!("{}.service", "a".repeat(250));
        let cases: &[(&str, Option<&str>)] = &[
            ("foo.service", None),
            ("foo@bar.service", None),
            ("foo@.service", None),
            ("a\\x2db.mount", None),
            ("x:y_z-1.2.target", None),
            ("", Some("unit name cannot be empty")),
            (&long, Some("unit name exceeds maximum length (256)")),
            ("foo", Some("unit name must contain \".\"")),
            ("foo.", Some("unit name cannot end in \".\"")),
            ("foo.bad", Some("invalid unit type: \"bad\"")),
            ("foo.Service", Some("invalid unit type: \"Service\"")),
            ("foo@bar.mount", Some("invalid unit type for template: \"mount\"")),
            ("foo/bar.service", Some("invalid character '/' in unit name")),
            ("foo bar.service", Some("invalid character ' ' in unit name")),
            ("@foo.service", Some("unit name cannot start in \"@\"")),
            ("-foo.service", Some("unit name cannot start in \"-\"")),
            ("--help.service", Some("unit name cannot start in \"-\"")),
            (".service", Some("unit name cannot start in \".\"")),
            ("...service", Some("unit name cannot start in \".\"")),
            ("a-.service", None),
        ];
        for (name, expected) in cases {
            let got = validate_name(name).err().map(|e| e.to_string());
            assert_eq!(got.as_deref(), *expected, "{name}");
        }
    }

    #[test]
    fn name_parts() {
        let info = UnitNameInfo::new("web@8080.service");
        assert_eq!((info.prefix, info.instance, info.stem), ("web", "8080", "web@8080"));
        assert!(info.is_instance() && !info.is_template());
        assert_eq!(info.template().as_deref(), Some("web@.service"));
        let template = UnitNameInfo::new("web@.service");
        assert!(template.is_template());
        assert_eq!(template.template(), None);
        let plain = UnitNameInfo::new("db.service");
        assert_eq!((plain.prefix, plain.instance), ("db", ""));
        assert!(!plain.is_instance() && !plain.is_template());
        let dotted = UnitNameInfo::new("a@b.c.service");
        assert_eq!(dotted.instance, "b.c");
    }

    #[test]
    fn mangling_keeps_every_unit_type() {
        assert_eq!(mangle("units/hello"), "hello.service");
        assert_eq!(mangle("/tmp/units/hello.service"), "hello.service");
        assert_eq!(mangle("foo.target"), "foo.target");
        assert_eq!(mangle("foo.bar"), "foo.bar.service");
        assert_eq!(with_default_unit_type("hello"), "hello.service");
        assert_eq!(with_default_unit_type("sub/web"), "sub/web.service");
        assert_eq!(with_default_unit_type("sub/web.socket"), "sub/web.socket");
        assert_eq!(with_default_unit_type("bad.unittype"), "bad.unittype.service");
    }
}
