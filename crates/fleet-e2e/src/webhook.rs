//! Calling a source's push webhook as a git forge does: a plain HTTP POST to a fleetd's TCP
//! listener, signed `X-Hub-Signature-256`.

use std::io::{Read, Write};

/// One POST to the API's TCP listener on `port`; the status code and the body.
pub fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the API");
    let mut request =
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let code = answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (code, answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// The `X-Hub-Signature-256` value of `body` with `secret`.
pub fn signature(secret: &str, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, body.as_bytes());
    let hex: String = tag.as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256={hex}")
}
