//! Unit files: the lexer, the normalised serialisation and the unit hash.
//!
//! The serialisation defines the unit hash, so it follows the original byte for byte:
//! sections in order of first appearance, each option under its section in file order,
//! `Name=Value` lines, one blank line between sections and none at the end.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};

/// The longest line the lexer accepts, in bytes (systemd's own limit).
pub const LINE_MAX: usize = 2048;

/// The section fleet's own options live in.
pub const X_FLEET: &str = "X-Fleet";

/// The value of the last `name=` of `section` among `options` (a later one overrides, as in
/// systemd).
pub fn last_value<'o>(options: &'o [UnitOption], section: &str, name: &str) -> Option<&'o str> {
    options.iter().rev().find(|option| option.section == section && option.name == name).map(|o| o.value.as_str())
}

/// One `Name=Value` line of a unit file, with the section it stands in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UnitOption {
    pub section: String,
    pub name: String,
    pub value: String,
}

impl UnitOption {
    pub fn new(section: &str, name: &str, value: &str) -> Self {
        Self { section: section.into(), name: name.into(), value: value.into() }
    }
}

/// A parsed unit file: its options in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitFile {
    options: Vec<UnitOption>,
}

/// Why a unit file could not be read, and on which line (1-based).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: ParseErrorReason,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorReason {
    #[error("line too long (max {LINE_MAX} bytes)")]
    LineTooLong,
    #[error("section header has no closing \"]\"")]
    UnclosedSection,
    #[error("found garbage after section name {0:?}")]
    GarbageAfterSection(String),
    #[error("option {0:?} stands before any [Section] header")]
    OptionOutsideSection(String),
    #[error("expected \"Name=Value\", found {0:?}")]
    MissingEquals(String),
    #[error("option name is empty")]
    EmptyName,
}

/// An option a unit file cannot hold as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct OptionError {
    pub section: String,
    pub name: String,
    pub problem: OptionProblem,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            // The lexer's reason names no option (e.g. a line over the length limit).
            OptionProblem::Unreadable(error) => write!(f, "{}", error.reason),
            problem => write!(f, "invalid option {:?} in section {:?}: {problem}", self.name, self.section),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionProblem {
    #[error("empty section name")]
    EmptySection,
    #[error("section name has a bracket, newline or NUL byte")]
    BadSection,
    #[error("option name is empty or has \"=\", a newline, a NUL byte or surrounding spaces")]
    BadName,
    #[error("value has a NUL byte")]
    NulInValue,
    #[error("value has a newline that is not a backslash continuation")]
    NewlineInValue,
    #[error("value does not read back as written (an empty continuation line)")]
    DoesNotReadBack,
    #[error("{0}")]
    Unreadable(ParseError),
}

