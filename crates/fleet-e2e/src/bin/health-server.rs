//! `health-server PORT STATUS`: a service for health-check tests. It listens on loopback
//! `PORT` and answers every HTTP request with `STATUS` (so a unit running it is healthy or not
//! by its own command line, which also tells its version from the machine's processes).

use std::io::{Read, Write};
use std::net::TcpListener;

fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let (Some(port), Some(status)) = (arguments.get(1), arguments.get(2)) else {
        eprintln!("usage: health-server PORT STATUS");
        std::process::exit(2);
    };
    let listener = match TcpListener::bind(format!("127.0.0.1:{port}")) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on 127.0.0.1:{port}: {error}");
            std::process::exit(1);
        }
    };
    for mut stream in listener.incoming().flatten() {
        let mut request = [0u8; 2048];
        let _ = stream.read(&mut request);
        let answer = format!("HTTP/1.1 {status} Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let _ = stream.write_all(answer.as_bytes());
    }
}
