//! Replacing fleetd in place for an upgrade: `execve` of the binary fleetd was started from
//! (by then the new release), same PID, same arguments. Units under systemd are systemd's and
//! run on; the native supervisor's are children of fleetd, which `execve` keeps, and it hands
//! them over (see `native::handover`).

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The image fleetd replaces itself with, and the nonce its handover carries.
#[derive(Clone, Debug)]
pub struct Reexec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub environment: Vec<(OsString, OsString)>,
    /// Carried in the environment (`FLEETD_REEXEC`) and in what is handed over: the next
    /// image takes only the handover written for it.
    pub nonce: String,
}

impl Reexec {
    /// The `execve` arguments: the program, its arguments (the program first) and its
    /// environment with the nonce.
    pub fn image(&self) -> io::Result<ExecImage> {
        let text = |value: &[u8]| {
            CString::new(value).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in fleetd's arguments or environment")
            })
        };
        let program = text(self.program.as_os_str().as_bytes())?;
        let mut argv = vec![program.clone()];
        for arg in &self.args {
            argv.push(text(arg.as_bytes())?);
        }
        let mut envp = Vec::new();
        for (name, value) in &self.environment {
            if name.as_bytes() == REEXEC_VARIABLE.as_bytes() {
                continue;
            }
            let mut pair = name.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            envp.push(text(&pair)?);
        }
        envp.push(text(format!("{REEXEC_VARIABLE}={}", self.nonce).as_bytes())?);
        Ok(ExecImage { program, argv, envp })
    }
}

/// The environment variable that carries the nonce from one image to the next.
pub const REEXEC_VARIABLE: &str = "FLEETD_REEXEC";

/// Ready-made `execve` arguments (built before the call: nothing is allocated after).
#[derive(Debug)]
pub struct ExecImage {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl ExecImage {
    /// Calls `execve`; returns only if it failed, with why.
    pub fn exec(&self) -> io::Error {
        let mut argv: Vec<*const libc::c_char> = self.argv.iter().map(|arg| arg.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = self.envp.iter().map(|pair| pair.as_ptr()).collect();
        envp.push(std::ptr::null());
        // SAFETY: every pointer is to a NUL-terminated string owned by self, which outlives
        // the call; both arrays end with a null pointer as execve requires.
        unsafe { libc::execve(self.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        io::Error::last_os_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_carries_the_arguments_and_one_nonce() {
        let reexec = Reexec {
            program: "/usr/bin/fleetd".into(),
            args: vec!["-config".into(), "/etc/fleet/fleet.conf".into()],
            environment: vec![("PATH".into(), "/bin".into()), (REEXEC_VARIABLE.into(), "old".into())],
            nonce: "n1".into(),
        };
        let image = reexec.image().unwrap();
        let argv: Vec<&str> = image.argv.iter().map(|arg| arg.to_str().unwrap()).collect();
        assert_eq!(argv, ["/usr/bin/fleetd", "-config", "/etc/fleet/fleet.conf"]);
        let envp: Vec<&str> = image.envp.iter().map(|pair| pair.to_str().unwrap()).collect();
        assert_eq!(envp, ["PATH=/bin", "FLEETD_REEXEC=n1"]);
    }

    #[test]
    fn a_missing_program_is_an_error_not_an_exit() {
        let reexec =
            Reexec { program: "/nonexistent/fleetd".into(), args: vec![], environment: vec![], nonce: "n".into() };
        let error = reexec.image().unwrap().exec();
        assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
    }
}
