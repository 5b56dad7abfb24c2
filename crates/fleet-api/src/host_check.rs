//! The Host header on loopback listeners. A browser can be made to send requests to a
//! loopback port under a hostile name that resolves to 127.0.0.1 (DNS rebinding); such a
//! request carries that name in its Host header, so a loopback listener answers only
//! requests addressed to an IP address or to `localhost`.

use std::net::IpAddr;

use crate::listen::ApiListener;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCheck {
    /// Unix sockets and listeners on other addresses: a browser cannot be pointed there by
    /// a name it trusts more than the operator does.
    Any,
    /// A TCP listener on a loopback address.
    LoopbackNames,
}

impl HostCheck {
    pub fn for_listener(listener: &ApiListener) -> Self {
        match listener {
            ApiListener::Tcp(tcp) | ApiListener::Tls(tcp)
                if tcp.local_addr().is_ok_and(|address| address.ip().is_loopback()) =>
            {
                Self::LoopbackNames
            }
            _ => Self::Any,
        }
    }

    /// Whether a request with this Host header (none for HTTP/1.0) may be answered.
    pub fn allows(self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        if self == Self::Any {
            return true;
        }
        let name = match host.strip_prefix('[') {
            Some(bracketed) => bracketed.split_once(']').map_or(bracketed, |(address, _)| address),
            None => host
                .rsplit_once(':')
                .map_or(host, |(name, port)| if port.chars().all(|c| c.is_ascii_digit()) { name } else { host }),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name.parse::<IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_listeners_answer_only_addresses_and_localhost() {
        let check = HostCheck::LoopbackNames;
        for host in ["127.0.0.1:4002", "127.0.0.1", "[::1]:4002", "localhost:4002", "LOCALHOST", "fleet.localhost:1"] {
            assert!(check.allows(Some(host)), "{host}");
        }
        for host in ["attacker.example:4002", "attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io"] {
            assert!(!check.allows(Some(host)), "{host}");
        }
        assert!(check.allows(None), "HTTP/1.0 without a Host header");
        assert!(HostCheck::Any.allows(Some("fleet.example.com:4002")));
    }
}
