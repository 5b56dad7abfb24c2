//! Page tokens: URL-safe base64 (padded) of a little-endian `u16` limit and `u16` page, as
//! the original writes them. A page is also bounded by size ([`MAX_PAGE_BYTES`]); the page
//! after one cut short by size starts at an offset the token carries as four more bytes
//! (`u32`). Clients treat tokens as opaque, so the original's clients follow both.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use fleet_core::unpoisoned::Locked;

/// The most a page's items may take, serialised; a page holds at least one item.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageToken {
    pub limit: u16,
    pub page: u16,
    /// Where the page starts, when an earlier page was cut short by size.
    pub start: Option<u32>,
}

impl PageToken {
    pub fn first(limit: u16) -> Self {
        Self { limit, page: 1, start: None }
    }

    pub fn encode(self) -> String {
        let mut bytes = Vec::with_capacity(8);
        bytes.extend_from_slice(&self.limit.to_le_bytes());
        bytes.extend_from_slice(&self.page.to_le_bytes());
        if let Some(start) = self.start {
            bytes.extend_from_slice(&start.to_le_bytes());
        }
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
            length => Self {
                limit: u16::from_le_bytes([bytes[0], bytes[1]]),
                page: u16::from_le_bytes([bytes[2], bytes[3]]),
                start: (length == 8).then(|| u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]])),
            },
        };
        if token.limit != server_limit {
            return Err(format!("token limit must be {server_limit}"));
        }
        if token.page == 0 {
            return Err("token page must be greater than zero".to_string());
        }
        Ok(token)
    }

    /// Where the page this token names starts in the whole list, and how many items it holds
    /// at most: what a store is asked for.
    pub fn window(self) -> (usize, usize) {
        let limit = usize::from(self.limit);
        let start = match self.start {
            Some(start) => start as usize,
            None => usize::from(self.page.saturating_sub(1)).saturating_mul(limit),
        };
        (start, limit)
    }

    /// The slice of `items` this token names, and the token of the page after it, if any.
    /// The page ends after `limit` items, or earlier when the next item would take it past
    /// [`MAX_PAGE_BYTES`] as `size` measures them.
    pub fn page<T>(self, mut items: Vec<T>, size: impl Fn(&T) -> usize) -> (Vec<T>, Option<PageToken>) {
        let (start, limit) = self.window();
        let end = start.saturating_add(limit).min(items.len());
        let more = end < items.len();
        let window: Vec<T> = if start >= items.len() { Vec::new() } else { items.drain(start..end).collect() };
        self.page_fetched(window, more, size)
    }

    /// [`PageToken::page`] for a store that gave only this token's window of the list
    /// (`items`), and said whether `more` items follow it.
    pub fn page_fetched<T>(
        self,
        mut items: Vec<T>,
        more: bool,
        size: impl Fn(&T) -> usize,
    ) -> (Vec<T>, Option<PageToken>) {
        let (start, _) = self.window();
        let mut bytes = 0usize;
        let mut end = items.len();
        for (index, item) in items.iter().enumerate() {
            bytes = bytes.saturating_add(size(item));
            if bytes > MAX_PAGE_BYTES && index > 0 {
                end = index;
                break;
            }
        }
        let cut_by_size = end < items.len();
        items.truncate(end);
        let next = (cut_by_size || more).then(|| Self {
            limit: self.limit,
            page: self.page.saturating_add(1),
            // The original's token while pages are regular; an offset once one is cut.
            start: (cut_by_size || self.start.is_some())
                .then(|| u32::try_from(start.saturating_add(end)).unwrap_or(u32::MAX)),
        });
        (items, next)
    }
}

/// One item of a page as it goes out: encoded as JSON once, measured by that encoding's
/// length, and sent as those bytes.
pub type EncodedItem = Box<serde_json::value::RawValue>;

impl PageToken {
    /// [`PageToken::page_fetched`] for items that go out as JSON: each is encoded once (its
    /// length cuts the page, its bytes are sent). The items the page keeps come back beside
    /// their encodings, in order, for the cursor of the page after.
    pub fn page_encoded<T: serde::Serialize>(
        self,
        items: Vec<T>,
        more: bool,
    ) -> (Vec<T>, Vec<EncodedItem>, Option<Self>) {
        let encoded: Vec<(EncodedItem, T)> = items
            .into_iter()
            .filter_map(|item| match serde_json::value::to_raw_value(&item) {
                Ok(json) => Some((json, item)),
                Err(error) => {
                    tracing::error!(%error, "an item of a page could not be encoded; it is left out");
                    None
                }
            })
            .collect();
        let (kept, next) = self.page_fetched(encoded, more, |(json, _)| json.get().len());
        let (encoded, items) = kept.into_iter().unzip();
        (items, encoded, next)
    }
}

