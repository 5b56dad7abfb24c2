//! Why fleetd could not be reached, said so that the reader knows what to check: what was
//! tried, what failed, and the setting that changes it.

use std::time::Duration;

/// What went wrong on the way to fleetd, as far as the error shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Nothing at that socket path.
    NoSocket,
    /// Nothing listening there (or a socket file fleetd left behind).
    Refused,
    /// The socket or the connection was refused to this user.
    NotPermitted,
    /// The server's certificate is not signed by a CA this client trusts.
    UnknownCertificate,
    /// No answer in time.
    TimedOut,
    /// The answer was not HTTP: a TLS listener asked in plain HTTP.
    NotHttp,
    Other,
}

/// Reads `error` (and its causes) for what failed.
pub(crate) fn failure(error: &reqwest::Error) -> Failure {
    if error.is_timeout() {
        return Failure::TimedOut;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::NotFound => return Failure::NoSocket,
                std::io::ErrorKind::ConnectionRefused => return Failure::Refused,
                std::io::ErrorKind::PermissionDenied => return Failure::NotPermitted,
                std::io::ErrorKind::TimedOut => return Failure::TimedOut,
                _ => {}
            }
        }
        let text = cause.to_string();
        if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
            return Failure::UnknownCertificate;
        }
        if text.contains("invalid HTTP version parsed") {
            return Failure::NotHttp;
        }
        source = cause.source();
    }
    Failure::Other
}

/// The message for a request to `endpoint` that failed with `failure`; `cause` is the
/// transport's own words, kept at the end for whoever needs them.
pub(crate) fn explain(endpoint: &str, failure: Failure, timeout: Duration, cause: &str) -> String {
    let what_to_check = match failure {
        Failure::NoSocket => "no such socket: is fleetd running on this machine? To reach another, set --endpoint or \
                              FLEETCTL_ENDPOINT"
            .to_string(),
        Failure::Refused => "connection refused: is fleetd running, and listening there? To reach another, set \
                             --endpoint or FLEETCTL_ENDPOINT"
            .to_string(),
        Failure::NotPermitted => "permission denied: fleetd's socket admits root and its group; over TCP, give a \
                                  token (--token) or a client certificate"
            .to_string(),
        Failure::UnknownCertificate => "its certificate is not signed by a CA fleetctl trusts: give that CA with \
                                        --ca-file (FLEETCTL_CA_FILE)"
            .to_string(),
        Failure::TimedOut => format!(
            "no answer within {}: is the address right and fleetd not overloaded? (--request-timeout)",
            humanize(timeout)
        ),
        Failure::NotHttp => match endpoint.strip_prefix("http://") {
            Some(rest) => format!("it does not answer in plain HTTP: a TLS listener? Use https://{rest}"),
            None => "it does not answer in HTTP: is that fleetd's address?".to_string(),
        },
        Failure::Other => return format!("cannot reach fleetd at {endpoint}: {cause}"),
    };
    format!("cannot reach fleetd at {endpoint}: {what_to_check} ({cause})")
}

/// [`explain`] for a request that asks for a change: one that got no answer in time may have
/// been carried out all the same (fleetd may write it as the client gives up), so trying it
/// again blind may act twice, or undo what came after.
pub(crate) fn explain_change(endpoint: &str, failure: Failure, timeout: Duration, cause: &str) -> String {
    let message = explain(endpoint, failure, timeout, cause);
    match failure {
        Failure::TimedOut => {
            format!("{message}; the change may have been made all the same: read it back before asking again")
        }
        _ => message,
    }
}

fn humanize(duration: Duration) -> String {
    if duration.subsec_millis() == 0 { format!("{}s", duration.as_secs()) } else { format!("{duration:?}") }
}

/// The fix for an endpoint written without its scheme, after the original's words.
pub(crate) fn missing_scheme(endpoint: &str) -> String {
    let fix = if endpoint.starts_with('/') {
        format!("unix://{endpoint}")
    } else {
        format!("http://{endpoint} (or https://{endpoint})")
    };
    format!("URL scheme undefined: write the endpoint as {fix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_says_what_to_check() {
        let endpoint = "unix:///var/run/fleet.sock";
        let said = |failure| explain(endpoint, failure, Duration::from_secs(10), "os error 2");
        assert!(said(Failure::NoSocket).contains("is fleetd running on this machine"));
        assert!(said(Failure::NoSocket).contains("FLEETCTL_ENDPOINT"));
        assert!(said(Failure::Refused).contains("connection refused"));
        assert!(said(Failure::UnknownCertificate).contains("--ca-file"));
        assert!(said(Failure::TimedOut).contains("no answer within 10s"));
        for failure in [Failure::NoSocket, Failure::Refused, Failure::NotPermitted, Failure::TimedOut, Failure::Other] {
            let message = said(failure);
            assert!(message.starts_with("cannot reach fleetd at unix:///var/run/fleet.sock: "), "{message}");
            assert!(message.contains("os error 2"), "the transport's words are kept: {message}");
        }
    }

    #[test]
    fn a_change_without_an_answer_may_have_been_made() {
        let endpoint = "unix:///var/run/fleet.sock";
        let timed_out = explain_change(endpoint, Failure::TimedOut, Duration::from_secs(3), "operation timed out");
        assert!(timed_out.starts_with(&explain(
            endpoint,
            Failure::TimedOut,
            Duration::from_secs(3),
            "operation timed out"
        )));
        assert!(timed_out.ends_with("the change may have been made all the same: read it back before asking again"));
        // A change refused at the door was not made.
        let refused = explain_change(endpoint, Failure::Refused, Duration::from_secs(3), "os error 111");
        assert_eq!(refused, explain(endpoint, Failure::Refused, Duration::from_secs(3), "os error 111"));
    }

    /// Regression (issue 68): plain HTTP to an HTTPS listener said only "invalid HTTP version
    /// parsed".
    #[test]
    fn plain_http_to_a_tls_listener_is_told_to_use_https() {
        let said =
            explain("http://10.0.0.5:4002", Failure::NotHttp, Duration::from_secs(3), "invalid HTTP version parsed");
        assert!(said.contains("Use https://10.0.0.5:4002"), "{said}");
    }

    #[test]
    fn an_endpoint_without_its_scheme_is_answered_with_the_fix() {
        assert_eq!(
            missing_scheme("127.0.0.1:4702"),
            "URL scheme undefined: write the endpoint as http://127.0.0.1:4702 (or https://127.0.0.1:4702)"
        );
        assert_eq!(
            missing_scheme("/var/run/fleet.sock"),
            "URL scheme undefined: write the endpoint as unix:///var/run/fleet.sock"
        );
    }
}
