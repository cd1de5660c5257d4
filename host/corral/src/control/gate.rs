//! What the admin API and `/metrics` hold against the network, before any
//! request is parsed: a cap on open connections (one more is closed at
//! once), a deadline on connections that send nothing, and an accept loop
//! that backs off when accepting fails (out of file descriptors, it would
//! otherwise spin on a core).
//!
//! A listener that authenticates (the admin API) keeps connections that
//! have not yet made an authenticated call apart from those that have:
//! - each must authenticate within a deadline, whatever else it sends
//!   (answering the host's keepalive pings keeps a connection from being
//!   idle, not from being a stranger), or it is closed;
//! - they have slots of their own, and when those are full a new one takes
//!   the slot of the oldest: a flood of strangers can delay an operator's
//!   connection by at most one handshake, never shut it out;
//! - a connection that authenticates moves to the authenticated slots,
//!   where each tenant may hold only its share and a few are kept for the
//!   operator: a tenant's token cannot fill them either.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use corral_core::backoff::Backoff;
use corral_core::sync::lock;

/// The first wait after a failed accept; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Limits of one listener.
#[derive(Debug, Clone, Copy)]
pub struct GateLimits {
    /// Connections open at once (authenticated ones, where the listener
    /// authenticates).
    pub connections: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle: Duration,
    /// Where calls authenticate: connections that have not yet, their
    /// slots and their deadline.
    pub strangers: Option<Strangers>,
}

/// Connections that have made no authenticated call yet, and how the
/// authenticated slots are shared.
#[derive(Debug, Clone, Copy)]
pub struct Strangers {
    /// Open at once; a new one closes the oldest.
    pub slots: usize,
    /// Closed if no call on it has authenticated by then.
    pub deadline: Duration,
    /// Authenticated connections one tenant may hold.
    pub per_tenant: usize,
    /// Authenticated slots only the operator may take.
    pub operator_reserve: usize,
}

/// Who a connection's calls authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Tenant(String),
}

/// One connection's standing, shared with the calls made on it.
#[derive(Debug, Default)]
struct Standing {
    authenticated: AtomicBool,
    caller: Mutex<Option<Caller>>,
    evicted: AtomicBool,
    /// The reader to wake when the connection is evicted.
    waker: Mutex<Option<Waker>>,
}

/// The authenticated slots: shared by tenants (each up to its share), and
/// a reserve for the operator.
struct Shares {
    shared: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    held: Mutex<std::collections::HashMap<String, usize>>,
    per_tenant: usize,
}

/// An authenticated connection's slot; gives its tenant's share back when
/// dropped.
struct Share {
    _permit: OwnedSemaphorePermit,
    tenant: Option<(Arc<Shares>, String)>,
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some((shares, tenant)) = &self.tenant {
            let mut held = lock(&shares.held);
            if let Some(n) = held.get_mut(tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.remove(tenant);
                }
            }
        }
    }
}

impl Shares {
    /// A slot for `caller`, or why not.
    fn take(self: &Arc<Self>, caller: &Caller) -> Result<Share, NoShare> {
        match caller {
            Caller::Operator => {
                let permit = self
                    .shared
                    .clone()
                    .try_acquire_owned()
                    .or_else(|_| self.reserve.clone().try_acquire_owned())
                    .map_err(|_| NoShare::Full)?;
                Ok(Share {
                    _permit: permit,
                    tenant: None,
                })
            }
            Caller::Tenant(name) => {
                let mut held = lock(&self.held);
                let n = held.entry(name.clone()).or_insert(0);
                if *n >= self.per_tenant {
                    return Err(NoShare::Tenant {
                        tenant: name.clone(),
                        held: self.per_tenant,
                    });
                }
                let permit = self
                    .shared
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| NoShare::TenantsFull)?;
                *n += 1;
                Ok(Share {
                    _permit: permit,
                    tenant: Some((self.clone(), name.clone())),
                })
            }
        }
    }
}

