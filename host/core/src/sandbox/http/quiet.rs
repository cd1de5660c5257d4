//! The between-bytes timeout of a response's body, kept where the
//! connection's socket is read.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The connection's socket, failing a read when the connection has been
/// quiet for longer than the guest's between-bytes timeout once the
/// response's head is in. The timer lives in the connection's task, where
/// the socket is read, and is looked at only after a read found nothing:
/// bytes that reached the socket in time are read first, however late that
/// task is next polled (a busy host), where a timer beside the guest's
/// reader could fire before the connection's task had read them.
///
/// Quiet means no bytes either way: bytes on the wire count, the body's
/// framing and TLS records included, and so do the guest's own request
/// bytes, which a server that answers early may be waiting for.
pub(crate) struct Quiet<S> {
    inner: S,
    timeout: Duration,
    /// Set once the response's head is in.
    watching: Arc<AtomicBool>,
    /// Armed by the first read that found nothing since the last bytes
    /// either way.
    quiet_since: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The error a [`Quiet`] read fails with, told apart from others in the
/// response body's error by its type.
#[derive(Debug, thiserror::Error)]
#[error("the server sent nothing within the between-bytes timeout")]
struct BetweenBytes;

impl<S> Quiet<S> {
    pub(crate) fn new(inner: S, timeout: Duration, watching: Arc<AtomicBool>) -> Self {
        Quiet {
            inner,
            timeout,
            watching,
            quiet_since: None,
        }
    }

    /// Bytes sent are not quiet.
    fn wrote(&mut self, written: &std::io::Result<usize>) {
        if written.as_ref().is_ok_and(|&n| n > 0) {
            self.quiet_since = None;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Quiet<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(read) => {
                if buf.filled().len() > before {
                    this.quiet_since = None;
                }
                Poll::Ready(read)
            }
            Poll::Pending if !this.watching.load(Ordering::Acquire) => Poll::Pending,
            Poll::Pending => {
                let timeout = this.timeout;
                let quiet = this
                    .quiet_since
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(quiet.as_mut().poll(cx));
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    BetweenBytes,
                )))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Quiet<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write(cx, buf));
        self.wrote(&written);
        Poll::Ready(written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs));
        self.wrote(&written);
        Poll::Ready(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Whether `error` is, or was caused by, a [`Quiet`] read's timeout.
pub(crate) fn is_between_bytes(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut link = Some(error);
    while let Some(error) = link {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<BetweenBytes>())
        {
            return true;
        }
        link = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use tokio::io::AsyncReadExt as _;

    use super::*;

    /// A loopback connection: the `Quiet` end under test and the server's.
    async fn pair(
        watching: bool,
        timeout: Duration,
    ) -> (Quiet<tokio::net::TcpStream>, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().unwrap();
        (
            Quiet::new(client, timeout, Arc::new(AtomicBool::new(watching))),
            server,
        )
    }

    /// Runs `test` on a runtime of its own, its clock paused if `paused`
    /// (time then moves only when every task waits).
    fn on_a_runtime(paused: bool, test: impl Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(paused)
            .build()
            .unwrap()
            .block_on(test);
    }

    /// One read, at once: what it read, or `Pending` (the timer then armed
    /// if it was not).
    fn read_now(quiet: &mut Quiet<tokio::net::TcpStream>) -> Poll<std::io::Result<usize>> {
        let mut buf = [0u8; 8];
        let mut read = ReadBuf::new(&mut buf);
        let waker = std::task::Waker::noop();
        let polled = Pin::new(quiet).poll_read(&mut Context::from_waker(waker), &mut read);
        polled.map(|r| r.map(|()| read.filled().len()))
    }

    /// Bytes that reached the socket before the timer ran out are read, even
    /// when the reader is next polled only after it ran out (a busy host):
    /// the socket is read before the timer is looked at. After them the
    /// timer starts again, and a server quiet for longer fails the read.
    #[test]
    fn bytes_in_the_socket_beat_a_timer_that_ran_out_meanwhile_and_quiet_fails() {
        on_a_runtime(false, async {
            let timeout = Duration::from_millis(200);
            let (mut quiet, mut server) = pair(true, timeout).await;
            // A read that finds nothing starts the timer.
            let first = read_now(&mut quiet);
            assert!(first.is_pending(), "nothing was sent yet: {first:?}");
            server.write_all(b"ok").unwrap();
            // The thread is held past the timer with the bytes in the socket.
            std::thread::sleep(timeout * 2);
            let mut buf = [0u8; 8];
            let n = quiet
                .read(&mut buf)
                .await
                .expect("the bytes came before the timer ran out");
            assert_eq!(&buf[..n], b"ok");
            let quiet_error = quiet.read(&mut buf).await.unwrap_err();
            assert!(is_between_bytes(&quiet_error), "{quiet_error:?}");
        });
    }

    /// A request still going out (to a server that answered early and
    /// waits for the rest) is not a quiet connection; once it stops, the
    /// timer runs.
    #[test]
    fn bytes_sent_keep_the_timer_off_and_it_runs_once_they_stop() {
        on_a_runtime(true, async {
            let timeout = Duration::from_millis(100);
            let (mut quiet, _server) = pair(true, timeout).await;
            assert!(read_now(&mut quiet).is_pending());
            for _ in 0..10 {
                tokio::time::advance(timeout / 2).await;
                let written = std::future::poll_fn(|cx| Pin::new(&mut quiet).poll_write(cx, b"x"))
                    .await
                    .unwrap();
                assert_eq!(written, 1);
                let read = read_now(&mut quiet);
                assert!(read.is_pending(), "quiet while sending: {read:?}");
            }
            let mut buf = [0u8; 8];
            let error = quiet.read(&mut buf).await.unwrap_err();
            assert!(is_between_bytes(&error), "{error:?}");
        });
    }

    /// Before the response's head is in, the first-byte timer is the one
    /// that counts: a read waits however long the server takes.
    #[test]
    fn the_timer_is_off_until_the_body_begins() {
        on_a_runtime(true, async {
            let timeout = Duration::from_millis(10);
            let (mut quiet, _server) = pair(false, timeout).await;
            let mut buf = [0u8; 8];
            let waited = tokio::time::timeout(timeout * 100, quiet.read(&mut buf)).await;
            assert!(waited.is_err(), "the read ended: {waited:?}");
        });
    }
}
