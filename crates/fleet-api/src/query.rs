//! Query strings: their parameters, percent-decoding, and the page token a list takes.

use crate::error::ApiError;

/// The query string's parameters, percent-decoded, in order (a name may repeat).
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |text: &str| percent_decode(&text.replace('+', " ")).unwrap_or_else(|| text.to_string());
            (decode(name), decode(value))
        })
        .collect()
}

pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The largest page a client may ask for with `pageSize` (a page is bounded by its bytes too,
/// `pagination::MAX_PAGE_BYTES`).
pub const MAX_PAGE_SIZE: u16 = 10_000;

/// The one value of parameter `name`, if given; `too_many` is the 400's message when it is
/// given more than once.
fn at_most_one<'q>(query: &'q [(String, String)], name: &str, too_many: &str) -> Result<Option<&'q str>, ApiError> {
    let mut values = query.iter().filter(|(key, _)| key == name).map(|(_, value)| value.as_str());
    match (values.next(), values.next()) {
        (value, None) => Ok(value),
        _ => Err(ApiError::bad_request(too_many)),
    }
}

/// The page size of a list: the `pageSize` a client asked for (our addition: fleetctl asks
/// for large pages, so that 100,000 units are 20 requests, not 1,000), else the server's
/// (`token_limit`, as the original). A page token must carry the same size.
pub fn page_limit(query: &[(String, String)], server_limit: u16) -> Result<u16, ApiError> {
    let Some(size) = at_most_one(query, "pageSize", "too many values for pageSize")? else { return Ok(server_limit) };
    size.parse::<u16>().ok().filter(|size| (1..=MAX_PAGE_SIZE).contains(size)).ok_or_else(|| {
        let shown: String = size.chars().take(32).collect();
        ApiError::bad_request(format!("invalid pageSize {shown:?}: a number from 1 to {MAX_PAGE_SIZE}"))
    })
}

/// Reads the one page token a request may carry, for pages of the size the request asks
/// ([`page_limit`]).
pub fn page_token(query: &[(String, String)], server_limit: u16) -> Result<crate::pagination::PageToken, ApiError> {
    let limit = page_limit(query, server_limit)?;
    match at_most_one(query, "nextPageToken", "too many values for page token")? {
        None => Ok(crate::pagination::PageToken::first(limit)),
        Some(token) => crate::pagination::PageToken::decode(token, limit).map_err(ApiError::bad_request),
    }
}

/// The first value of a query parameter.
pub fn first_value<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

/// A `true`/`false` query parameter, `default` when absent; anything else is a 400 naming it.
pub fn flag(query: &[(String, String)], name: &str, default: bool) -> Result<bool, ApiError> {
    match first_value(query, name) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!("invalid {name} {other:?}: true or false"))),
    }
}