/// Why an authenticated connection gets no slot.
#[derive(Debug, thiserror::Error)]
enum NoShare {
    #[error("every authenticated slot is taken")]
    Full,
    #[error("every authenticated slot tenants may take is taken")]
    TenantsFull,
    #[error("tenant `{tenant}` already holds its {held} admin connections")]
    Tenant { tenant: String, held: usize },
}

impl Standing {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }
}

/// What a call learns of its connection (from the request's extensions):
/// the peer, and a way to mark the connection authenticated.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub peer: Option<SocketAddr>,
    standing: Arc<Standing>,
}

impl ConnectionInfo {
    /// A call on this connection authenticated as `caller`: it is no
    /// stranger now (the first caller is the one it counts for).
    pub fn authenticated(&self, caller: Caller) {
        lock(&self.standing.caller).get_or_insert(caller);
        self.standing.authenticated.store(true, Ordering::Release);
    }
}

/// A listener that admits at most [`GateLimits::connections`] at once.
pub struct Gate {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    /// Authenticated slots, where the listener authenticates.
    shares: Option<Arc<Shares>>,
    /// Strangers, oldest first.
    strangers: Arc<Mutex<VecDeque<Arc<Standing>>>>,
    limits: GateLimits,
    /// For log lines: `admin API`, `metrics endpoint`.
    name: &'static str,
}

impl Gate {
    pub fn new(listener: TcpListener, limits: GateLimits, name: &'static str) -> Self {
        let shares = limits.strangers.map(|s| {
            let reserve = s.operator_reserve.min(limits.connections);
            Arc::new(Shares {
                shared: Arc::new(Semaphore::new(limits.connections - reserve)),
                reserve: Arc::new(Semaphore::new(reserve)),
                held: Mutex::default(),
                per_tenant: s.per_tenant,
            })
        });
        Gate {
            listener,
            slots: Arc::new(Semaphore::new(limits.connections)),
            shares,
            strangers: Arc::default(),
            limits,
            name,
        }
    }

