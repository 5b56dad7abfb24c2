//! What a unit reserves and what a machine has room for: memory in bytes and CPU in
//! thousandths of a core, with the value grammars of `[X-Fleet] Memory=`/`CPU=` and of
//! systemd's `MemoryMax=`, `MemoryHigh=` and `CPUQuota=`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Memory and CPU, as a reservation or a capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Bytes.
    pub memory: u64,
    /// Thousandths of a core.
    pub cpu_millis: u64,
}

/// The most memory a value may name: 1 PiB (a bound on what enters, not a machine size).
pub const MAX_MEMORY: u64 = 1 << 50;
/// The most CPU a value may name: a million cores.
pub const MAX_CPU_MILLIS: u64 = 1_000_000_000;

impl Resources {
    pub const ZERO: Self = Self { memory: 0, cpu_millis: 0 };

    pub fn is_zero(self) -> bool {
        self == Self::ZERO
    }

    pub fn saturating_add(self, other: Self) -> Self {
        Self {
            memory: self.memory.saturating_add(other.memory),
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
        }
    }

    pub fn saturating_sub(self, other: Self) -> Self {
        Self {
            memory: self.memory.saturating_sub(other.memory),
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
        }
    }

    /// Whether every amount of `self` is at most the same amount of `room`.
    pub fn fits_in(self, room: Self) -> bool {
        self.memory <= room.memory && self.cpu_millis <= room.cpu_millis
    }

    /// Whether some amount of `self` exceeds the same amount of `capacity`.
    pub fn exceeds(self, capacity: Self) -> bool {
        !self.fits_in(capacity)
    }

    /// Whether both amounts are within [`MAX_MEMORY`] and [`MAX_CPU_MILLIS`].
    pub fn is_bounded(self) -> bool {
        self.memory <= MAX_MEMORY && self.cpu_millis <= MAX_CPU_MILLIS
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} memory, {} CPU", Bytes(self.memory), Cores(self.cpu_millis))
    }
}

/// Bytes as people read them: `512 MiB`, `6.2 GiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 || value.fract() == 0.0 {
            write!(f, "{value:.0} {}", UNITS[unit])
        } else {
            // One decimal, rounded down: a free amount is never shown larger than it is.
            write!(f, "{:.1} {}", (value * 10.0).floor() / 10.0, UNITS[unit])
        }
    }
}

/// Thousandths of a core as cores: `2`, `0.5`, `1.25`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cores(pub u64);

impl fmt::Display for Cores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, part) = (self.0 / 1000, self.0 % 1000);
        if part == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{part:03}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// Why a resource value cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("expected a size in bytes with an optional K, M, G or T suffix, such as 512M")]
    NotASize,
    #[error("expected a number of cores such as 0.5 or 2, with at most three decimals")]
    NotCores,
    #[error("expected a percentage of one core such as 150%")]
    NotAQuota,
    #[error("larger than fleet accepts (at most 1P of memory and 1000000 cores)")]
    TooLarge,
}

/// A decimal number with at most `decimals` digits after the point, scaled by 10^decimals.
fn scaled_decimal(text: &str, decimals: u32) -> Option<u128> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > decimals as usize
        || whole.len() > 20
    {
        return None;
    }
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let padded = format!("{fraction:0<width$}", width = decimals as usize);
    let fraction: u128 = if padded.is_empty() { 0 } else { padded.parse().ok()? };
    Some(whole * 10u128.pow(decimals) + fraction)
}

/// A size as systemd reads `MemoryMax=`: bytes, or a decimal with `K`, `M`, `G` or `T`
/// (powers of 1024). `infinity` is `None` (no limit).
pub fn parse_bytes(text: &str) -> Result<Option<u64>, ResourceError> {
    let text = text.trim();
    if text == "infinity" {
        return Ok(None);
    }
    let (number, scale) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 1u128 << 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 1 << 30),
        Some(b'T' | b't') => (&text[..text.len() - 1], 1 << 40),
        _ => (text, 1),
    };
    // Three decimals at most: `1.5G`; a fraction of a byte is dropped.
    let thousandths = scaled_decimal(number, 3).ok_or(ResourceError::NotASize)?;
    let bytes = thousandths * scale / 1000;
    if bytes > u128::from(MAX_MEMORY) {
        return Err(ResourceError::TooLarge);
    }
    Ok(Some(bytes as u64))
}

