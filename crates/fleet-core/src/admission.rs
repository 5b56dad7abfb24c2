//! What a unit must be to enter the cluster, wherever it comes from (the API, a git source):
//! the original's checks, plus ours.

use crate::Requirements;
use crate::service_values::check_service_directives;
use crate::unit_file::UnitFile;

/// The checks the original makes before creating a unit, plus ours: the options must read
/// back from their own serialisation unchanged (no smuggled lines, no NUL bytes, no line over
/// the length limit), every `[Service]` directive with a grammar must have a usable value, and so
/// must a reservation, a health check and a schedule.
pub fn admit_unit(name: &str, file: &UnitFile) -> Result<(), String> {
    file.check_writable().map_err(|error| error.to_string())?;
    check_service_directives(file).map_err(|error| error.to_string())?;
    crate::requirements::reservation_of(file.options()).map_err(|error| error.to_string())?;
    crate::requirements::check_tolerations(file.options())?;
    crate::requirements::priority_of(file.options())?;
    crate::requirements::check_at_most_once(file.options())?;
    crate::lost_after::lost_after_of(file.options())?;
    crate::disruption_budget::budget_of(name, file.options())?;
    let dependencies = crate::dependency::dependencies_of(name, file.options())?;
    if !dependencies.is_empty()
        && crate::job::job_of(name, file.options()).ok().flatten().is_some_and(|job| job.is_recorded())
    {
        return Err(format!(
            "[X-Fleet] {}= and {}= are not taken yet by units on a calendar, batch units or services that move when they fail",
            crate::dependency::REQUIRES_KEY,
            crate::dependency::AFTER_KEY
        ));
    }
    crate::health::check_of(&checked_as(name), file.options()).map_err(|error| error.to_string())?;
    crate::job::job_of(name, file.options()).map_err(|error| error.to_string())?;
    crate::job::refuse_what_is_not_run_yet(file.options()).map_err(|error| error.to_string())?;
    crate::secrets::references(file)?;
    Requirements::from_unit(name, file).validate().map_err(|error| error.to_string())
}

