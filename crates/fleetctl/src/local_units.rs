//! Unit files on the local disk, and the lookup of templates for instances.

use std::path::{Path, PathBuf};

use fleet_core::UnitFile;
use fleet_core::unit_name::UnitNameInfo;
use fleet_core::unknown_options::{Unknown, ignored_metadata_notes, unknown_options};

/// Reads a unit file; `None` when there is no such file. A malformed file is an error that
/// names the file and the line.
pub fn read_unit_file(path: &Path) -> Result<Option<UnitFile>, String> {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map_err(|_| format!("{}: not valid UTF-8", path.display()))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) if error.kind() == std::io::ErrorKind::IsADirectory => return Ok(None),
        Err(error) => return Err(format!("{}: {error}", path.display())),
    };
    UnitFile::parse(&text).map(Some).map_err(|error| format!("{}: {error}", path.display()))
}

/// Says on stderr what in `file`, about to be submitted as `name`, neither systemd nor fleet
/// knows, and the metadata requirements that are ignored for not being one `key=value` (the
/// unit is still submitted, as the original did). An unknown `[X-Fleet]` key gets the
/// original's warning, with the nearest known key when one is near.
pub fn warn_ignored_options(name: &str, file: &UnitFile) {
    for unknown in unknown_options(file.options()) {
        match unknown {
            Unknown::Option { section, name: key, nearest } if section == fleet_core::unit_file::X_FLEET => {
                let hint = nearest.map(|nearest| format!("; did you mean {nearest:?}?")).unwrap_or_default();
                eprintln!("Unit {name}: unrecognized requirement in [X-Fleet] section: {key:?}{hint}");
            }
            unknown => eprintln!("Unit {name}: {unknown}"),
        }
    }
    for note in ignored_metadata_notes(name, file) {
        eprintln!("Unit {name}: {note}");
    }
}

/// Where the template of the instance `name` would be, beside the file `argument` names.
pub fn local_template_path(argument: &str, name: &str) -> Option<PathBuf> {
    let template = UnitNameInfo::new(name).template()?;
    let directory = Path::new(argument).parent().unwrap_or(Path::new(""));
    Some(directory.join(template))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_reports_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.service");
        std::fs::write(&good, "[Service]\nExecStart=/bin/true\n").unwrap();
        assert!(read_unit_file(&good).unwrap().is_some());
        let bad = dir.path().join("bad.service");
        std::fs::write(&bad, "[Service]\nExecStart=/bin/true\nnonsense\n").unwrap();
        let error = read_unit_file(&bad).unwrap_err();
        assert!(error.ends_with("bad.service: line 3: expected \"Name=Value\", found \"nonsense\""), "{error}");
        assert_eq!(read_unit_file(&dir.path().join("missing.service")).unwrap(), None);
        assert_eq!(
            local_template_path("units/web@1.service", "web@1.service"),
            Some(PathBuf::from("units/web@.service"))
        );
        assert_eq!(local_template_path("web.service", "web.service"), None);
    }
}
