use super::*;
use proptest::prelude::*;

#[test]
fn hash_matches_the_original() {
    let unit = UnitFile::parse("[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    assert_eq!(unit.hash().to_string(), "2d432f4a06608c1a8b2848b66c836793a1d48ce6");
    assert_eq!(unit.hash().short(), "2d432f4");
}

#[test]
fn normalises_like_the_original() {
    let text = "# comment\n\n  [Unit]\nDescription = Hello  \n; other\n[Service]\nExecStart=/bin/sh -c \"echo hi\"\n[Unit]\nAfter=x.service\n";
    let unit = UnitFile::parse(text).unwrap();
    assert_eq!(
        unit.serialize(),
        "[Unit]\nDescription=Hello\nAfter=x.service\n\n[Service]\nExecStart=/bin/sh -c \"echo hi\"\n"
    );
    assert_eq!(unit.description(), Some("Hello"));
}

#[test]
fn continuation_lines_keep_backslash_and_newline() {
    let unit = UnitFile::parse("[Service]\nExecStart=/bin/echo \\\n   two\nUser=x\n").unwrap();
    assert_eq!(unit.options()[0].value, "/bin/echo \\\n   two");
    assert_eq!(unit.options()[1].value, "x");
}

#[test]
fn continuation_at_end_of_file_keeps_the_newline() {
    let unit = UnitFile::parse("[Service]\nExecStart=foo\\\n").unwrap();
    assert_eq!(unit.options()[0].value, "foo\\\n");
    // Found by fuzzing: without the file's last newline the value read differently, so the
    // normalised text did not read back to itself.
    let unterminated = UnitFile::parse("[Service]\nExecStart=foo\\").unwrap();
    assert_eq!(unterminated, unit);
    assert_eq!(UnitFile::parse(&unit.serialize()).unwrap(), unit);
    // Found by fuzzing too: blanks after the last backslash were trimmed away, leaving a
    // backslash that the normalised text then read as a continuation.
    let blanks = UnitFile::parse("[Service]\nExecStart=foo\\  ").unwrap();
    assert_eq!(UnitFile::parse(&blanks.serialize()).unwrap(), blanks);
    let inner = UnitFile::parse("[Service]\nExecStart=a \\  \n  b\n").unwrap();
    assert_eq!(inner.options()[0].value, "a \\  \n  b");
    assert_eq!(UnitFile::parse(&inner.serialize()).unwrap(), inner);
}

#[test]
fn empty_values_and_files() {
    assert_eq!(UnitFile::parse("").unwrap().serialize(), "");
    assert_eq!(UnitFile::parse("[Unit]\n").unwrap().serialize(), "");
    let unit = UnitFile::parse("[Service]\nEnvironment=\n").unwrap();
    assert_eq!(unit.serialize(), "[Service]\nEnvironment=\n");
}

#[test]
fn errors_name_the_line() {
    let cases = [
        ("[Unit]\nDescription=x\nbogus line\n", 3, "expected \"Name=Value\", found \"bogus line\""),
        ("[Unit\n", 1, "section header has no closing \"]\""),
        ("[Unit] x\n", 1, "found garbage after section name \"Unit\""),
        ("Description=x\n", 1, "option \"Description\" stands before any [Section] header"),
        ("[Unit]\n=x\n", 2, "option name is empty"),
    ];
    for (text, line, reason) in cases {
        let error = UnitFile::parse(text).unwrap_err();
        assert_eq!(error.line, line, "{text:?}");
        assert_eq!(error.reason.to_string(), reason, "{text:?}");
    }
    let long = format!("[Service]\nExecStart={}\n", "a".repeat(LINE_MAX));
    let error = UnitFile::parse(&long).unwrap_err();
    assert_eq!(error.to_string(), "line 2: line too long (max 2048 bytes)");
}

#[test]
fn hash_hex_round_trip() {
    let hash = UnitFile::parse("[A]\nb=c\n").unwrap().hash();
    assert_eq!(UnitHash::parse_hex(&hash.to_string()), Some(hash));
    assert_eq!(UnitHash::parse_hex("zz"), None);
    assert_eq!(UnitHash::parse_hex(&hash.to_string().to_uppercase()), Some(hash));
    assert_eq!(UnitHash::parse_hex(&format!("+{}", &hash.to_string()[1..])), None);
    assert_eq!(UnitHash::parse_hex(&format!("é{}", &hash.to_string()[2..])), None);
    let json = serde_json::to_string(&hash).expect("serialized");
    assert_eq!(json, format!("\"{hash}\""));
    assert_eq!(serde_json::from_str::<UnitHash>(&json).ok(), Some(hash));
    assert!(serde_json::from_str::<UnitHash>("\"abc\"").is_err());
    assert!(serde_json::from_str::<UnitHash>("12").is_err());
}

fn unit_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        "[A-Za-z-]{1,8}".prop_map(|s| format!("[{s}]")),
        "[A-Za-z]{1,8}=[ -~]{0,20}",
        "#[ -~]{0,10}",
        Just(String::new()),
        "[ -~]{0,30}",
        "[A-Za-z]{1,5}=[a-z ]{0,5}\\\\",
    ];
    prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n"))
}

