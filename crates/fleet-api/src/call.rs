//! What a handler is given of its request, once the route table matched it and the caller
//! was allowed what the route needs.

use axum::body::Bytes;
use axum::http::HeaderMap;
use fleet_core::access::Role;

use crate::auth::Identity;
use crate::upgrade::Upgrade;

pub(crate) struct Call<'a> {
    pub identity: &'a Identity,
    /// The values of the route's `{…}` segments, percent-decoded, never empty.
    pub params: &'a [String],
    pub query: &'a [(String, String)],
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    /// The protocol switch the request offers (HTTP/1.1 `Connection: upgrade` only).
    pub upgrade: &'a Upgrade,
}

impl Call<'_> {
    pub fn role(&self) -> &Role {
        &self.identity.role
    }

    /// The route's first parameter (the unit, machine, source or token it names).
    pub fn param(&self) -> &str {
        self.params.first().map_or("", String::as_str)
    }

    /// The route's second parameter (a body's hash, a journal question's number).
    pub fn second_param(&self) -> &str {
        self.params.get(1).map_or("", String::as_str)
    }
}
