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

/// Reads the one page token a request may carry.
pub fn page_token(query: &[(String, String)], limit: u16) -> Result<crate::pagination::PageToken, ApiError> {
    let tokens: Vec<&String> =
        query.iter().filter(|(name, _)| name == "nextPageToken").map(|(_, value)| value).collect();
    match tokens.as_slice() {
        [] => Ok(crate::pagination::PageToken::first(limit)),
        [token] => crate::pagination::PageToken::decode(token, limit).map_err(ApiError::bad_request),
        _ => Err(ApiError::bad_request("too many values for page token")),
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
