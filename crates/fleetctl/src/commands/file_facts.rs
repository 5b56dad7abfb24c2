//! What `list-unit-files` shows of a unit's file (its hash, description and whether it is
//! global), worked out once per distinct contents: a listing of many units usually holds few
//! files (every instance of a template shares one), and building and hashing a file per row was
//! most of fleetctl's time on a list of 100,000.

use std::collections::HashMap;
use std::rc::Rc;

use fleet_api_schema::{Unit, UnitOption};
use fleet_core::calendar::CalendarSpec;
use fleet_core::{Requirements, UnitFile, UnitHash};

use super::create::unit_file;

/// One file's facts.
pub struct FileFacts {
    file: UnitFile,
    pub hash: UnitHash,
    /// `[X-Fleet] Schedule=`, read (the last one, as fleet reads it).
    pub schedule: Option<CalendarSpec>,
    /// `[X-Fleet] Priority=` (the default where it sets none).
    pub priority: u16,
    /// `[X-Fleet] DisruptionBudget=` and `DisruptionBudgetBy=`.
    pub budget: Option<fleet_core::disruption_budget::DisruptionBudget>,
    /// `[X-Fleet] Requires=`, `After=`, `RequiresGrace=` and `RequiresChange=`.
    pub dependencies: fleet_core::dependency::Dependencies,
    /// Whether units with this file are global, when that does not depend on the unit's name
    /// (no `[X-Fleet]` value has a specifier such as `%i`).
    global_for_any_name: Option<bool>,
    /// Its placement terms no other column shows ([`Requirements::terms`]), likewise.
    terms_for_any_name: Option<Vec<String>>,
}

impl FileFacts {
    fn of(unit: &Unit) -> Self {
        let file = unit_file(unit);
        let names_matter =
            file.options().iter().any(|option| option.section == "X-Fleet" && option.value.contains('%'));
        let for_any_name = (!names_matter).then(|| Requirements::from_unit(&unit.name, &file));
        let global_for_any_name = for_any_name.as_ref().map(|requirements| requirements.global);
        let terms_for_any_name = for_any_name.as_ref().map(Requirements::terms);
        let priority =
            fleet_core::requirements::priority_of(file.options()).unwrap_or(fleet_core::requirements::DEFAULT_PRIORITY);
        // A budget does not depend on the unit's name once it belongs to a group.
        let budget = fleet_core::disruption_budget::budget_of(&unit.name, file.options()).ok().flatten();
        let dependencies = fleet_core::dependency::dependencies_of(&unit.name, file.options()).unwrap_or_default();
        Self {
            hash: file.hash(),
            global_for_any_name,
            terms_for_any_name,
            schedule: schedule_of(&file),
            priority,
            budget,
            dependencies,
            file,
        }
    }

    pub fn description(&self) -> Option<&str> {
        self.file.description()
    }

    /// The placement terms of `unit` (which has this file) that no other column shows.
    pub fn terms(&self, unit: &Unit) -> Vec<String> {
        match &self.terms_for_any_name {
            Some(terms) => terms.clone(),
            None => Requirements::from_unit(&unit.name, &self.file).terms(),
        }
    }

    /// Whether `unit` (which has this file) is global.
    pub fn global(&self, unit: &Unit) -> bool {
        self.global_for_any_name.unwrap_or_else(|| Requirements::from_unit(&unit.name, &self.file).global)
    }
}

/// A file's `[X-Fleet] Schedule=`, read.
fn schedule_of(file: &UnitFile) -> Option<CalendarSpec> {
    let value = file.values(fleet_core::unit_file::X_FLEET, "Schedule").last()?;
    CalendarSpec::parse(value.trim()).ok()
}

/// When `schedule` next elapses after now: `2026-12-05 01:00:00 UTC`, or `never`.
pub fn next_elapse_text(schedule: &CalendarSpec) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    match schedule.next_after(i64::try_from(now.as_micros()).unwrap_or(i64::MAX)) {
        Some(micros) => {
            let at = fleet_core::civil_time::rfc3339_of_micros(micros);
            at.replacen('T', " ", 1).replace('Z', " UTC")
        }
        None => "never".to_string(),
    }
}

/// The facts of each unit's file, computed once per distinct contents.
#[derive(Default)]
pub struct FactsByContents<'a> {
    known: HashMap<&'a [UnitOption], Rc<FileFacts>>,
}

impl<'a> FactsByContents<'a> {
    pub fn of(&mut self, unit: &'a Unit) -> Rc<FileFacts> {
        Rc::clone(self.known.entry(&unit.options).or_insert_with(|| Rc::new(FileFacts::of(unit))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str, text: &str) -> Unit {
        let file = UnitFile::parse(text).expect("a valid unit file");
        Unit { name: name.to_string(), options: super::super::create::schema_options(&file), ..Default::default() }
    }

    #[test]
    fn units_with_one_file_share_its_facts_and_others_get_their_own() {
        let a = unit("a@1.service", "[Unit]\nDescription=A\n[Service]\nExecStart=/bin/true\n");
        let b = unit("a@2.service", "[Unit]\nDescription=A\n[Service]\nExecStart=/bin/true\n");
        let c = unit("c.service", "[Unit]\nDescription=C\n[X-Fleet]\nGlobal=true\n");
        let mut facts = FactsByContents::default();
        let (fa, fb, fc) = (facts.of(&a), facts.of(&b), facts.of(&c));
        assert!(Rc::ptr_eq(&fa, &fb));
        assert_eq!(fa.hash, unit_file(&a).hash());
        assert_eq!(fc.hash, unit_file(&c).hash());
        assert_eq!((fa.description(), fc.description()), (Some("A"), Some("C")));
        assert_eq!((fa.global(&a), fc.global(&c)), (false, true));
    }

    #[test]
    fn a_global_that_names_the_instance_is_read_per_unit() {
        let text = "[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=%i\n";
        let (on, off) = (unit("g@true.service", text), unit("g@false.service", text));
        let mut facts = FactsByContents::default();
        let (f_on, f_off) = (facts.of(&on), facts.of(&off));
        assert!(Rc::ptr_eq(&f_on, &f_off));
        assert_eq!((f_on.global(&on), f_off.global(&off)), (true, false));
        assert_eq!(f_on.global(&on), Requirements::from_unit(&on.name, &unit_file(&on)).global);
    }
}