/// Where the lists clients follow page by page stopped: the next page of a listing (its kind,
/// its asker's role and filters) resumes after the last item of the page before, so a store
/// finds it without walking every item before it. Tokens stay the original's (a page number,
/// or an offset): a page asked for with no cursor known, or past the cursor's lifetime, is
/// found by counting, as before.
#[derive(Default)]
pub struct PageCursors {
    cursors: std::sync::Mutex<std::collections::HashMap<(String, usize), (String, std::time::Instant)>>,
}

/// How long a cursor is kept after its page was served.
const CURSOR_LIFETIME: std::time::Duration = std::time::Duration::from_secs(120);
/// The most cursors kept (one per listing being followed).
const MAX_CURSORS: usize = 4096;

impl PageCursors {
    /// The list key of the item the page before `start` of `listing` ended with.
    pub fn after(&self, listing: &str, start: usize) -> Option<String> {
        if start == 0 {
            return None;
        }
        let cursors = self.cursors.locked();
        let (last, served) = cursors.get(&(listing.to_string(), start))?;
        (served.elapsed() < CURSOR_LIFETIME).then(|| last.clone())
    }

    /// Notes that the page of `listing` ending before `next_start` ended with `last`.
    pub fn remember(&self, listing: &str, next_start: usize, last: String) {
        let mut cursors = self.cursors.locked();
        if cursors.len() >= MAX_CURSORS {
            cursors.retain(|_, (_, served)| served.elapsed() < CURSOR_LIFETIME);
            if cursors.len() >= MAX_CURSORS {
                cursors.clear();
            }
        }
        cursors.insert((listing.to_string(), next_start), (last, std::time::Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_format_matches_the_original() {
        assert_eq!(PageToken { limit: 2, page: 2, start: None }.encode(), "AgACAA==");
        assert_eq!(PageToken::decode("AgACAA==", 2), Ok(PageToken { limit: 2, page: 2, start: None }));
        assert_eq!(PageToken::decode("AgACAA==", 100), Err("token limit must be 100".into()));
        assert_eq!(
            PageToken::decode(&PageToken { limit: 100, page: 0, start: None }.encode(), 100),
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
        let (page, next) = first.page(vec![1, 2, 3, 4], |_| 1);
        assert_eq!(page, vec![1, 2]);
        assert_eq!(next.unwrap().encode(), "AgACAA==", "the original's token while pages are regular");
        let (page, next) = next.unwrap().page(vec![1, 2, 3, 4], |_| 1);
        assert_eq!(page, vec![3, 4]);
        assert_eq!(next, None);
        let (page, next) = first.page(Vec::<u8>::new(), |_| 1);
        assert!(page.is_empty() && next.is_none());
    }

    /// Regression: a page of 100 large units came to 96 MB.
    #[test]
    fn pages_are_bounded_by_size_and_carry_on_from_where_they_were_cut() {
        let items: Vec<usize> = (0..10).collect();
        let big = |item: &usize| if *item < 6 { MAX_PAGE_BYTES / 2 } else { 10 };
        let mut token = Some(PageToken::first(100));
        let mut pages = Vec::new();
        while let Some(current) = token {
            let decoded = PageToken::decode(&current.encode(), 100).unwrap();
            assert_eq!(decoded, current, "tokens survive the round trip");
            let (page, next) = decoded.page(items.clone(), big);
            pages.push(page);
            token = next;
        }
        assert_eq!(pages, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7, 8, 9]]);
        let huge = |_: &usize| MAX_PAGE_BYTES * 2;
        let (page, next) = PageToken::first(100).page(items, huge);
        assert_eq!((page, next.map(|token| token.start)), (vec![0], Some(Some(1))), "at least one item a page");
    }

    #[test]
    fn encoded_pages_are_cut_by_their_encodings_and_send_those_bytes() {
        // Three strings of about 40% of a page each: two fit, the third starts the next page.
        let items: Vec<String> = ["a", "b", "c"].iter().map(|letter| letter.repeat(MAX_PAGE_BYTES * 2 / 5)).collect();
        let (kept, encoded, next) = PageToken::first(100).page_encoded(items.clone(), false);
        assert_eq!(kept, items[..2]);
        let sent: Vec<String> = encoded.iter().map(|json| json.get().to_string()).collect();
        let expected: Vec<String> = items[..2].iter().map(|item| serde_json::to_string(item).unwrap()).collect();
        assert_eq!(sent, expected);
        assert_eq!(next.map(|token| token.start), Some(Some(2)));
        let page = fleet_api_schema::UnitPage { next_page_token: None, units: encoded };
        let read: fleet_api_schema::UnitPage<String> =
            serde_json::from_str(&serde_json::to_string(&page).unwrap()).unwrap();
        assert_eq!(read.units, items[..2], "a page of encoded items reads as the items");
    }
}
