//! The server's side of TLS on the API's TCP listeners, on rustls' unbuffered connection: this
//! stream owns the buffers and lets each go as soon as it is empty, so a connection that is
//! quiet (a pull agent's change stream, silent for minutes) holds no buffer at all. rustls'
//! buffered connection keeps a 4 KiB read buffer, zero-filled, under every connection for its
//! whole life: a sixth of what an idle agent cost its manager (docs/benchmark-history.md, issue 36).
//!
//! The cryptography, the handshake and the record layer stay rustls'; this file only moves
//! bytes between the socket, rustls and the reader and writer above.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    AppDataRecord, ConnectionState, EncodeError, EncryptError, InsufficientSizeError, UnbufferedStatus, WriteTraffic,
};
use rustls::{CommonState, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[cfg(test)]
mod tests;

/// Bytes asked of the socket at a time.
const READ_SIZE: usize = 4096;
/// The most received bytes held before they make a message rustls can take: a handshake
/// message of up to 64 KiB (a client's certificate chain, over several records) and one more
/// record (its largest, 16 KiB of data and 2 KiB of expansion). rustls bounds its own buffer
/// the same way.
const MOST_INCOMING: usize = 0xffff + 5 + 16_384 + 2_048;
/// Encrypted bytes waiting for the socket beyond which a write waits for them to drain.
const MOST_OUTGOING: usize = 64 * 1024;
/// Room for a record's header, padding and tag beside its data (TLS 1.3: 22 bytes; 1.2: 29).
const RECORD_EXPANSION: usize = 64;
/// The most plaintext a record carries.
const RECORD_DATA: usize = 16_384;

/// A TLS connection accepted on `IO`, read and written as plain bytes.
pub struct LeanTlsStream<IO> {
    io: IO,
    connection: UnbufferedServerConnection,
    /// Bytes received and not yet taken by rustls (the start of a record, or records not yet
    /// processed).
    incoming: Vec<u8>,
    /// Application data decrypted and not yet read, from `plaintext_read` on.
    plaintext: Vec<u8>,
    plaintext_read: usize,
    /// Bytes for the peer, from `outgoing_sent` on, in the order rustls made them.
    outgoing: Vec<u8>,
    outgoing_sent: usize,
    /// The peer sent close_notify, or its side of the socket ended: nothing more is read.
    read_ended: ReadEnd,
    /// close_notify is in `outgoing` (or sent): nothing more is written.
    close_notify_queued: bool,
    /// rustls refused what the peer sent: the connection is over, and rustls is not asked again
    /// (it would make its alert twice).
    failed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadEnd {
    Open,
    /// The peer said it was done (close_notify).
    Notified,
    /// The socket ended without close_notify: data may have been cut off.
    Truncated,
}

/// What to do where application data may be written.
#[derive(Clone, Copy, Debug)]
enum Action<'d> {
    Encrypt(&'d [u8]),
    CloseNotify,
}

fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Why a buffer given to rustls was not used.
enum Refused {
    TooSmall(usize),
    Failed(io::Error),
}

impl From<EncodeError> for Refused {
    fn from(error: EncodeError) -> Self {
        match error {
            EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => Self::TooSmall(required_size),
            other => Self::Failed(io::Error::other(other.to_string())),
        }
    }
}

impl From<EncryptError> for Refused {
    fn from(error: EncryptError) -> Self {
        match error {
            EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => Self::TooSmall(required_size),
            other => Self::Failed(io::Error::other(other.to_string())),
        }
    }
}

/// Appends to `outgoing` what `produce` writes into the room it is given, first `room` bytes,
/// then as many as it says it needs.
fn append(
    outgoing: &mut Vec<u8>,
    mut room: usize,
    mut produce: impl FnMut(&mut [u8]) -> Result<usize, Refused>,
) -> io::Result<()> {
    let start = outgoing.len();
    loop {
        outgoing.resize(start + room, 0);
        match produce(&mut outgoing[start..]) {
            Ok(written) => {
                outgoing.truncate(start + written);
                return Ok(());
            }
            Err(Refused::TooSmall(needed)) if needed > room => room = needed,
            Err(Refused::TooSmall(_)) => {
                outgoing.truncate(start);
                return Err(invalid("TLS asked for room it was given"));
            }
            Err(Refused::Failed(error)) => {
                outgoing.truncate(start);
                return Err(error);
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> LeanTlsStream<IO> {
    /// Takes `io` through the server's side of a handshake under `config`; the stream is
    /// returned once the handshake is complete (the client's certificate, where it sent one,
    /// verified).
    pub async fn accept(io: IO, config: Arc<ServerConfig>) -> io::Result<Self> {
        let connection = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        let mut stream = Self {
            io,
            connection,
            incoming: Vec::new(),
            plaintext: Vec::new(),
            plaintext_read: 0,
            outgoing: Vec::new(),
            outgoing_sent: 0,
            read_ended: ReadEnd::Open,
            close_notify_queued: false,
            failed: false,
        };
        std::future::poll_fn(|cx| stream.poll_handshake(cx)).await?;
        Ok(stream)
    }

    /// The connection's negotiated state: the peer's certificates, the protocol chosen by
    /// ALPN, whether the session was resumed.
    pub fn tls(&self) -> &CommonState {
        &self.connection
    }

    /// Bytes this stream holds in its buffers (none while the connection is quiet).
    #[cfg(test)]
    pub fn buffered_capacity(&self) -> usize {
        self.incoming.capacity() + self.plaintext.capacity() + self.outgoing.capacity()
    }

    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let processed = self.process(None);
            // What rustls made (its flight, or the alert that ends a failed handshake) goes
            // out before waiting on the peer.
            let sent = self.poll_send(cx);
            processed?;
            if !self.connection.is_handshaking() {
                return Poll::Ready(Ok(()));
            }
            ready!(sent)?;
            if self.read_ended != ReadEnd::Open {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::UnexpectedEof, "TLS handshake cut short")));
            }
            ready!(self.poll_receive(cx))?;
        }
    }

    /// Runs rustls over what was received until it waits for the peer or may write: data
    /// decrypted goes to `plaintext`, records rustls makes to `outgoing`, and where application
    /// data may be written, `action` is carried out (all of its data encrypted). Says whether
    /// it was: not during the handshake's first flights, nor once both sides closed. On an
    /// error, the alert rustls makes for the peer is still put in `outgoing`.
    fn process(&mut self, action: Option<Action<'_>>) -> io::Result<bool> {
        if self.failed {
            return Err(invalid("the TLS connection failed"));
        }
        let processed = self.process_records(action);
        if processed.is_err() {
            self.failed = true;
            self.collect_alert();
        }
        processed
    }

    fn process_records(&mut self, mut action: Option<Action<'_>>) -> io::Result<bool> {
        loop {
            let UnbufferedStatus { mut discard, state } = self.connection.process_tls_records(&mut self.incoming);
            let writable = match state {
                Err(error) => return Err(tls_error(error)),
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    while let Some(record) = traffic.next_record() {
                        let AppDataRecord { discard: taken, payload } = record.map_err(tls_error)?;
                        discard += taken;
                        self.plaintext.extend_from_slice(payload);
                    }
                    None
                }
                Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                    append(&mut self.outgoing, 0, |room| encode.encode(room).map_err(Refused::from))?;
                    None
                }
                // What was encoded stays in `outgoing`, sent before anything written after it.
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    transmit.done();
                    None
                }
                Ok(ConnectionState::PeerClosed) => {
                    self.read_ended = ReadEnd::Notified;
                    None
                }
                Ok(ConnectionState::Closed) => {
                    self.read_ended = ReadEnd::Notified;
                    Some(false)
                }
                Ok(ConnectionState::BlockedHandshake) => Some(false),
                Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                    match action.take() {
                        Some(Action::Encrypt(data)) => encrypt(&mut traffic, &mut self.outgoing, data)?,
                        Some(Action::CloseNotify) => append(&mut self.outgoing, RECORD_EXPANSION, |room| {
                            traffic.queue_close_notify(room).map_err(Refused::from)
                        })?,
                        None => {}
                    }
                    Some(true)
                }
                // The configuration accepts no early data, so none is offered to read.
                Ok(_) => return Err(invalid("TLS offered a state this server does not take")),
            };
            self.incoming.drain(..discard.min(self.incoming.len()));
            if let Some(writable) = writable {
                if self.incoming.is_empty() {
                    self.incoming = Vec::new();
                }
                return Ok(writable);
            }
        }
    }

    /// After an error, what rustls still has for the peer (the alert saying why). rustls hands
    /// out what it has to send before it reads anything, and is given nothing to read.
    fn collect_alert(&mut self) {
        self.incoming = Vec::new();
        while self.connection.wants_write() {
            let Ok(ConnectionState::EncodeTlsData(mut encode)) = self.connection.process_tls_records(&mut []).state
            else {
                return;
            };
            if append(&mut self.outgoing, 0, |room| encode.encode(room).map_err(Refused::from)).is_err() {
                return;
            }
        }
    }

    /// Reads what the socket has into `incoming`; how many bytes came (0: the peer's side
    /// ended).
    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let filled = self.incoming.len();
        if filled >= MOST_INCOMING {
            return Poll::Ready(Err(invalid("a TLS message larger than this server takes")));
        }
        self.incoming.resize(filled + READ_SIZE.min(MOST_INCOMING - filled), 0);
        let mut buffer = ReadBuf::new(&mut self.incoming[filled..]);
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut buffer);
        let received = buffer.filled().len();
        self.incoming.truncate(filled + received);
        if self.incoming.is_empty() {
            self.incoming = Vec::new();
        }
        ready!(polled)?;
        if received == 0 && self.read_ended == ReadEnd::Open {
            self.read_ended = ReadEnd::Truncated;
        }
        Poll::Ready(Ok(received))
    }

    /// Writes `outgoing` to the socket; ready once all of it is sent.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.outgoing_sent < self.outgoing.len() {
            let sent = ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.outgoing_sent..]))?;
            if sent == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.outgoing_sent += sent;
        }
        self.outgoing = Vec::new();
        self.outgoing_sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Sends what is pending as far as the socket takes it now, keeping what it does not; an
    /// error of the socket is returned, a full socket is not.
    fn send_what_goes(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.poll_send(cx) {
            Poll::Ready(Err(error)) => Err(error),
            _ => Ok(()),
        }
    }

    fn pending_outgoing(&self) -> usize {
        self.outgoing.len() - self.outgoing_sent
    }
}

