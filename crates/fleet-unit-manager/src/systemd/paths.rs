//! Names and places systemd uses, as pure functions.

use std::path::{Path, PathBuf};

use fleet_core::UnitFile;

/// The D-Bus object path of the unit called `name`: systemd escapes every byte that is not
/// an ASCII letter or digit (and a leading digit) as `_xx`.
pub fn unit_object_path(name: &str) -> String {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    for (index, byte) in name.bytes().enumerate() {
        if byte.is_ascii_alphabetic() || (byte.is_ascii_digit() && index > 0) {
            path.push(byte as char);
        } else {
            path.push_str(&format!("_{byte:02x}"));
        }
    }
    path
}

/// Where systemd keeps runtime unit links: `/run/systemd/system` for the system instance,
/// `$XDG_RUNTIME_DIR/systemd/user` for a user instance.
pub fn runtime_unit_dir(user: bool, xdg_runtime_dir: Option<&Path>) -> Option<PathBuf> {
    if user { xdg_runtime_dir.map(|dir| dir.join("systemd/user")) } else { Some(PathBuf::from("/run/systemd/system")) }
}

/// The drop-in that hands systemd a unit's reservation as limits (`limits`, from
/// `fleet_core::requirements::reservation_limits`), or `None` when there is nothing to add.
/// CPU is a percentage of one core, rounded up to a whole one.
pub fn reservation_drop_in(limits: fleet_core::Resources) -> Option<String> {
    if limits.is_zero() {
        return None;
    }
    let mut text = String::from(
        "# Written by fleet: the unit's [X-Fleet] reservation, as limits it did not set itself.\n[Service]\n",
    );
    if limits.memory > 0 {
        text.push_str(&format!("MemoryMax={}\n", limits.memory));
    }
    if limits.cpu_millis > 0 {
        text.push_str(&format!("CPUQuota={}%\n", limits.cpu_millis.div_ceil(10)));
    }
    Some(text)
}

/// The name of that drop-in in the unit's `.d` directory.
pub const RESERVATION_DROP_IN: &str = "50-fleet-reservation.conf";

/// The drop-in that hands systemd a unit's credentials, the files `names` in `dir`: the
/// system instance loads each (`LoadCredential=`) into the unit's own `$CREDENTIALS_DIRECTORY`;
/// a user instance (which before systemd 254 delivers no credentials) is pointed at `dir`
/// itself. `None` when there are none.
pub fn credentials_drop_in(user: bool, dir: &Path, names: &[&str]) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    let mut text = String::from("# Written by fleet: the unit's [X-Fleet] Secret= credentials.\n[Service]\n");
    if user {
        text.push_str(&format!("Environment=CREDENTIALS_DIRECTORY={}\n", dir.display()));
    } else {
        for name in names {
            text.push_str(&format!("LoadCredential={name}:{}\n", dir.join(name).display()));
        }
    }
    Some(text)
}

/// The file name of [`credentials_drop_in`].
pub const CREDENTIALS_DROP_IN: &str = "50-fleet-credentials.conf";

/// Whether the unit has an `[Install]` section, which fleet enables at runtime.
pub fn has_install_section(file: &UnitFile) -> bool {
    file.options().iter().any(|option| option.section == "Install")
}

/// Whether `name` could be a unit file fleet wrote (and not, say, a temporary file).
pub fn is_unit_file_name(name: &str) -> bool {
    !name.starts_with('.') && fleet_core::unit_name::validate_name(name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_loaded_by_systemd_or_pointed_at_in_a_user_instance() {
        let dir = Path::new("/run/fleet/credentials/m1/web.service");
        let system = credentials_drop_in(false, dir, &["DB", "api"]).unwrap();
        assert!(system.ends_with(
            "[Service]\nLoadCredential=DB:/run/fleet/credentials/m1/web.service/DB\nLoadCredential=api:/run/fleet/credentials/m1/web.service/api\n"
        ));
        let user = credentials_drop_in(true, dir, &["DB"]).unwrap();
        assert!(user.ends_with("[Service]\nEnvironment=CREDENTIALS_DIRECTORY=/run/fleet/credentials/m1/web.service\n"));
        assert_eq!(credentials_drop_in(false, dir, &[]), None);
    }

    #[test]
    fn object_paths_are_escaped_as_systemd_does() {
        assert_eq!(unit_object_path("hello.service"), "/org/freedesktop/systemd1/unit/hello_2eservice");
        assert_eq!(unit_object_path("a-b@1.service"), "/org/freedesktop/systemd1/unit/a_2db_401_2eservice");
        assert_eq!(unit_object_path("1x.service"), "/org/freedesktop/systemd1/unit/_31x_2eservice");
    }

    #[test]
    fn a_reservation_becomes_the_limits_the_unit_left_open() {
        let limits = |memory, cpu_millis| fleet_core::Resources { memory, cpu_millis };
        assert_eq!(reservation_drop_in(limits(0, 0)), None);
        let both = reservation_drop_in(limits(64 << 20, 500)).unwrap();
        assert!(both.ends_with("[Service]\nMemoryMax=67108864\nCPUQuota=50%\n"), "{both}");
        let cpu = reservation_drop_in(limits(0, 1)).unwrap();
        assert!(cpu.ends_with("[Service]\nCPUQuota=1%\n"), "{cpu}");
    }

    #[test]
    fn runtime_dirs_and_install_sections() {
        assert_eq!(runtime_unit_dir(false, None), Some(PathBuf::from("/run/systemd/system")));
        assert_eq!(
            runtime_unit_dir(true, Some(Path::new("/run/user/0"))),
            Some(PathBuf::from("/run/user/0/systemd/user"))
        );
        assert_eq!(runtime_unit_dir(true, None), None);
        let with = UnitFile::parse("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=x.service\n").unwrap();
        let without = UnitFile::parse("[Service]\nExecStart=/bin/true\n").unwrap();
        assert!(has_install_section(&with));
        assert!(!has_install_section(&without));
        assert!(is_unit_file_name("hello@1.service"));
        assert!(!is_unit_file_name(".hello.service.tmp"));
        assert!(!is_unit_file_name("notes.txt"));
    }
}
