//! A TCP connection whose peer may vanish without a word (its machine, its network) is ended
//! by the kernel: keepalive probes once it has been quiet for the listener's `keep_alive`, and
//! a user timeout over the same span, so that a dead peer is found about one and a half
//! `keep_alive` after it was last heard from. Neither process wakes for it: an idle pull
//! agent's stream is watched by the two kernels, and its heartbeats can be minutes apart.

use std::io;
use std::os::fd::AsRawFd;

pub use fleet_core::peer_probing::Probing;

/// Has the kernel watch `socket`'s peer as `probing` says.
pub fn watch_peer(socket: &impl AsRawFd, probing: Probing) -> io::Result<()> {
    let fd = socket.as_raw_fd();
    set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, probing.idle_seconds)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, probing.interval_seconds)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probing.count)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, probing.user_timeout_ms)
}

fn set(fd: libc::c_int, level: libc::c_int, name: libc::c_int, value: u32) -> io::Result<()> {
    let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
    // SAFETY: the option's value is a c_int, passed by pointer with its size.
    let result = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn get(fd: libc::c_int, level: libc::c_int, name: libc::c_int) -> io::Result<u32> {
        let mut value: libc::c_int = 0;
        let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `length` bytes into `value`, a c_int.
        let result = unsafe { libc::getsockopt(fd, level, name, std::ptr::addr_of_mut!(value).cast(), &mut length) };
        if result == 0 { Ok(u32::try_from(value).unwrap_or(0)) } else { Err(io::Error::last_os_error()) }
    }

    /// Reads back what [`watch_peer`] set.
    fn probing_of(socket: &impl AsRawFd) -> io::Result<Option<Probing>> {
        let fd = socket.as_raw_fd();
        if get(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE)? == 0 {
            return Ok(None);
        }
        Ok(Some(Probing {
            idle_seconds: get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)?,
            interval_seconds: get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)?,
            count: get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT)?,
            user_timeout_ms: get(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)?,
        }))
    }

    #[test]
    fn the_kernel_is_given_the_probing_and_keeps_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let client = std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        assert_eq!(probing_of(&accepted).expect("read"), None, "no probing unless asked");
        let probing = Probing::for_keep_alive(Duration::from_secs(150));
        watch_peer(&accepted, probing).expect("set");
        assert_eq!(probing_of(&accepted).expect("read"), Some(probing));
        drop(client);
    }
}