/// Encrypts all of `data` into `outgoing`, after what is there.
fn encrypt(
    traffic: &mut WriteTraffic<'_, ServerConnectionData>,
    outgoing: &mut Vec<u8>,
    data: &[u8],
) -> io::Result<()> {
    let records = data.len().div_ceil(RECORD_DATA).max(1);
    append(outgoing, data.len() + records * RECORD_EXPANSION, |room| traffic.encrypt(data, room).map_err(Refused::from))
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for LeanTlsStream<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buffer: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buffer.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.incoming.is_empty() {
                this.process(None)?;
            }
            let unread = &this.plaintext[this.plaintext_read..];
            if !unread.is_empty() {
                let given = unread.len().min(buffer.remaining());
                buffer.put_slice(&unread[..given]);
                this.plaintext_read += given;
                if this.plaintext_read == this.plaintext.len() {
                    this.plaintext = Vec::new();
                    this.plaintext_read = 0;
                }
                return Poll::Ready(Ok(()));
            }
            match this.read_ended {
                ReadEnd::Notified => return Poll::Ready(Ok(())),
                ReadEnd::Truncated => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection without sending TLS close_notify",
                    )));
                }
                ReadEnd::Open => {}
            }
            // What reading made rustls say (a key update's answer) goes out as we read.
            this.send_what_goes(cx)?;
            ready!(this.poll_receive(cx))?;
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for LeanTlsStream<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.close_notify_queued {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "the TLS connection was shut down")));
        }
        if this.pending_outgoing() >= MOST_OUTGOING {
            ready!(this.poll_send(cx))?;
        }
        if this.outgoing_sent > 0 {
            this.outgoing.drain(..this.outgoing_sent);
            this.outgoing_sent = 0;
        }
        let taken = data.len().min(MOST_OUTGOING);
        if !this.process(Some(Action::Encrypt(&data[..taken])))? {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "the TLS connection is closed")));
        }
        this.send_what_goes(cx)?;
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_notify_queued {
            this.close_notify_queued = true;
            this.process(Some(Action::CloseNotify))?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
