//! Metering: every body byte a task's requests and responses move is
//! charged to one budget (`limits.max_http_bytes`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::WasiBody;

/// What is left of one task's HTTP body bytes, shared by all its requests
/// and responses.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    limit: u64,
    left: AtomicU64,
}

impl ByteBudget {
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(ByteBudget {
            limit,
            left: AtomicU64::new(limit),
        })
    }

    /// Takes `n` bytes; false (taking nothing) when fewer are left.
    pub(crate) fn take(&self, n: u64) -> bool {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Direction {
    Request,
    Response,
}

/// A body whose data frames are charged to the task's byte budget as they
/// pass; the frame that would overdraw it ends the body with the size error
/// of its direction, which the guest sees as `HTTP-request-body-size` or
/// `HTTP-response-body-size` with the limit.
pub(crate) struct Metered {
    inner: WasiBody,
    budget: Arc<ByteBudget>,
    direction: Direction,
    failed: bool,
}

impl Metered {
    pub(crate) fn wrap(inner: WasiBody, budget: Arc<ByteBudget>, direction: Direction) -> WasiBody {
        Metered {
            inner,
            budget,
            direction,
            failed: false,
        }
        .boxed_unsync()
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let size = frame.data_ref().map_or(0, |data| data.len() as u64);
        if self.budget.take(size) {
            return Poll::Ready(Some(Ok(frame)));
        }
        self.failed = true;
        let limit = Some(self.budget.limit);
        tracing::debug!(limit, direction = ?self.direction, "outbound HTTP body cut off: the task moved its limit of bytes (limits.max_http_bytes)");
        Poll::Ready(Some(Err(match self.direction {
            Direction::Request => wasmtime_wasi_http::Error::HttpRequestBodySize(limit),
            Direction::Response => wasmtime_wasi_http::Error::HttpResponseBodySize(limit),
        })))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `chunks`, metered against `budget`; what it yields: the
    /// sizes of the data frames it passed, then the error that ended it.
    async fn drain(
        chunks: &[usize],
        budget: &Arc<ByteBudget>,
        direction: Direction,
    ) -> (Vec<usize>, Option<wasmtime_wasi_http::Error>) {
        let frames: Vec<Result<Frame<Bytes>, wasmtime_wasi_http::Error>> = chunks
            .iter()
            .map(|&n| Ok(Frame::data(Bytes::from(vec![0u8; n]))))
            .collect();
        let inner = http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed_unsync();
        let mut body = Metered::wrap(inner, budget.clone(), direction);
        let mut passed = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => passed.push(frame.into_data().map_or(0, |d| d.len())),
                Err(e) => return (passed, Some(e)),
            }
        }
        (passed, None)
    }

    #[tokio::test]
    async fn bodies_of_one_task_share_its_byte_budget_in_both_directions() {
        let budget = ByteBudget::new(100);
        let (passed, end) = drain(&[40, 30], &budget, Direction::Request).await;
        assert_eq!((passed, end.is_none()), (vec![40, 30], true));
        // 30 left: the response's second frame would overdraw it.
        let (passed, end) = drain(&[20, 20, 5], &budget, Direction::Response).await;
        assert_eq!(passed, vec![20]);
        assert!(
            matches!(
                end,
                Some(wasmtime_wasi_http::Error::HttpResponseBodySize(Some(100)))
            ),
            "{end:?}"
        );
        // What was refused was not taken: 10 bytes are still there.
        let (passed, end) = drain(&[10, 1], &budget, Direction::Request).await;
        assert_eq!(passed, vec![10]);
        assert!(
            matches!(
                end,
                Some(wasmtime_wasi_http::Error::HttpRequestBodySize(Some(100)))
            ),
            "{end:?}"
        );
    }
}
