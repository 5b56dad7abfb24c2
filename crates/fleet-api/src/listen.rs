//! Where the API listens: a Unix socket (mode 0660), TCP addresses, and sockets passed by
//! systemd socket activation (`LISTEN_PID`/`LISTEN_FDS`).

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A bound listening socket, kept in std form so it can be served again after a reload.
pub enum ApiListener {
    Unix(std::os::unix::net::UnixListener),
    /// Plain HTTP.
    Tcp(std::net::TcpListener),
    /// HTTPS: every connection starts with a TLS handshake.
    Tls(std::net::TcpListener),
}

impl ApiListener {
    pub fn describe(&self) -> String {
        match self {
            Self::Unix(listener) => {
                match listener.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf)) {
                    Some(path) => format!("unix://{}", path.display()),
                    None => "unix socket".to_string(),
                }
            }
            Self::Tcp(listener) => listener.local_addr().map_or("tcp socket".to_string(), |a| format!("http://{a}")),
            Self::Tls(listener) => listener.local_addr().map_or("tls socket".to_string(), |a| format!("https://{a}")),
        }
    }

    /// The same socket serving HTTPS (a TCP socket systemd passed, when TLS is configured).
    pub fn with_tls(self) -> Self {
        match self {
            Self::Tcp(listener) => Self::Tls(listener),
            other => other,
        }
    }

    /// The address of a TCP listener.
    pub fn tcp_address(&self) -> Option<std::net::SocketAddr> {
        match self {
            Self::Tcp(listener) | Self::Tls(listener) => listener.local_addr().ok(),
            Self::Unix(_) => None,
        }
    }

    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Unix(listener) => Self::Unix(listener.try_clone()?),
            Self::Tcp(listener) => Self::Tcp(listener.try_clone()?),
            Self::Tls(listener) => Self::Tls(listener.try_clone()?),
        })
    }
}

/// Binds the Unix socket at `path`, replacing a stale one, readable and writable by owner
/// and group only.
pub fn bind_unix(path: &Path) -> io::Result<ApiListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    listener.set_nonblocking(true)?;
    Ok(ApiListener::Unix(listener))
}

/// How many connections the kernel may hold for a TCP listener before it takes them (it
/// clamps this to `net.core.somaxconn`, 4,096 by default).
pub const LISTEN_BACKLOG: libc::c_int = 4096;

pub fn bind_tcp(address: &str) -> io::Result<ApiListener> {
    let listener = std::net::TcpListener::bind(address)?;
    widen_backlog(&listener)?;
    listener.set_nonblocking(true)?;
    Ok(ApiListener::Tcp(listener))
}

/// Listens again with [`LISTEN_BACKLOG`] (Linux takes a second `listen` as a new backlog).
/// std listens with 128: thousands of pull agents connecting to a loaded manager at once
/// overflowed it 163,747 times in the 100,000-agent benchmark, and every connection the
/// kernel drops so is tried again by its client a second later, then two, four... (connects
/// took minutes).
fn widen_backlog(listener: &std::net::TcpListener) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: listen only reads its two integer arguments; the descriptor is the listener's own.
    if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Where `api_listen` asks the API to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    Unix(std::path::PathBuf),
    Http(std::net::SocketAddr),
    Https(std::net::SocketAddr),
}

impl ListenAddress {
    /// Reads `unix:///path`, `http://ADDR:PORT`, `https://ADDR:PORT` or a bare `ADDR:PORT`
    /// (plain HTTP, as the original took it).
    pub fn parse(entry: &str) -> Option<Self> {
        if let Some(path) = entry.strip_prefix("unix://") {
            return path.starts_with('/').then(|| Self::Unix(path.into()));
        }
        if let Some(address) = entry.strip_prefix("https://") {
            return address.trim_end_matches('/').parse().ok().map(Self::Https);
        }
        entry.strip_prefix("http://").unwrap_or(entry).trim_end_matches('/').parse().ok().map(Self::Http)
    }

    pub fn bind(&self) -> io::Result<ApiListener> {
        match self {
            Self::Unix(path) => bind_unix(path),
            Self::Http(address) => bind_tcp(&address.to_string()),
            Self::Https(address) => bind_tcp(&address.to_string()).map(ApiListener::with_tls),
        }
    }
}

/// The listeners systemd passed to this process, if any. Call it once, in `main`, before any
/// other thread starts (it takes ownership of the passed descriptors).
pub fn activated_listeners() -> io::Result<Vec<ApiListener>> {
    let for_us = std::env::var("LISTEN_PID").ok().and_then(|pid| pid.parse::<u32>().ok()) == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<RawFd>().ok()).unwrap_or(0);
    if !for_us || count <= 0 {
        return Ok(Vec::new());
    }
    const FIRST_FD: RawFd = 3;
    let mut listeners = Vec::new();
    for fd in FIRST_FD..FIRST_FD + count {
        // SAFETY: getsockname only writes into the storage we pass, sized as declared.
        let family = unsafe {
            let mut storage: libc::sockaddr_storage = std::mem::zeroed();
            let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            if libc::getsockname(fd, std::ptr::addr_of_mut!(storage).cast(), &mut length) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::c_int::from(storage.ss_family)
        };
        // SAFETY: systemd hands these descriptors to this process to own.
        let listener = unsafe {
            match family {
                libc::AF_UNIX => ApiListener::Unix(std::os::unix::net::UnixListener::from_raw_fd(fd)),
                _ => ApiListener::Tcp(std::net::TcpListener::from_raw_fd(fd)),
            }
        };
        match &listener {
            ApiListener::Unix(l) => l.set_nonblocking(true)?,
            ApiListener::Tcp(l) | ApiListener::Tls(l) => l.set_nonblocking(true)?,
        }
        listeners.push(listener);
    }
    // LISTEN_PID/LISTEN_FDS stay in the environment: changing it while other threads may
    // read it is a data race, and they are harmless where they go on (unit processes get a
    // cleared environment; any other child has another PID than LISTEN_PID names).
    Ok(listeners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_listener_holds_thousands_of_connections_before_they_are_taken() {
        let ApiListener::Tcp(listener) = bind_tcp("127.0.0.1:0").unwrap() else { panic!("a TCP listener") };
        let port = listener.local_addr().unwrap().port();
        // `ss` shows a listener's backlog as its send queue.
        let shown = std::process::Command::new("ss")
            .args(["-Hltn", &format!("( sport = :{port} )")])
            .output()
            .expect("ss (iproute2) runs");
        let shown = String::from_utf8_lossy(&shown.stdout);
        let backlog: i32 = shown.split_whitespace().nth(2).and_then(|value| value.parse().ok()).expect(&shown);
        let somaxconn: i32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap().trim().parse().unwrap();
        assert_eq!(backlog, LISTEN_BACKLOG.min(somaxconn), "{shown}");
        assert!(backlog > 128, "std's own backlog: {shown}");
    }
}