/// The name a unit's health check is read under: its own, or for a template (which runs only
/// as its instances) that of an instance `1`, so that `%i` in a port reads as a number. Each
/// instance's own check is read under its own name when it is submitted.
fn checked_as(name: &str) -> String {
    let info = crate::unit_name::UnitNameInfo::new(name);
    if !info.is_template() {
        return name.to_string();
    }
    let suffix = &name[info.stem.len()..];
    format!("{}@1{suffix}", info.prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_are_not_taken_yet_by_units_whose_runs_the_engine_keeps() {
        let file = UnitFile::parse(
            "[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Fleet]\nSchedule=daily\nRequires=db.service\n",
        )
        .expect("a unit");
        assert!(
            admit_unit("backup.service", &file)
                .is_err_and(|error| error.contains("not taken yet by units on a calendar"))
        );
        let file = UnitFile::parse("[Service]\nExecStart=/bin/app\n[X-Fleet]\nRequires=db.service\n").expect("a unit");
        assert_eq!(admit_unit("app.service", &file), Ok(()));
    }

    #[test]
    fn a_template_s_check_is_read_as_an_instance_s() {
        let file = UnitFile::parse("[X-Fleet]\nHealthCheck=http://127.0.0.1:80%i/health\n").expect("a unit");
        assert_eq!(admit_unit("web@.service", &file), Ok(()));
        assert_eq!(admit_unit("web@5.service", &file), Ok(()));
        assert!(admit_unit("web@x.service", &file).is_err_and(|error| error.contains("invalid port \"80x\"")));
        assert_eq!(checked_as("db.service"), "db.service");
    }

    #[test]
    fn a_toleration_that_cannot_be_read_is_refused_naming_the_option() {
        let file = UnitFile::parse("[X-Fleet]\nTolerate=gpu=yes db\nTolerate=zone\n").expect("a unit");
        assert_eq!(admit_unit("train.service", &file), Ok(()));
        let file = UnitFile::parse("[X-Fleet]\nTolerate=gpu:evict\n").expect("a unit");
        assert_eq!(
            admit_unit("train.service", &file),
            Err("invalid value for [X-Fleet] Tolerate: \"gpu:evict\" is not a toleration: expected key or key=value"
                .into())
        );
        let file = UnitFile::parse("[X-Fleet]\nTolerate=g/pu\n").expect("a unit");
        assert!(
            admit_unit("train.service", &file).is_err_and(|error| error.contains("Tolerate") && error.contains("g/pu"))
        );
    }

    #[test]
    fn a_priority_outside_0_to_1000_is_refused_naming_the_option() {
        for good in ["0", "50", " 900 ", "1000"] {
            let file = UnitFile::parse(&format!("[X-Fleet]\nPriority={good}\n")).expect("a unit");
            assert_eq!(admit_unit("web.service", &file), Ok(()), "{good}");
        }
        for bad in ["1001", "-1", "+5", "high", "", "5.0", "99999999999"] {
            let file = UnitFile::parse(&format!("[X-Fleet]\nPriority={bad}\n")).expect("a unit");
            assert_eq!(
                admit_unit("web.service", &file),
                Err(format!("invalid value {bad:?} for [X-Fleet] Priority: expected a whole number from 0 to 1000")),
                "{bad}"
            );
        }
        let file = UnitFile::parse("[X-Fleet]\nPriority=900\n").expect("a unit");
        assert_eq!(Requirements::from_unit("web.service", &file).priority, 900);
        assert_eq!(Requirements::from_unit("web.service", &UnitFile::parse("").expect("a unit")).priority, 50);
    }

    #[test]
    fn an_at_most_once_that_is_neither_true_nor_false_is_refused_naming_the_option() {
        for (good, asks) in
            [("true", true), (" Yes ", true), ("1", true), ("off", false), ("false", false), ("", false)]
        {
            let file = UnitFile::parse(&format!("[X-Fleet]\nAtMostOnce={good}\n")).expect("a unit");
            assert_eq!(admit_unit("web.service", &file), Ok(()), "{good:?}");
            assert_eq!(Requirements::from_unit("web.service", &file).at_most_once, asks, "{good:?}");
        }
        for bad in ["maybe", "2", "truee"] {
            let file = UnitFile::parse(&format!("[X-Fleet]\nAtMostOnce={bad}\n")).expect("a unit");
            assert_eq!(
                admit_unit("web.service", &file),
                Err(format!("invalid value {bad:?} for [X-Fleet] AtMostOnce: expected a boolean (yes or no)")),
                "{bad}"
            );
        }
        // The original's booleans read anything else as false, as the original does.
        let global = UnitFile::parse("[X-Fleet]\nGlobal=perhaps\n").expect("a unit");
        assert_eq!(admit_unit("web.service", &global), Ok(()));
    }

    #[test]
    fn retries_on_global_units_are_refused_and_malformed_job_options_say_why_first() {
        let file = UnitFile::parse("[Service]\nType=oneshot\n[X-Fleet]\nSchedule=daily\nRetries=2\n").expect("a unit");
        assert_eq!(admit_unit("backup.service", &file), Ok(()));
        let file = UnitFile::parse("[X-Fleet]\nBatch=true\nRetries=2\nRetryDelay=1min\n").expect("a unit");
        assert_eq!(admit_unit("migrate.service", &file), Ok(()));
        let file = UnitFile::parse("[X-Fleet]\nSchedule=daily\nGlobal=true\n").expect("a unit");
        assert_eq!(admit_unit("sweep.service", &file), Ok(()), "a global unit on a calendar runs everywhere");
        let file = UnitFile::parse("[X-Fleet]\nBatch=yes\nGlobal=true\n").expect("a unit");
        assert_eq!(admit_unit("patch.service", &file), Ok(()), "a global batch unit runs everywhere at each start");
        let file = UnitFile::parse("[X-Fleet]\nBatch=yes\nGlobal=true\nRetries=2\n").expect("a unit");
        assert!(admit_unit("patch.service", &file).is_err_and(|error| error.contains("Retries= on a global unit")));
        let file = UnitFile::parse("[X-Fleet]\nSchedule=25:00\nGlobal=true\n").expect("a unit");
        assert!(admit_unit("a.service", &file).is_err_and(|error| error.contains("the hour 25 is outside 0..23")));
        let file = UnitFile::parse("[Service]\nType=oneshot\nExecStart=/bin/true\n").expect("a unit");
        assert_eq!(admit_unit("setup.service", &file), Ok(()), "a oneshot service as before");
    }
}
