//! `health-server PORT STATUS`: a service for health-check tests and benchmarks. It listens
//! on loopback `PORT` and answers every HTTP request with `STATUS` (so a unit running it is
//! healthy or not by its own command line, which also tells its version from the machine's
//! processes). Each connection is served on its own, and one that sends nothing is dropped
//! after a second: a stalled client never holds up the others.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let (Some(port), Some(status)) = (arguments.get(1), arguments.get(2)) else {
        eprintln!("usage: health-server PORT STATUS");
        std::process::exit(2);
    };
    let answer = format!("HTTP/1.1 {status} Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
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
                let mut request = [0u8; 2048];
                if let Ok(Ok(read)) = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut request)).await
                    && read > 0
                {
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
}
