//! Page tokens: URL-safe base64 (padded) of a little-endian `u16` limit and `u16` page.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageToken {
    pub limit: u16,
    pub page: u16,
}

impl PageToken {
    pub fn first(limit: u16) -> Self {
        Self { limit, page: 1 }
    }

    pub fn encode(self) -> String {
        let mut bytes = [0u8; 4];
        bytes[..2].copy_from_slice(&self.limit.to_le_bytes());
        bytes[2..].copy_from_slice(&self.page.to_le_bytes());
        URL_SAFE.encode(bytes)
    }

    /// Reads a token and checks it against the server's page size, with the original's
    /// messages.
    pub fn decode(text: &str, server_limit: u16) -> Result<Self, String> {
        let bytes = URL_SAFE.decode(text).map_err(|error| match error {
            base64::DecodeError::InvalidByte(offset, _) | base64::DecodeError::InvalidLastSymbol(offset, _) => {
                format!("illegal base64 data at input byte {offset}")
            }
            _ => format!("illegal base64 data at input byte {}", text.len()),
        })?;
        let token = match bytes.len() {
            0 => return Err("EOF".to_string()),
            1..=3 => return Err("unexpected EOF".to_string()),
            _ => {
                Self { limit: u16::from_le_bytes([bytes[0], bytes[1]]), page: u16::from_le_bytes([bytes[2], bytes[3]]) }
            }
        };
        if token.limit != server_limit {
            return Err(format!("token limit must be {server_limit}"));
        }
        if token.page == 0 {
            return Err("token page must be greater than zero".to_string());
        }
        Ok(token)
    }

    /// The slice of `items` this token names, and the token of the page after it, if any.
    pub fn page<T>(self, mut items: Vec<T>) -> (Vec<T>, Option<PageToken>) {
        let limit = usize::from(self.limit);
        let start = (usize::from(self.page) - 1).saturating_mul(limit);
        let total = items.len();
        let end = start.saturating_add(limit).min(total);
        let page: Vec<T> = if start >= total { Vec::new() } else { items.drain(start..end).collect() };
        let next = (end < total).then(|| Self { limit: self.limit, page: self.page + 1 });
        (page, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_format_matches_the_original() {
        assert_eq!(PageToken { limit: 2, page: 2 }.encode(), "AgACAA==");
        assert_eq!(PageToken::decode("AgACAA==", 2), Ok(PageToken { limit: 2, page: 2 }));
        assert_eq!(PageToken::decode("AgACAA==", 100), Err("token limit must be 100".into()));
        assert_eq!(
            PageToken::decode(&PageToken { limit: 100, page: 0 }.encode(), 100),
            Err("token page must be greater than zero".into())
        );
        assert_eq!(PageToken::decode("", 100), Err("EOF".into()));
        assert_eq!(PageToken::decode("AgA=", 100), Err("unexpected EOF".into()));
        assert!(PageToken::decode("!!!!", 100).unwrap_err().starts_with("illegal base64 data at input byte"));
        // The functional tests' bad token decodes but names another limit.
        assert_eq!(PageToken::decode("EwBMLg==", 100), Err("token limit must be 100".into()));
    }

    #[test]
    fn no_token_after_the_last_page() {
        let first = PageToken::first(2);
        let (page, next) = first.page(vec![1, 2, 3, 4]);
        assert_eq!(page, vec![1, 2]);
        let (page, next) = next.unwrap().page(vec![1, 2, 3, 4]);
        assert_eq!(page, vec![3, 4]);
        assert_eq!(next, None);
        let (page, next) = first.page(Vec::<u8>::new());
        assert!(page.is_empty() && next.is_none());
    }
}
