//! What the admin API and `/metrics` hold against the network, before any
//! request is parsed: a cap on open connections (one more is closed at
//! once), a deadline on connections that send nothing, and an accept loop
//! that backs off when accepting fails (out of file descriptors, it would
//! otherwise spin on a core).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::backoff::Backoff;

/// The first wait after a failed accept; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Limits of one listener.
#[derive(Debug, Clone, Copy)]
pub struct GateLimits {
    /// Connections open at once.
    pub connections: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle: Duration,
}

/// A listener that admits at most [`GateLimits::connections`] at once.
pub struct Gate {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    limits: GateLimits,
    /// For log lines: `admin API`, `metrics endpoint`.
    name: &'static str,
}

impl Gate {
    pub fn new(listener: TcpListener, limits: GateLimits, name: &'static str) -> Self {
        Gate {
            listener,
            slots: Arc::new(Semaphore::new(limits.connections)),
            limits,
            name,
        }
    }

    /// The next connection within the cap. Connections over it are closed
    /// as they arrive; accept errors are waited out with backoff.
    pub async fn accept(&self) -> Guarded {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    backoff.reset();
                    match self.slots.clone().try_acquire_owned() {
                        Ok(permit) => return Guarded::new(stream, permit, self.limits.idle),
                        Err(_) => tracing::warn!(
                            %peer,
                            "{}: connection closed: {} connections are already open",
                            self.name,
                            self.limits.connections
                        ),
                    }
                }
                Err(e) => {
                    let wait = backoff.upcoming();
                    tracing::warn!("{}: accept failed: {e}; retrying in {wait:?}", self.name);
                    backoff.wait().await;
                }
            }
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An admitted connection: holds its slot until dropped, and fails its
/// reads once the peer has sent nothing for the idle limit.
pub struct Guarded {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    idle: Duration,
    silence: Pin<Box<Sleep>>,
}

impl Guarded {
    fn new(stream: TcpStream, slot: OwnedSemaphorePermit, idle: Duration) -> Self {
        Guarded {
            stream,
            _slot: slot,
            idle,
            silence: Box::pin(tokio::time::sleep(idle)),
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.idle;
                    self.silence.as_mut().reset(next);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.silence.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer sent nothing for {:?}", self.idle),
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn gate(limits: GateLimits) -> (Gate, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gate = Gate::new(listener, limits, "test");
        let address = gate.local_addr().unwrap();
        (gate, address)
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_and_a_freed_slot_is_reused() {
        let limits = GateLimits {
            connections: 1,
            idle: Duration::from_secs(60),
        };
        let (gate, address) = gate(limits).await;
        let _first = TcpStream::connect(address).await.unwrap();
        let held = gate.accept().await;
        let accepting = tokio::spawn(async move { gate.accept().await.stream.peer_addr() });
        // Over the cap: closed as it arrives (its read sees the end).
        let mut second = TcpStream::connect(address).await.unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(second.read(&mut byte).await.unwrap(), 0);
        // A freed slot admits the next one.
        drop(held);
        let third = TcpStream::connect(address).await.unwrap();
        let admitted = accepting.await.unwrap().unwrap();
        assert_eq!(admitted, third.local_addr().unwrap());
    }

    #[tokio::test]
    async fn a_silent_connection_fails_its_read_after_the_idle_limit() {
        let limits = GateLimits {
            connections: 4,
            idle: Duration::from_millis(100),
        };
        let (gate, address) = gate(limits).await;
        let _client = TcpStream::connect(address).await.unwrap();
        let mut conn = gate.accept().await;
        let mut buf = [0u8; 8];
        let e = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
