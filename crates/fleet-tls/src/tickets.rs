//! Session tickets a restarted fleetd still opens. rustls' own ticketer draws its keys at
//! random when it starts, so every client of a restarted manager made a full handshake at
//! once (10,000 pull agents: tens of seconds of both sides' CPU on the machine kind fleet is
//! measured on). Here the keys are derived from what the listener serves with instead: its
//! private key (the secret) and its certificates and client CAs (the context). The same files
//! give the same keys in every process; other files (a new certificate, another client CA)
//! give other keys, so nothing begun under them resumes.
//!
//! A key seals for one period of [`PERIOD_SECONDS`] and opens what it sealed until the end of
//! the next period; tickets are AES-256-GCM with a random nonce, the period in the clear and
//! authenticated. Whoever holds the private key can make tickets: no more than whoever holds
//! it can already do by posing as the server, and the key file is the server's secret anyway.
//! Resumed TLS 1.3 sessions still make a fresh key exchange, so recorded traffic stays
//! unreadable to whoever gets the tickets' keys later.

use std::time::{SystemTime, UNIX_EPOCH};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Prk, Salt};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// How long one key seals tickets (rustls' own ticketer rotates as often).
pub const PERIOD_SECONDS: u64 = 6 * 60 * 60;

/// What derives keys for tickets (and nothing else).
const SALT: &[u8] = b"fleet: TLS session tickets, v1";
const PERIOD_LEN: usize = 8;

/// Seals and opens session tickets with keys derived from the listener's TLS files.
pub struct DerivedTicketer {
    master: Prk,
    /// SHA-256 of the certificates served and trusted: keys differ with any of them.
    context: [u8; 32],
    random: SystemRandom,
    /// Seconds since the Unix epoch (a test's own clock).
    clock: fn() -> u64,
}

impl std::fmt::Debug for DerivedTicketer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Nothing of the keys.
        formatter.debug_struct("DerivedTicketer").finish_non_exhaustive()
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

impl DerivedTicketer {
    /// Keys from `secret` (the private key's DER) for the certificates in `context` (each
    /// one's DER, in a fixed order).
    pub fn new(secret: &[u8], context: &[&[u8]]) -> Self {
        Self::with_clock(secret, context, now)
    }

    fn with_clock(secret: &[u8], context: &[&[u8]], clock: fn() -> u64) -> Self {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for part in context {
            // Each part's length first: parts cannot run into each other.
            digest.update(&(part.len() as u64).to_be_bytes());
            digest.update(part);
        }
        let mut hashed = [0u8; 32];
        hashed.copy_from_slice(digest.finish().as_ref());
        Self {
            master: Salt::new(HKDF_SHA256, SALT).extract(secret),
            context: hashed,
            random: SystemRandom::new(),
            clock,
        }
    }

    fn period(&self) -> u64 {
        (self.clock)() / PERIOD_SECONDS
    }

    fn key(&self, period: u64) -> Option<LessSafeKey> {
        let period = period.to_be_bytes();
        let info = [self.context.as_slice(), period.as_slice()];
        let okm = self.master.expand(&info, &AES_256_GCM).ok()?;
        Some(LessSafeKey::new(UnboundKey::from(okm)))
    }
}

impl ProducesTickets for DerivedTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        PERIOD_SECONDS as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let period = self.period().to_be_bytes();
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).ok()?;
        let mut sealed = plain.to_vec();
        self.key(self.period())?
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(period), &mut sealed)
            .ok()?;
        let mut ticket = Vec::with_capacity(PERIOD_LEN + NONCE_LEN + sealed.len());
        ticket.extend_from_slice(&period);
        ticket.extend_from_slice(&nonce);
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let (period, rest) = ticket.split_first_chunk::<PERIOD_LEN>()?;
        let (nonce, sealed) = rest.split_first_chunk::<NONCE_LEN>()?;
        let sealed_in = u64::from_be_bytes(*period);
        let now = self.period();
        if sealed_in != now && sealed_in.checked_add(1) != Some(now) {
            return None;
        }
        let mut opened = sealed.to_vec();
        let plain = self
            .key(sealed_in)?
            .open_in_place(Nonce::assume_unique_for_key(*nonce), Aad::from(*period), &mut opened)
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"the listener's private key";
    const CERTIFICATES: &[&[u8]] = &[b"server certificate", b"agent CA"];

    fn at_start() -> u64 {
        1_800_000_000
    }
    fn next_period() -> u64 {
        at_start() + PERIOD_SECONDS
    }
    fn two_periods_on() -> u64 {
        at_start() + 2 * PERIOD_SECONDS
    }

    #[test]
    fn a_ticket_opens_in_another_process_serving_the_same_files() {
        let first = DerivedTicketer::with_clock(SECRET, CERTIFICATES, at_start);
        let ticket = first.encrypt(b"session state").expect("sealed");
        assert!(!ticket.windows(13).any(|window| window == b"session state"), "sealed, not in the clear");
        let restarted = DerivedTicketer::with_clock(SECRET, CERTIFICATES, at_start);
        assert_eq!(restarted.decrypt(&ticket).as_deref(), Some(&b"session state"[..]));
        assert_ne!(first.encrypt(b"session state"), Some(ticket), "a fresh nonce each time");
    }

    #[test]
    fn other_files_a_changed_ticket_or_an_old_one_open_nothing() {
        let ticketer = DerivedTicketer::with_clock(SECRET, CERTIFICATES, at_start);
        let ticket = ticketer.encrypt(b"session state").expect("sealed");
        let other_key = DerivedTicketer::with_clock(b"another private key", CERTIFICATES, at_start);
        assert_eq!(other_key.decrypt(&ticket), None);
        let other_ca = DerivedTicketer::with_clock(SECRET, &[b"server certificate", b"another CA"], at_start);
        assert_eq!(other_ca.decrypt(&ticket), None);
        let run_together = DerivedTicketer::with_clock(SECRET, &[b"server certificateagent", b" CA"], at_start);
        assert_eq!(run_together.decrypt(&ticket), None, "the parts are not merely concatenated");
        for index in 0..ticket.len() {
            let mut changed = ticket.clone();
            changed[index] ^= 1;
            assert_eq!(ticketer.decrypt(&changed), None, "byte {index} changed");
        }
        assert_eq!(ticketer.decrypt(&ticket[..ticket.len() - 1]), None);
        assert_eq!(ticketer.decrypt(&[]), None);
        let next = DerivedTicketer::with_clock(SECRET, CERTIFICATES, next_period);
        assert_eq!(next.decrypt(&ticket).as_deref(), Some(&b"session state"[..]), "the next period still opens it");
        let later = DerivedTicketer::with_clock(SECRET, CERTIFICATES, two_periods_on);
        assert_eq!(later.decrypt(&ticket), None, "past the next period it is too old");
        let future = next.encrypt(b"later").expect("sealed");
        assert_eq!(ticketer.decrypt(&future), None, "a ticket from a later period than now is refused");
    }
}
