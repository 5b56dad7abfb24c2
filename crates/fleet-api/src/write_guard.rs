//! What a request that changes state must look like: sent by a program (fleetctl, a pull
//! agent, the original's client, a git forge) or from the API's own origin, never by a form
//! or a script of another site riding on a browser's credentials.
//!
//! A browser lets any page send a cross-site form (`application/x-www-form-urlencoded`,
//! `multipart/form-data`, `text/plain`) or a body-less `fetch` without asking the server
//! first; it always says where such a request comes from (`Origin`, and `Sec-Fetch-Site` in
//! current browsers). So a write must carry JSON (or nothing), and must not come from another
//! site. Checked before any credential is read.

use axum::http::{HeaderMap, Method, StatusCode, header};

use crate::error::ApiError;
use crate::routes::Body;

/// Refuses a write that a browser could have sent on another site's behalf, or whose body
/// is not what its route takes.
pub(crate) fn check(method: &Method, body: Body, headers: &HeaderMap) -> Result<(), ApiError> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(());
    }
    check_same_site(headers)?;
    match body {
        Body::Json | Body::Bulk => check_json(headers),
        Body::Empty if headers.contains_key(header::CONTENT_TYPE) => check_json(headers),
        Body::Empty | Body::Signed => Ok(()),
    }
}

fn cross_site(why: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, format!("cross-site request refused: {why}"))
}

/// A browser's request from another origin is refused; a program's (no `Origin`, no
/// `Sec-Fetch-Site`) is not.
fn check_same_site(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none")) {
            return Err(cross_site("the browser says it comes from another site"));
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().unwrap_or("");
    let authority = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://"));
    let host = headers.get(header::HOST).and_then(|host| host.to_str().ok());
    match (authority, host) {
        (Some(authority), Some(host)) if authority.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(cross_site("its Origin is not this server")),
    }
}

/// Exactly one `Content-Type`, `application/json` (parameters aside); the original's words.
fn check_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let values: Vec<_> = headers.get_all(header::CONTENT_TYPE).iter().collect();
    if values.len() != 1 {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("expected 1 Content-Type, got {}", values.len()),
        ));
    }
    let media_type = values[0].to_str().unwrap_or("").split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "only acceptable Content-Type is application/json",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn writes_from_programs_pass() {
        let json = headers(&[("content-type", "application/json; charset=utf-8"), ("host", "h:1")]);
        assert!(check(&Method::PUT, Body::Json, &json).is_ok());
        assert!(check(&Method::DELETE, Body::Empty, &headers(&[])).is_ok());
        assert!(check(&Method::POST, Body::Empty, &json).is_ok());
        let same = headers(&[("content-type", "application/json"), ("host", "h:1"), ("origin", "http://h:1")]);
        assert!(check(&Method::POST, Body::Json, &same).is_ok());
        let forge = headers(&[("content-type", "application/x-www-form-urlencoded")]);
        assert!(check(&Method::POST, Body::Signed, &forge).is_ok());
    }

    #[test]
    fn what_a_page_of_another_site_can_send_is_refused() {
        let refused = |method: Method, body: Body, pairs: &[(&'static str, &'static str)]| {
            check(&method, body, &headers(pairs)).map_err(|error| error.status.as_u16()).err()
        };
        assert_eq!(refused(Method::POST, Body::Json, &[("content-type", "text/plain")]), Some(415));
        assert_eq!(refused(Method::POST, Body::Json, &[]), Some(415));
        assert_eq!(
            refused(Method::POST, Body::Empty, &[("content-type", "application/x-www-form-urlencoded")]),
            Some(415)
        );
        assert_eq!(refused(Method::POST, Body::Empty, &[("host", "h:1"), ("origin", "http://evil:1")]), Some(403));
        assert_eq!(refused(Method::POST, Body::Empty, &[("host", "h:1"), ("origin", "null")]), Some(403));
        assert_eq!(refused(Method::DELETE, Body::Empty, &[("sec-fetch-site", "cross-site")]), Some(403));
        assert_eq!(refused(Method::POST, Body::Signed, &[("sec-fetch-site", "same-site")]), Some(403));
        // Reads are not writes.
        assert_eq!(refused(Method::GET, Body::Empty, &[("sec-fetch-site", "cross-site")]), None);
    }
}