    /// The next connection within the caps. Connections over them are
    /// closed as they arrive (or, for strangers, the oldest stranger is);
    /// accept errors are waited out with backoff.
    pub async fn accept(&self) -> Guarded {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    backoff.reset();
                    if let (Some(strangers), Some(shares)) = (self.limits.strangers, &self.shares) {
                        return self.admit_stranger(stream, strangers, shares.clone());
                    }
                    match self.slots.clone().try_acquire_owned() {
                        Ok(permit) => {
                            return Guarded::new(
                                stream,
                                Slot::Held { _permit: permit },
                                self.limits.idle,
                                None,
                            );
                        }
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

    fn admit_stranger(
        &self,
        stream: TcpStream,
        strangers: Strangers,
        shares: Arc<Shares>,
    ) -> Guarded {
        let standing = Arc::new(Standing::default());
        let mut queue = lock(&self.strangers);
        queue.retain(|s| {
            !s.evicted.load(Ordering::Acquire) && !s.authenticated.load(Ordering::Acquire)
        });
        while queue.len() >= strangers.slots {
            if let Some(oldest) = queue.pop_front() {
                oldest.evict();
            }
        }
        queue.push_back(standing.clone());
        drop(queue);
        let stranger = Stranger {
            standing,
            deadline: Box::pin(tokio::time::sleep(strangers.deadline)),
            within: strangers.deadline,
            shares,
            queue: self.strangers.clone(),
        };
        Guarded::new(stream, Slot::Pending, self.limits.idle, Some(stranger))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// The slot a connection holds.
enum Slot {
    /// A stranger's: its place in the strangers' queue.
    Pending,
    Held {
        _permit: OwnedSemaphorePermit,
    },
    /// An authenticated connection's, in its caller's share.
    Shared {
        _share: Share,
    },
}

/// What a connection that has not authenticated yet carries.
struct Stranger {
    standing: Arc<Standing>,
    deadline: Pin<Box<Sleep>>,
    within: Duration,
    shares: Arc<Shares>,
    queue: Arc<Mutex<VecDeque<Arc<Standing>>>>,
}

/// An admitted connection: holds its slot until dropped, and fails its
/// reads once the peer has sent nothing for the idle limit (or, a stranger,
/// once it was evicted or its deadline passed unauthenticated).
pub struct Guarded {
    stream: TcpStream,
    slot: Slot,
    idle: Duration,
    silence: Pin<Box<Sleep>>,
    stranger: Option<Stranger>,
    standing: Arc<Standing>,
}

impl Guarded {
    fn new(stream: TcpStream, slot: Slot, idle: Duration, stranger: Option<Stranger>) -> Self {
        let standing = stranger
            .as_ref()
            .map_or_else(Arc::default, |s| s.standing.clone());
        Guarded {
            stream,
            slot,
            idle,
            silence: Box::pin(tokio::time::sleep(idle)),
            stranger,
            standing,
        }
    }

    /// For a stranger: closed (evicted, or unauthenticated past its
    /// deadline), promoted (authenticated: it takes an authenticated slot
    /// and leaves the strangers'), or still waiting.
    fn check_standing(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        let Some(stranger) = &mut self.stranger else {
            return Ok(());
        };
        let standing = &stranger.standing;
        if standing.evicted.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room: too many connections had not authenticated",
            ));
        }
        if standing.authenticated.load(Ordering::Acquire) {
            let caller = lock(&standing.caller).clone().unwrap_or(Caller::Operator);
            let share = stranger
                .shares
                .take(&caller)
                .map_err(|why| io::Error::new(io::ErrorKind::ConnectionRefused, why))?;
            lock(&stranger.queue).retain(|s| !Arc::ptr_eq(s, standing));
            self.slot = Slot::Shared { _share: share };
            self.stranger = None;
            return Ok(());
        }
        if stranger.deadline.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no call authenticated within {:?}", stranger.within),
            ));
        }
        *lock(&standing.waker) = Some(cx.waker().clone());
        Ok(())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(stranger) = &self.stranger {
            lock(&stranger.queue).retain(|s| !Arc::ptr_eq(s, &stranger.standing));
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
        let read = self.checked(cx, "the peer sent nothing", |stream, cx| {
            stream.poll_read(cx, buf)
        });
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let next = Instant::now() + self.idle;
            self.silence.as_mut().reset(next);
        }
        read
    }
}

impl Guarded {
    /// A read, write or flush, held to the connection's checks: its
    /// standing (deadline, eviction) first, and its silence while the
    /// operation waits (`idle` with nothing read), which ends it as
    /// `waiting` for so long. Writes are held to them too: a peer that
    /// stops reading while it sends (PINGs, say) blocks the host's writes,
    /// and the HTTP/2 server reads nothing while its writes wait, so checks
    /// on reads alone would never run again, and a stranger would outlive
    /// its deadline (and, evicted, its slot) for as long as the peer liked.
    fn checked<T>(
        &mut self,
        cx: &mut Context<'_>,
        waiting: &str,
        operation: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Err(e) = self.check_standing(cx) {
            return Poll::Ready(Err(e));
        }
        match operation(Pin::new(&mut self.stream), cx) {
            Poll::Pending => match self.silence.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{waiting} for {:?}", self.idle),
                ))),
                Poll::Pending => Poll::Pending,
            },
            done => done,
        }
    }

    /// [`Guarded::checked`] for a write or flush.
    fn checked_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        self.checked(
            cx,
            "the peer sent nothing the host read, nor took what it wrote,",
            write,
        )
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.checked_write(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.checked_write(cx, |stream, cx| stream.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.checked_write(cx, |stream, cx| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for Guarded {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo {
            peer: self.stream.peer_addr().ok(),
            standing: self.standing.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