impl UnitFile {
    /// Reads unit-file text the way systemd's lexer does (comments dropped, names and values
    /// trimmed, backslash continuations kept in the value).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let lines: Vec<&str> = text.split('\n').collect();
        let mut options = Vec::new();
        let mut section: Option<String> = None;
        let mut index = 0;
        while index < lines.len() {
            let number = index + 1;
            let line = lines[index];
            index += 1;
            let fail = |reason| Err(ParseError { line: number, reason });
            if line.len() >= LINE_MAX {
                return fail(ParseErrorReason::LineTooLong);
            }
            let content = line.trim_start();
            if content.is_empty() || content.starts_with('#') || content.starts_with(';') {
                continue;
            }
            if let Some(header) = content.strip_prefix('[') {
                let Some(end) = header.find(']') else {
                    return fail(ParseErrorReason::UnclosedSection);
                };
                let name = &header[..end];
                if !header[end + 1..].trim().is_empty() {
                    return fail(ParseErrorReason::GarbageAfterSection(name.to_string()));
                }
                section = Some(name.to_string());
                continue;
            }
            let Some(equals) = content.find('=') else {
                return fail(ParseErrorReason::MissingEquals(content.trim_end().to_string()));
            };
            let name = content[..equals].trim();
            if name.is_empty() {
                return fail(ParseErrorReason::EmptyName);
            }
            let Some(section) = &section else {
                return fail(ParseErrorReason::OptionOutsideSection(name.to_string()));
            };
            // The value runs to the end of the line, and on through every line that the
            // previous one continued with a trailing backslash; a blank line ends it.
            let mut value = String::new();
            let mut segment = &content[equals + 1..];
            loop {
                if segment.trim().is_empty() {
                    break;
                }
                value.push_str(segment);
                // As systemd: a backslash continues the line even with blanks after it.
                let continues = segment.trim_end().ends_with('\\');
                if continues {
                    value.push('\n');
                }
                // A continued line that the file ends on has no next line to join; it keeps
                // its newline all the same, so the text reads back to itself.
                if !continues || index >= lines.len() {
                    break;
                }
                segment = lines[index];
                if segment.len() >= LINE_MAX {
                    return Err(ParseError { line: index + 1, reason: ParseErrorReason::LineTooLong });
                }
                index += 1;
            }
            let value = if value.ends_with('\n') { format!("{}\n", value.trim()) } else { value.trim().to_string() };
            options.push(UnitOption { section: section.clone(), name: name.to_string(), value });
        }
        Ok(Self::from_options(options))
    }

    /// A unit of these options, grouped by section in order of first appearance (file order
    /// within a section), as the serialisation writes them and re-reading it returns them.
    pub fn from_options(mut options: Vec<UnitOption>) -> Self {
        let mut sections: Vec<&str> = Vec::new();
        let positions: Vec<usize> = options
            .iter()
            .map(|option| match sections.iter().position(|section| *section == option.section) {
                Some(position) => position,
                None => {
                    sections.push(&option.section);
                    sections.len() - 1
                }
            })
            .collect();
        if positions.windows(2).any(|pair| pair[0] > pair[1]) {
            let mut ranked: Vec<(usize, UnitOption)> = positions.into_iter().zip(options).collect();
            ranked.sort_by_key(|(position, _)| *position);
            options = ranked.into_iter().map(|(_, option)| option).collect();
        }
        Self { options }
    }

    /// Checks that the options say exactly what their serialisation says: names and section
    /// names that a unit file can hold, no NUL byte anywhere, and no newline in a value but
    /// a backslash continuation. A unit that passes reads back from its text unchanged, so
    /// what `fleetctl cat` shows is what runs and is scheduled.
    pub fn check_writable(&self) -> Result<(), OptionError> {
        for option in &self.options {
            let bad = |problem| OptionError { section: option.section.clone(), name: option.name.clone(), problem };
            if option.section.is_empty() {
                return Err(bad(OptionProblem::EmptySection));
            }
            if option.section.contains(['[', ']', '\n', '\r', '\0']) {
                return Err(bad(OptionProblem::BadSection));
            }
            if option.name.is_empty()
                || option.name.contains(['=', '\n', '\r', '\0', '[', '#', ';'])
                || option.name.trim() != option.name
            {
                return Err(bad(OptionProblem::BadName));
            }
            if option.value.contains('\0') {
                return Err(bad(OptionProblem::NulInValue));
            }
            if option.value.contains('\r')
                || option.value.split('\n').rev().skip(1).any(|line| !line.trim_end().ends_with('\\'))
            {
                return Err(bad(OptionProblem::NewlineInValue));
            }
        }
        // Values may lose surrounding spaces on the way (the lexer trims them); sections,
        // names and the number of options may not change.
        let read_back = Self::parse(&self.serialize()).map_err(|error| OptionError {
            section: String::new(),
            name: String::new(),
            problem: OptionProblem::Unreadable(error),
        })?;
        let same = |mine: &UnitOption, theirs: &UnitOption| {
            mine.section == theirs.section && mine.name == theirs.name && mine.value.trim() == theirs.value.trim()
        };
        let differs = (0..self.options.len().max(read_back.options.len())).find(|index| {
            match (self.options.get(*index), read_back.options.get(*index)) {
                (Some(mine), Some(theirs)) => !same(mine, theirs),
                _ => true,
            }
        });
        if let Some(index) = differs {
            let option = self.options.get(index).or(self.options.last()).unwrap_or(&read_back.options[index]);
            return Err(OptionError {
                section: option.section.clone(),
                name: option.name.clone(),
                problem: OptionProblem::DoesNotReadBack,
            });
        }
        Ok(())
    }

    pub fn options(&self) -> &[UnitOption] {
        &self.options
    }

    pub fn into_options(self) -> Vec<UnitOption> {
        self.options
    }

    /// The values of every option `name` in section `section`, in file order.
    pub fn values<'a>(&'a self, section: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.options
            .iter()
            .filter(move |option| option.section == section && option.name == name)
            .map(|option| option.value.as_str())
    }

    pub fn has_section(&self, section: &str) -> bool {
        self.options.iter().any(|option| option.section == section)
    }

    /// The first `[Unit] Description=`, as list-unit-files shows it.
    pub fn description(&self) -> Option<&str> {
        self.values("Unit", "Description").next()
    }

    /// The normalised text: what `fleetctl cat` prints and what the hash is taken over.
    pub fn serialize(&self) -> String {
        let mut sections: Vec<(&str, Vec<&UnitOption>)> = Vec::new();
        for option in &self.options {
            match sections.iter_mut().find(|(name, _)| *name == option.section) {
                Some((_, options)) => options.push(option),
                None => sections.push((&option.section, vec![option])),
            }
        }
        let mut text = String::new();
        for (position, (section, options)) in sections.iter().enumerate() {
            if position > 0 {
                text.push('\n');
            }
            text.push('[');
            text.push_str(section);
            text.push_str("]\n");
            for option in options {
                text.push_str(&option.name);
                text.push('=');
                text.push_str(&option.value);
                text.push('\n');
            }
        }
        text
    }

    pub fn hash(&self) -> UnitHash {
        UnitHash(Sha1::digest(self.serialize().as_bytes()).into())
    }
}

