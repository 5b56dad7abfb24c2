//! Whether the API answers: the test fleetd passes before it tells systemd it is ready. The
//! probe goes through a real Unix listener when there is one (the socket clients use), else
//! through the router itself.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use fleet_api::auth::Peer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

/// A request every API answers from the router alone: probing with a list would start the
/// cache of the whole cluster on every fleetd, and keep it until it idles out.
const PROBE: &str = "/fleet/v1/discovery";

/// One request on the Unix socket at `path`: whether it answered 200.
async fn socket_answers(path: &PathBuf) -> bool {
    let Ok(mut stream) = tokio::net::UnixStream::connect(path).await else {
        return false;
    };
    let request = format!("GET {PROBE} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

async fn router_answers(router: &axum::Router) -> bool {
    let Ok(mut request) = Request::builder().uri(PROBE).body(Body::empty()) else {
        return false;
    };
    request.extensions_mut().insert(Peer::Unix { uid: None });
    router.clone().oneshot(request).await.is_ok_and(|response| response.status() == StatusCode::OK)
}

/// Waits until the API answers a request, for at most `limit`; whether it did.
pub async fn wait_until_api_answers(unix_socket: Option<PathBuf>, router: axum::Router, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        let answered = match &unix_socket {
            Some(path) => socket_answers(path).await,
            None => router_answers(&router).await,
        };
        if answered {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
