//! When a pull agent leaves the manager it uses for another: at once when nothing listens
//! there, and otherwise only once the manager has answered nothing for a heartbeat period (a
//! third of `agent_ttl`). A loaded manager drops connections, lets handshakes run out and answers
//! late, and is still there: agents that left it at the first such failure each paid a new
//! handshake and an announcement on the next manager, loaded it in turn, and 100,000 agents
//! on twelve managers never settled (219,567 moves in six minutes).

use std::time::Duration;

/// What a failed exchange with the manager says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The manager is gone: nothing listens at its address (the connection was refused), or
    /// it said it cannot serve the agent.
    Gone,
    /// No answer, a connection dropped or given up by the kernel, a handshake that ran out:
    /// how a manager that is gone looks, and how a loaded one does (one that reads its
    /// connections late leaves their windows shut until the kernel gives up on them). A
    /// connection whose peer went silent is found by the kernel's probes only after a
    /// heartbeat period of silence, so a manager gone so is left at once all the same.
    Unanswered,
    /// A request that got no answer in time on a connection that the manager accepted and
    /// that stays alive (its pings are answered): the manager is loaded, not gone.
    Slow,
}

impl Fault {
    /// What a request's transport error says.
    pub(crate) fn of(error: &reqwest::Error) -> Self {
        if connection_refused(error) {
            Fault::Gone
        } else if error.is_timeout() && !error.is_connect() {
            Fault::Slow
        } else {
            Fault::Unanswered
        }
    }

    /// Whether the agent leaves a manager that failed so and has answered it nothing for
    /// `silent_for`, given its heartbeat `period`.
    pub(crate) fn leaves(self, silent_for: Duration, period: Duration) -> bool {
        match self {
            Fault::Gone => true,
            Fault::Unanswered => silent_for >= period,
            Fault::Slow => false,
        }
    }
}

/// Whether `error` comes of a connection refused: nothing listens at the manager's address.
fn connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(100);

    #[test]
    fn an_agent_leaves_a_manager_that_is_gone_at_once_and_one_that_does_not_answer_after_a_period() {
        assert!(Fault::Gone.leaves(Duration::ZERO, PERIOD));
        assert!(!Fault::Unanswered.leaves(Duration::from_secs(10), PERIOD), "a loaded manager is waited on");
        assert!(Fault::Unanswered.leaves(PERIOD, PERIOD));
        assert!(!Fault::Slow.leaves(PERIOD * 10, PERIOD), "its connection says it is there");
    }

    #[tokio::test]
    async fn a_refused_connection_is_told_from_one_that_goes_unanswered() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // No timeout where the fault is not one: a loaded machine answers late, never wrongly.
        let client = reqwest::Client::new();
        // Nothing listens on a port just let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let refused = client.get(format!("http://127.0.0.1:{port}/")).send().await.unwrap_err();
        assert_eq!(Fault::of(&refused), Fault::Gone, "{refused:?}");
        // A listener that accepts and then closes without a word.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                drop(connection);
            }
        });
        let dropped = client.get(format!("http://{address}/")).send().await.unwrap_err();
        assert_eq!(Fault::of(&dropped), Fault::Unanswered, "{dropped:?}");
        // One that accepts and never answers: the client's own timeout, not the kernel's.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = silent.accept().await {
                held.push(connection);
            }
        });
        let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
        let slow = impatient.get(format!("http://{address}/")).send().await.unwrap_err();
        assert_eq!(Fault::of(&slow), Fault::Slow, "{slow:?}");
        held.abort();
    }
}