/// The SHA1 of a unit's normalised text; two units match iff their hashes are equal.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnitHash(pub [u8; 20]);

impl UnitHash {
    /// The 7-character form tables show.
    pub fn short(&self) -> String {
        self.to_string()[..7].to_string()
    }

    pub fn parse_hex(text: &str) -> Option<Self> {
        if text.len() != 40 {
            return None;
        }
        fn nibble(digit: u8) -> Option<u8> {
            match digit {
                b'0'..=b'9' => Some(digit - b'0'),
                b'a'..=b'f' => Some(digit - b'a' + 10),
                b'A'..=b'F' => Some(digit - b'A' + 10),
                _ => None,
            }
        }
        let mut bytes = [0u8; 20];
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(Self(bytes))
    }

    /// The 40 lowercase hex digits, without formatting machinery (hashes are written and
    /// read by the ten thousand).
    fn hex_digits(&self) -> [u8; 40] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 40];
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        out
    }
}

impl fmt::Display for UnitHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.hex_digits();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for UnitHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitHash({self})")
    }
}

impl Serialize for UnitHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let digits = self.hex_digits();
        serializer.serialize_str(std::str::from_utf8(&digits).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for UnitHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Reads the hex digits where they lie, without a copy.
        struct HexDigits;
        impl serde::de::Visitor<'_> for HexDigits {
            type Value = UnitHash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a unit hash: 40 hex digits")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<UnitHash, E> {
                UnitHash::parse_hex(text).ok_or_else(|| E::custom(format!("invalid unit hash {text:?}")))
            }
        }
        deserializer.deserialize_str(HexDigits)
    }
}

#[cfg(test)]
mod tests;
