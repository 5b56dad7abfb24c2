//! What fleetd sets on itself before it starts anything: a private umask, and as many open
//! files as the machine allows it.

/// Files fleetd creates are private unless it says otherwise (units get systemd's 0022 back).
const UMASK: libc::mode_t = 0o077;

/// Sets the umask and raises the soft open-file limit to the hard one: fleetd holds pipes and
/// logs for every running unit, and must keep answering its API when units are many.
/// Returns the limit now in force, or why it could not be raised.
pub fn prepare_process() -> Result<u64, std::io::Error> {
    // SAFETY: umask cannot fail and touches nothing but the process's mask.
    unsafe { libc::umask(UMASK) };
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}