proptest! {
    #[test]
    fn parse_never_panics(text in "\\PC{0,200}") {
        let _ = UnitFile::parse(&text);
    }

    /// Normalised text reads back to itself. The one exception is inherited from systemd's
    /// format: a value ending in a backslash continues onto the next line when read again,
    /// so such files settle after one more round.
    #[test]
    fn serialise_then_parse_is_stable(text in unit_text()) {
        if let Ok(unit) = UnitFile::parse(&text) {
            let once = unit.serialize();
            let again = UnitFile::parse(&once).expect("normalised text parses");
            if unit.options().iter().all(|option| !option.value.ends_with('\\')) {
                prop_assert_eq!(again.serialize(), once.clone());
                prop_assert_eq!(again.hash(), unit.hash());
            }
            let twice = again.serialize();
            prop_assert_eq!(UnitFile::parse(&twice).expect("parses").serialize(), twice);
        }
    }
}

#[test]
fn options_are_grouped_by_section_as_the_text_reads_back() {
    let file = UnitFile::parse("[Unit]\nA=1\n[Service]\nB=2\n[Unit]\nC=3\n").unwrap();
    let order: Vec<&str> = file.options().iter().map(|option| option.name.as_str()).collect();
    assert_eq!(order, ["A", "C", "B"]);
    let given = UnitFile::from_options(vec![
        UnitOption::new("Unit", "A", "1"),
        UnitOption::new("Service", "B", "2"),
        UnitOption::new("Unit", "C", "3"),
    ]);
    assert_eq!(given, file);
    assert_eq!(given.hash(), file.hash());
}

/// Regression: a value with a newline smuggled an `[X-Fleet]` line into what `fleetctl cat`
/// shows, while the unit was scheduled by its real options.
#[test]
fn options_that_would_not_read_back_are_refused() {
    let refused = |section: &str, name: &str, value: &str| {
        UnitFile::from_options(vec![UnitOption::new(section, name, value)]).check_writable().unwrap_err().problem
    };
    assert_eq!(refused("Service", "ExecStart", "/bin/true\n[X-Fleet]\nMachineID=x"), OptionProblem::NewlineInValue);
    assert_eq!(refused("Service", "ExecStart", "/bin/true\0"), OptionProblem::NulInValue);
    assert_eq!(refused("", "ExecStart", "x"), OptionProblem::EmptySection);
    assert_eq!(refused("Ser]vice", "ExecStart", "x"), OptionProblem::BadSection);
    assert_eq!(refused("Service", "Exec=Start", "x"), OptionProblem::BadName);
    assert_eq!(refused("Service", "", "x"), OptionProblem::BadName);
    assert_eq!(refused("Service", " ExecStart", "x"), OptionProblem::BadName);
    // A backslash continuation is a newline a unit file can hold.
    let continued = UnitFile::from_options(vec![UnitOption::new("Service", "ExecStart", "/bin/sh -c \\\n  true")]);
    assert_eq!(continued.check_writable(), Ok(()));
    assert_eq!(UnitFile::parse("[Unit]\nA=1\n[Service]\nB= 2 \n").unwrap().check_writable(), Ok(()));
}
