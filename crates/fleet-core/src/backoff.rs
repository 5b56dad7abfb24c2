//! How long to wait before trying again: doubling from a minimum up to a maximum, back to
//! the minimum after a success. The one backoff of every retry loop in fleet (plain data; the
//! caller sleeps).

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self { min, max: max.max(min), next: min }
    }

    /// The wait before the next attempt; each call doubles the one after, up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// After a success: the next failure waits the minimum again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// As [`Backoff::next_delay`], spread over its upper half by `sample` (any random number):
    /// many clients that lost the same server come back at different times.
    pub fn next_delay_jittered(&mut self, sample: u32) -> Duration {
        let delay = self.next_delay();
        let fraction = 0.5 + f64::from(sample % 1000) / 2000.0;
        delay.mul_f64(fraction)
    }

    /// The wait the next failure would get, without counting it.
    pub fn peek(&self) -> Duration {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(1));
        let delays: Vec<u128> = (0..5).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.peek(), Duration::from_millis(250));
        let mut huge = Backoff::new(Duration::MAX, Duration::ZERO);
        assert_eq!((huge.next_delay(), huge.next_delay()), (Duration::MAX, Duration::MAX), "never overflows");
    }

    #[test]
    fn jitter_spreads_over_the_upper_half() {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(2));
        assert_eq!(backoff.next_delay_jittered(0), Duration::from_secs(1));
        assert_eq!(backoff.next_delay_jittered(999), Duration::from_millis(1999));
        assert_eq!(backoff.next_delay_jittered(500), Duration::from_millis(1500));
    }
}
