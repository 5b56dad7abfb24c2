//! `health-server PORT STATUS`: a service for health-check tests and benchmarks. It listens
//! on loopback `PORT` and answers every HTTP request with `STATUS` (so a unit running it is
//! healthy or not by its own command line, which also tells its version from the machine's
//! processes). Each connection is served on its own and kept open between requests, as HTTP/1.1
//! servers do; one that sends nothing for a minute is dropped.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How long a connection may sit without a request.
const IDLE: Duration = Duration::from_secs(60);

fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let (Some(port), Some(status)) = (arguments.get(1), arguments.get(2)) else {
        eprintln!("usage: health-server PORT STATUS");
        std::process::exit(2);
    };
    let answer = format!("HTTP/1.1 {status} Test\r\nContent-Length: 0\r\n\r\n");
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start: {error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::bind(format!("127.0.0.1:{port}")).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("cannot listen on 127.0.0.1:{port}: {error}");
                std::process::exit(1);
            }
        };
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut request = Vec::with_capacity(512);
                let mut chunk = [0u8; 2048];
                // Requests without bodies (GETs), answered as each one's head is complete.
                while let Ok(Ok(read)) = tokio::time::timeout(IDLE, stream.read(&mut chunk)).await
                    && read > 0
                    && request.len() < 64 * 1024
                {
                    request.extend_from_slice(&chunk[..read]);
                    while let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") {
                        request.drain(..end + 4);
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
}
