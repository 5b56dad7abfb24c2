//! A small deterministic source of pseudo-random choices (xorshift64*), for the chaos run's
//! plans, the delay proxy's jitter and the simulation's faults: the same seed gives the same
//! choices.

use std::time::Duration;

/// A deterministic source of choices (xorshift64*).
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_number(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..bound`.
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_number() % bound.max(1) as u64) as usize
    }

    pub fn duration(&mut self, from: Duration, to: Duration) -> Duration {
        let span = (to - from).as_millis().max(1) as u64;
        from + Duration::from_millis(self.next_number() % span)
    }
}
