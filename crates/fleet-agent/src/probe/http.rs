//! HTTP(S) checks over a connection kept between probes: a unit checked every few seconds
//! costs a request and its answer, not a TCP (and TLS) handshake each time. A connection the
//! server closed while it sat idle is replaced once, silently; one whose answer cannot be
//! framed, or whose body is long, is not kept.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::answer::{Body, MOST_HEAD, chunked_end, head_end, parse_head};
use super::connect;

/// The most of a body read to keep its connection; a longer body is left with the connection.
const MOST_BODY: u64 = 64 * 1024;

trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

/// An open connection to a unit's HTTP(S) endpoint, with what it read past the last answer.
pub struct Connection {
    stream: Box<dyn Duplex>,
    buffer: Vec<u8>,
}

/// How an exchange on a connection went.
enum Exchange {
    /// The answer's code, and whether the connection can carry the next request.
    Answered { code: u16, reusable: bool },
    /// The connection was closed before any of an answer came: a kept one the server let go.
    ClosedUnanswered(String),
}

/// GETs `path`, on `kept` if there is one, and leaves in `kept` the connection to use next
/// time (none when it cannot be reused). 2xx and 3xx pass.
pub async fn get(
    kept: &mut Option<Connection>,
    tls: Option<&Arc<rustls::ClientConfig>>,
    host: &str,
    port: u16,
    path: &str,
) -> Result<(), String> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: fleet-health-check\r\nAccept: */*\r\n\r\n",
        super::authority(host, port)
    );
    let mut reused = kept.take();
    loop {
        let fresh = reused.is_none();
        let mut connection = match reused.take() {
            Some(connection) => connection,
            None => open(tls, host, port).await?,
        };
        match connection.exchange(&request).await? {
            Exchange::Answered { code, reusable } => {
                if reusable {
                    *kept = Some(connection);
                }
                return judge(code);
            }
            Exchange::ClosedUnanswered(why) if fresh => return Err(why),
            // A kept connection the server let go while idle: a fresh one answers for it.
            Exchange::ClosedUnanswered(_) => {}
        }
    }
}

fn judge(code: u16) -> Result<(), String> {
    if (200..400).contains(&code) { Ok(()) } else { Err(format!("HTTP {code}")) }
}

async fn open(tls: Option<&Arc<rustls::ClientConfig>>, host: &str, port: u16) -> Result<Connection, String> {
    let stream = connect(host, port).await?;
    let stream: Box<dyn Duplex> = match tls {
        None => Box::new(stream),
        Some(config) => {
            let name =
                ServerName::try_from(host.to_string()).map_err(|error| format!("server name {host:?}: {error}"))?;
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            Box::new(connector.connect(name, stream).await.map_err(|error| format!("TLS handshake: {error}"))?)
        }
    };
    Ok(Connection { stream, buffer: Vec::with_capacity(256) })
}

impl Connection {
    /// Sends `request` and reads its answer's head, and its body when the connection can be
    /// kept.
    async fn exchange(&mut self, request: &str) -> Result<Exchange, String> {
        if let Err(error) = self.stream.write_all(request.as_bytes()).await {
            return Ok(Exchange::ClosedUnanswered(format!("sending the request: {error}")));
        }
        let head_len = loop {
            if let Some(end) = head_end(&self.buffer) {
                break end;
            }
            if self.buffer.len() >= MOST_HEAD {
                return Err("no HTTP answer head within 16 KiB".to_string());
            }
            match self.read_more().await {
                Ok(0) if self.buffer.is_empty() => {
                    return Ok(Exchange::ClosedUnanswered("the connection closed before an answer".to_string()));
                }
                Ok(0) => {
                    let head = parse_head(&self.buffer)?;
                    return Ok(Exchange::Answered { code: head.code, reusable: false });
                }
                Ok(_) => {}
                Err(error) if self.buffer.is_empty() => {
                    return Ok(Exchange::ClosedUnanswered(format!("reading the answer: {error}")));
                }
                Err(error) => return Err(format!("reading the answer: {error}")),
            }
        };
        let head = parse_head(&self.buffer[..head_len])?;
        self.buffer.drain(..head_len);
        let reusable = head.keep_alive && self.skip_body(head.body).await;
        Ok(Exchange::Answered { code: head.code, reusable })
    }

    /// Reads past the body; false when it could not (too long, malformed, cut short).
    async fn skip_body(&mut self, body: Body) -> bool {
        let limit = usize::try_from(MOST_BODY).unwrap_or(usize::MAX);
        loop {
            let end = match body {
                Body::Empty => Some(0),
                Body::Length(length) if length > MOST_BODY => return false,
                Body::Length(length) => usize::try_from(length).ok().filter(|&length| self.buffer.len() >= length),
                Body::Chunked => match chunked_end(&self.buffer) {
                    Ok(end) => end,
                    Err(_) => return false,
                },
                Body::UntilClose => return false,
            };
            if let Some(end) = end {
                self.buffer.drain(..end);
                return true;
            }
            if self.buffer.len() > limit || !matches!(self.read_more().await, Ok(read) if read > 0) {
                return false;
            }
        }
    }

    async fn read_more(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 1024];
        let read = self.stream.read(&mut chunk).await?;
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(read)
    }
}
