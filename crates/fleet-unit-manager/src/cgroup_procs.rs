//! Cgroups a process joins between fork and exec: the `cgroup.procs` files it writes itself
//! into, prepared before the fork (the child may only make system calls). The native
//! supervisor's units and the health checks of any unit both start this way, while still
//! root: once the unit's user, a process could not move itself out of fleetd's cgroup.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The `cgroup.procs` files of the cgroups to join, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupProcs(Vec<CString>);

impl CgroupProcs {
    /// The cgroups whose directories are `dirs`.
    pub fn of_dirs<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> io::Result<Self> {
        let mut procs = Self::default();
        for dir in dirs {
            procs.push(dir)?;
        }
        Ok(procs)
    }

    /// Adds the cgroup whose directory is `dir`.
    pub fn push(&mut self, dir: &Path) -> io::Result<()> {
        let file = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cgroup path has a NUL byte"))?;
        self.0.push(file);
        Ok(())
    }

    /// Moves the calling process into each cgroup. Meant for a child between fork and exec:
    /// it only makes system calls (open, write, close) on memory prepared before the fork.
    pub fn join_from_child(&self) -> io::Result<()> {
        for procs in &self.0 {
            // SAFETY: open/write/close are async-signal-safe; `procs` outlives the call.
            unsafe {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// Between fork and exec, after joining any cgroup: becomes `gid` (without supplementary
/// groups when it also changes user) and `uid`. Only system calls, no allocation.
pub fn become_account(uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    // SAFETY: setgroups, setgid and setuid are async-signal-safe system calls on plain integers.
    unsafe {
        if let Some(gid) = gid {
            if uid.is_some() && libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setgid(gid) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(uid) = uid
            && libc::setuid(uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
