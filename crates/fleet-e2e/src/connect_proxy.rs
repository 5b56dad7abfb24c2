//! A minimal HTTP CONNECT proxy on loopback, counting the tunnels it opens: enough to show that
//! a client honours `HTTPS_PROXY`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

pub struct ConnectProxy {
    pub port: u16,
    tunnels: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ConnectProxy {
    /// Starts the proxy on the current tokio runtime.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let tunnels = Arc::new(AtomicUsize::new(0));
        let counted = tunnels.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let _ = tunnel(client, &counted).await;
                });
            }
        });
        Self { port, tunnels, task }
    }

    /// How many tunnels it opened.
    pub fn tunnels(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tunnel(client: TcpStream, counted: &AtomicUsize) -> std::io::Result<()> {
    let mut client = BufReader::new(client);
    let mut request = String::new();
    client.read_line(&mut request).await?;
    let target =
        request.strip_prefix("CONNECT ").and_then(|rest| rest.split_whitespace().next()).unwrap_or("").to_string();
    loop {
        let mut header = String::new();
        if client.read_line(&mut header).await? == 0 || header == "\r\n" {
            break;
        }
    }
    let mut upstream = TcpStream::connect(&target).await?;
    counted.fetch_add(1, Ordering::SeqCst);
    let mut client = client.into_inner();
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}