/// A number of cores (`0.5`, `2`) in thousandths of a core.
pub fn parse_cores(text: &str) -> Result<u64, ResourceError> {
    let millis = scaled_decimal(text.trim(), 3).ok_or(ResourceError::NotCores)?;
    if millis > u128::from(MAX_CPU_MILLIS) {
        return Err(ResourceError::TooLarge);
    }
    Ok(millis as u64)
}

/// systemd's `CPUQuota=` (`150%`: one and a half cores) in thousandths of a core.
pub fn parse_cpu_quota(text: &str) -> Result<u64, ResourceError> {
    let percent = text.trim().strip_suffix('%').ok_or(ResourceError::NotAQuota)?;
    // One percent of a core is ten thousandths: tenths of a percent are thousandths.
    let millis = scaled_decimal(percent, 1).ok_or(ResourceError::NotAQuota)?;
    if millis > u128::from(MAX_CPU_MILLIS) {
        return Err(ResourceError::TooLarge);
    }
    Ok(millis as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_systemd_reads_them() {
        assert_eq!(parse_bytes("512"), Ok(Some(512)));
        assert_eq!(parse_bytes("4K"), Ok(Some(4096)));
        assert_eq!(parse_bytes("512M"), Ok(Some(512 << 20)));
        assert_eq!(parse_bytes("1.5G"), Ok(Some(3 << 29)));
        assert_eq!(parse_bytes("2T"), Ok(Some(2 << 40)));
        assert_eq!(parse_bytes("infinity"), Ok(None));
        for bad in ["", "M", "-1G", "1.5.5G", "1e9", "12 G", "1.2345G", "NaN"] {
            assert_eq!(parse_bytes(bad), Err(ResourceError::NotASize), "{bad:?}");
        }
        assert_eq!(parse_bytes("2000T"), Err(ResourceError::TooLarge));
        assert_eq!(parse_bytes("99999999999999999999999999"), Err(ResourceError::NotASize));
    }

    #[test]
    fn cores_and_quotas_are_thousandths_of_a_core() {
        assert_eq!(parse_cores("0.5"), Ok(500));
        assert_eq!(parse_cores("2"), Ok(2000));
        assert_eq!(parse_cores("1.25"), Ok(1250));
        assert_eq!(parse_cores(".5"), Ok(500));
        for bad in ["", "-1", "0.0001", "two", "1,5", "1e3"] {
            assert_eq!(parse_cores(bad), Err(ResourceError::NotCores), "{bad:?}");
        }
        assert_eq!(parse_cores("1000001"), Err(ResourceError::TooLarge));
        assert_eq!(parse_cpu_quota("150%"), Ok(1500));
        assert_eq!(parse_cpu_quota("20%"), Ok(200));
        assert_eq!(parse_cpu_quota("12.5%"), Ok(125));
        for bad in ["150", "%", "-5%", "1.25%"] {
            assert_eq!(parse_cpu_quota(bad), Err(ResourceError::NotAQuota), "{bad:?}");
        }
    }

    #[test]
    fn amounts_are_shown_as_people_read_them() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(8 << 30).to_string(), "8 GiB");
        assert_eq!(Bytes(6_657_199_308).to_string(), "6.1 GiB", "rounded down");
        assert_eq!(Cores(500).to_string(), "0.5");
        assert_eq!(Cores(2000).to_string(), "2");
        assert_eq!(Cores(1250).to_string(), "1.25");
        let reservation = Resources { memory: 1 << 30, cpu_millis: 1500 };
        assert_eq!(reservation.to_string(), "1 GiB memory, 1.5 CPU");
    }

    #[test]
    fn reservations_add_and_fit() {
        let a = Resources { memory: 100, cpu_millis: 10 };
        let b = Resources { memory: 50, cpu_millis: 20 };
        assert_eq!(a.saturating_add(b), Resources { memory: 150, cpu_millis: 30 });
        assert_eq!(a.saturating_sub(b), Resources { memory: 50, cpu_millis: 0 });
        assert!(b.fits_in(Resources { memory: 50, cpu_millis: 20 }));
        assert!(!a.fits_in(b) && a.exceeds(b));
    }
}
