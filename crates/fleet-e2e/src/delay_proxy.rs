//! A TCP proxy that delays what it carries, both ways, by a set latency plus a random jitter,
//! without reordering: what `netem` would do if the kernel had it. A machine reaches etcd
//! through one to see a slow, jittery network.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct DelayProxy {
    pub address: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Copies `from` to `to`, each chunk delivered `delay` ± `jitter` after it was read, in order.
async fn delayed_copy<R, W>(mut from: R, mut to: W, delay: Duration, jitter: Duration, seed: u64)
where
    R: AsyncReadExt + Unpin + Send + 'static,
    W: AsyncWriteExt + Unpin + Send + 'static,
{
    let (sender, mut receiver) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = receiver.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut random = fleet_testkit::Seeded::new(seed);
    let mut last_due = Instant::now();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                let wobble = random.duration(Duration::ZERO, jitter * 2);
                let due = (Instant::now() + delay.saturating_sub(jitter) + wobble).max(last_due);
                last_due = due;
                if sender.send((due, buffer[..read].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(sender);
    let _ = writer.await;
}

impl DelayProxy {
    /// Listens on `listen_ip` (a free port) and forwards every connection to `target`.
    pub fn start(listen_ip: &str, target: SocketAddr, delay: Duration, jitter: Duration) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        let listener = runtime
            .block_on(TcpListener::bind((listen_ip, 0)))
            .unwrap_or_else(|error| panic!("bind the proxy on {listen_ip}: {error}"));
        let address = listener.local_addr().expect("the proxy's address");
        runtime.spawn(async move {
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
            while let Ok((client, _)) = listener.accept().await {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let connection_seed = seed;
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = delayed_copy(client_read, server_write, delay, jitter, connection_seed);
                    let down = delayed_copy(server_read, client_write, delay, jitter, connection_seed.rotate_left(17));
                    tokio::join!(up, down);
                });
            }
        });
        Self { address, runtime: Some(runtime) }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
