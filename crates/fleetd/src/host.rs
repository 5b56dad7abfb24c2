//! Facts about the host fleetd runs on: its name and the address it publishes.

use std::net::Ipv4Addr;

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_string()).unwrap_or_default()
}

/// The interface that carries the default route, from `/proc/net/route`.
fn default_route_interface() -> Option<String> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    routes.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"00000000")).then(|| fields[0].to_string())
    })
}

/// The first global-unicast IPv4 address of the default-route interface, as the original
/// publishes when `public_ip` is not set.
pub fn default_public_ip() -> Option<Ipv4Addr> {
    let interface = default_route_interface()?;
    let mut addresses: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addresses) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cursor = addresses;
    while !cursor.is_null() {
        // SAFETY: cursor walks the list getifaddrs returned; each entry is valid until freed.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string inside the list.
        let name = unsafe { std::ffi::CStr::from_ptr(entry.ifa_name) }.to_string_lossy();
        // SAFETY: ifa_addr is non-null and at least a sockaddr.
        let family = libc::c_int::from(unsafe { (*entry.ifa_addr).sa_family });
        if name != interface || family != libc::AF_INET {
            continue;
        }
        // SAFETY: the family says this is a sockaddr_in.
        let address = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(address.sin_addr.s_addr));
        if !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified() {
            found = Some(ip);
            break;
        }
    }
    // SAFETY: the list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(addresses) };
    found
}
