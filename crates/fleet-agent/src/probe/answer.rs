//! Reading an HTTP/1.x answer far enough to judge it and to know whether its connection can
//! carry the next probe: the head's status, and where the body ends. Pure, over bytes.

/// The most of an answer's head read.
pub const MOST_HEAD: usize = 16 * 1024;

/// How an answer's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// No body (`204`, `304`).
    Empty,
    /// `Content-Length:` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Where the server closes the connection: it cannot be kept.
    UntilClose,
}

/// An answer's head, as a probe needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub code: u16,
    pub body: Body,
    /// The server keeps the connection open after this answer.
    pub keep_alive: bool,
}

/// Where the head ends in `bytes` (just past its blank line), once it has.
pub fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|window| window == b"\r\n\r\n").map(|at| at + 4)
}

/// Reads a complete head (status line and header lines, up to the blank line).
pub fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let mut words = status.split_whitespace();
    let version = words.next().filter(|version| version.starts_with("HTTP/1."));
    let code = words.next().and_then(|code| code.parse::<u16>().ok()).filter(|code| (100..600).contains(code));
    let (Some(version), Some(code)) = (version, code) else {
        return Err("no HTTP status line in the answer".to_string());
    };
    let mut length = None;
    let mut chunked = false;
    let mut close = version == "HTTP/1.0";
    for line in lines.take_while(|line| !line.is_empty()) {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<u64>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().split(',').any(|coding| coding.trim() == "chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            for option in value.split(',').map(str::trim) {
                if option.eq_ignore_ascii_case("close") {
                    close = true;
                } else if option.eq_ignore_ascii_case("keep-alive") {
                    close = false;
                }
            }
        }
    }
    let body = if code == 204 || code == 304 || code < 200 {
        Body::Empty
    } else if chunked {
        Body::Chunked
    } else if let Some(length) = length {
        Body::Length(length)
    } else {
        Body::UntilClose
    };
    // A 1xx answer is not the last one: the connection is not at a known point after it.
    let keep_alive = !close && body != Body::UntilClose && code >= 200;
    Ok(Head { code, body, keep_alive })
}

/// Where a chunked body that starts at `bytes[0]` ends (past its last chunk and trailers),
/// once `bytes` holds all of it.
pub fn chunked_end(bytes: &[u8]) -> Result<Option<usize>, String> {
    let mut at = 0;
    loop {
        let Some(line) = line_at(bytes, at) else { return Ok(None) };
        let size_text = String::from_utf8_lossy(&bytes[at..line]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| format!("bad chunk size {size_text:?}"))?;
        at = line + 2;
        if size == 0 {
            // Trailer lines, up to a blank one.
            loop {
                let Some(end) = line_at(bytes, at) else { return Ok(None) };
                let blank = end == at;
                at = end + 2;
                if blank {
                    return Ok(Some(at));
                }
            }
        }
        let Some(after) = at.checked_add(size).and_then(|end| end.checked_add(2)) else {
            return Err("chunk too large".to_string());
        };
        if bytes.len() < after {
            return Ok(None);
        }
        if &bytes[after - 2..after] != b"\r\n" {
            return Err("a chunk does not end its line".to_string());
        }
        at = after;
    }
}

/// The end of the line that starts at `at` (where its `\r\n` is), once `bytes` has it.
fn line_at(bytes: &[u8], at: usize) -> Option<usize> {
    bytes.get(at..)?.windows(2).position(|pair| pair == b"\r\n").map(|offset| at + offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Head, String> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn status_and_framing() {
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n"),
            Ok(Head { code: 200, body: Body::Length(12), keep_alive: true })
        );
        assert_eq!(
            head("HTTP/1.1 503 Busy\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            Ok(Head { code: 503, body: Body::Chunked, keep_alive: true })
        );
        assert_eq!(
            head("HTTP/1.1 204 No Content\r\n\r\n"),
            Ok(Head { code: 204, body: Body::Empty, keep_alive: true })
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            Ok(Head { code: 200, body: Body::Length(0), keep_alive: false })
        );
        assert_eq!(
            head("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n"),
            Ok(Head { code: 200, body: Body::Length(2), keep_alive: false })
        );
        assert_eq!(
            head("HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: Keep-Alive\r\n\r\n"),
            Ok(Head { code: 200, body: Body::Length(2), keep_alive: true })
        );
        assert_eq!(head("HTTP/1.1 200 OK\r\n\r\n"), Ok(Head { code: 200, body: Body::UntilClose, keep_alive: false }));
        assert_eq!(head("HTTP/1.1 100 Continue\r\n\r\n").map(|head| head.keep_alive), Ok(false));
    }

    #[test]
    fn not_http() {
        assert!(head("SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(head("HTTP/1.1 9999 what\r\n\r\n").is_err());
        assert!(head("HTTP/2 200\r\n\r\n").is_err());
        assert!(head("").is_err());
    }

    #[test]
    fn heads_end_at_the_blank_line() {
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n\r\nbody"), Some(19));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(chunked_end(b"5\r\nhello\r\n0\r\n\r\nNEXT"), Ok(Some(15)));
        assert_eq!(chunked_end(b"5;name=x\r\nhello\r\n0\r\nTrailer: y\r\n\r\n"), Ok(Some(34)));
        assert_eq!(chunked_end(b"5\r\nhel"), Ok(None));
        assert_eq!(chunked_end(b"5\r\nhello\r\n0\r\n"), Ok(None));
        assert!(chunked_end(b"zz\r\n").is_err());
        assert!(chunked_end(b"2\r\nhello\r\n").is_err());
        assert!(chunked_end(b"ffffffffffffffff\r\n").is_err());
    }
}
