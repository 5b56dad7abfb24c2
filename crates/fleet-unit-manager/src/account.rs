//! Users and groups by name or number, for what runs as a unit's `User=` and `Group=`.

use std::ffi::CString;
use std::io;

/// A resolved `User=`.
#[derive(Clone, Debug)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    pub home: String,
    pub shell: String,
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))
}

/// Looks a user up by name or number.
pub fn lookup_user(name: &str) -> io::Result<Account> {
    let wanted = c_string(name)?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data (integers and pointers); all zeroes is a valid value.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live, correctly sized memory for the duration of the call.
    let status = unsafe {
        match name.parse::<u32>() {
            Ok(uid) => libc::getpwuid_r(uid, &mut entry, buffer.as_mut_ptr(), buffer.len(), &mut found),
            Err(_) => libc::getpwnam_r(wanted.as_ptr(), &mut entry, buffer.as_mut_ptr(), buffer.len(), &mut found),
        }
    };
    if status != 0 || found.is_null() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no such user {name:?}")));
    }
    // SAFETY: on success the strings point into `buffer`, which is still alive.
    let text =
        |pointer: *const libc::c_char| unsafe { std::ffi::CStr::from_ptr(pointer) }.to_string_lossy().into_owned();
    Ok(Account {
        uid: entry.pw_uid,
        gid: entry.pw_gid,
        name: text(entry.pw_name),
        home: text(entry.pw_dir),
        shell: text(entry.pw_shell),
    })
}

/// Looks a group up by name or number.
pub fn lookup_group(name: &str) -> io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let wanted = c_string(name)?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: group is plain data (integers and pointers); all zeroes is a valid value.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as in lookup_user.
    let status =
        unsafe { libc::getgrnam_r(wanted.as_ptr(), &mut entry, buffer.as_mut_ptr(), buffer.len(), &mut found) };
    if status != 0 || found.is_null() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no such group {name:?}")));
    }
    Ok(entry.gr_gid)
}
