//! What a unit must be to enter the cluster, wherever it comes from (the API, a git source):
//! the original's checks, plus ours.

use crate::Requirements;
use crate::service_values::check_service_directives;
use crate::unit_file::UnitFile;

/// The checks the original makes before creating a unit, plus ours: the options must read
/// back from their own serialisation unchanged (no smuggled lines, no NUL bytes, no line over
/// the length limit), every `[Service]` directive with a grammar must have a usable value, and so
/// must a reservation and a health check.
pub fn admit_unit(name: &str, file: &UnitFile) -> Result<(), String> {
    file.check_writable().map_err(|error| error.to_string())?;
    check_service_directives(file).map_err(|error| error.to_string())?;
    crate::requirements::reservation_of(file.options()).map_err(|error| error.to_string())?;
    crate::health::check_of(name, file.options()).map_err(|error| error.to_string())?;
    Requirements::from_unit(name, file).validate().map_err(|error| error.to_string())
}
