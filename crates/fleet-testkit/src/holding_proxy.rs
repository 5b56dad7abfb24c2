//! A proxy on loopback for a gRPC (HTTP/2) client that can hold what the client sends: while
//! held, its frames wait in order and the server sees nothing; once released, they arrive all
//! at once, without the cancels of the requests they began (a hang-up included). It stands
//! for a link that stalls and comes back (a member frozen, a cut that TCP outlasts): a request
//! sent during the stall is still carried out, after the client gave up on its answer.
//! (Whether the server would have heeded a cancel arriving with its request is a race; losing
//! it makes that case certain.)

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct HoldingProxy {
    pub address: SocketAddr,
    held: watch::Sender<bool>,
    accepting: tokio::task::JoinHandle<()>,
}

/// HTTP/2's client preface, sent before its first frame.
const PREFACE: usize = 24;
/// A frame's header: length (3 bytes), type, flags, stream (4 bytes).
const FRAME_HEADER: usize = 9;
/// The frame that begins a request.
const HEADERS: u8 = 0x1;
/// The frame by which a client cancels a request.
const RST_STREAM: u8 = 0x3;

/// The HTTP/2 frames a client sends, cut out of its byte stream as they complete, and the
/// streams (requests) it began while held.
#[derive(Default)]
struct Frames {
    pending: Vec<u8>,
    preface_seen: bool,
    held_streams: std::collections::HashSet<u32>,
}

impl Frames {
    /// Takes `bytes` in, sent while `held` or not; answers the frames complete so far, less
    /// the cancels of requests begun while held.
    fn complete(&mut self, bytes: &[u8], held: bool) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        if !self.preface_seen {
            if self.pending.len() < PREFACE {
                return out;
            }
            out.extend(self.pending.drain(..PREFACE));
            self.preface_seen = true;
        }
        while self.pending.len() >= FRAME_HEADER {
            let length =
                usize::from(self.pending[0]) << 16 | usize::from(self.pending[1]) << 8 | usize::from(self.pending[2]);
            if self.pending.len() < FRAME_HEADER + length {
                break;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + length).collect();
            let stream = u32::from_be_bytes([frame[5] & 0x7f, frame[6], frame[7], frame[8]]);
            match frame[3] {
                HEADERS if held => {
                    self.held_streams.insert(stream);
                }
                RST_STREAM if self.held_streams.contains(&stream) => continue,
                _ => {}
            }
            out.extend(frame);
        }
        out
    }
}

/// Copies a gRPC client's frames to its server, keeping what comes while held until released;
/// a request begun while held is carried out even if the client cancels it (as when the
/// cancel is what the stall took).
async fn held_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut frames = Frames::default();
    let mut waiting = Vec::new();
    loop {
        let holding = *held.borrow_and_update();
        if !holding && !waiting.is_empty() && to.write_all(&std::mem::take(&mut waiting)).await.is_err() {
            return;
        }
        tokio::select! {
            // Whether to hold is read again when bytes come: a hold set before the client sent
            // them may not have been seen at the loop's top yet (both ready at once, on a busy
            // machine), and a request begun then must be held with its cancel, not let through.
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(read) => waiting.extend(frames.complete(&buffer[..read], *held.borrow_and_update())),
            },
            changed = held.changed() => if changed.is_err() { return },
        }
    }
    // A client that hangs up cancels its requests too: the server is not told (what waited
    // is delivered on release), and the connection stays open on its side until the proxy's
    // runtime ends.
    if held.wait_for(|held| !held).await.is_ok() && to.write_all(&waiting).await.is_ok() {
        std::future::pending::<()>().await;
    }
}

async fn carry(client: TcpStream, target: SocketAddr, held: watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(target).await else { return };
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    tokio::spawn(held_copy(client_read, server_write, held));
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
}

impl HoldingProxy {
    /// Listens on a free loopback port and carries every connection to `target`, on the
    /// caller's tokio runtime.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the holding proxy");
        let address = listener.local_addr().expect("the holding proxy's address");
        let (held, watching) = watch::channel(false);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(carry(client, target, watching.clone()));
            }
        });
        Self { address, held, accepting }
    }

    /// From now on, what clients send waits here.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Delivers what waited, in order, and carries on as a plain proxy.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
        let mut frame = vec![length[1], length[2], length[3], kind, 0];
        frame.extend(stream.to_be_bytes());
        frame.extend(payload);
        frame
    }

    #[test]
    fn frames_pass_whole_and_only_the_cancels_of_requests_begun_while_held_are_lost() {
        let mut frames = Frames::default();
        let preface = [b'P'; PREFACE];
        let (early, late) = (frame(HEADERS, 1, b"early"), frame(HEADERS, 3, b"late"));
        let mut sent = preface.to_vec();
        sent.extend(&early);
        // Cut anywhere, the frames come out whole and in order.
        let (first, rest) = sent.split_at(PREFACE + 4);
        assert_eq!(frames.complete(first, false), preface.to_vec());
        assert_eq!(frames.complete(rest, false), early);
        assert_eq!(frames.complete(&late, true), late, "held, but not lost");
        let (cancel_early, cancel_late) = (frame(RST_STREAM, 1, &[0; 4]), frame(RST_STREAM, 3, &[0; 4]));
        assert_eq!(frames.complete(&cancel_late, false), Vec::<u8>::new(), "begun while held: its cancel is lost");
        assert_eq!(frames.complete(&cancel_early, true), cancel_early, "begun before the hold: its cancel goes");
    }
}
