//! Wiping secret bytes before their memory is given back.

/// Zeroes `bytes` with volatile writes, which the compiler may not optimise away as writes
/// to memory about to be freed.
pub(crate) fn wipe(bytes: &mut [u8]) {
    for byte in bytes.iter_mut() {
        // SAFETY: a volatile write to a byte `bytes` borrows mutably: a valid, aligned place.
        unsafe { std::ptr::write_volatile(byte, 0) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_byte_is_zeroed() {
        let mut bytes = *b"secret bytes";
        super::wipe(&mut bytes);
        assert_eq!(bytes, [0; 12]);
    }
}
