//! Randomness for jitter and for spreading agents over managers (no secret rides on it).

/// A random number from the system's source; zero if it fails.
pub(crate) fn random_sample() -> u32 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 4];
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    u32::from_le_bytes(bytes)
}
