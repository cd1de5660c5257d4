//! Guest stdout/stderr: split into lines, tagged with tenant, activity type
//! and activity id, sent to `tracing` and the task's observer. Each task has
//! one byte budget for both streams and its `log` lines, each line costing
//! its bytes plus [`LINE_COST`]; what exceeds it is dropped and counted,
//! never buffered, so a log flood costs the host nothing but the count.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use super::observer::{Stream, TaskObserver};
use super::secrets::{Cut, Secrets};
use super::task_id::TaskLabels;
use crate::shown::Escaped;
use crate::sync::lock;

/// Longest line kept whole; longer lines (and `log` messages) are split.
pub(crate) const MAX_LINE: usize = 4096;
/// How much of stderr's end is kept to explain a panic.
const STDERR_TAIL: usize = 2048;
/// What every line costs the budget besides its bytes: the host writes each
/// as a log event with the task's labels, so an empty line is not free (4 MiB
/// of newlines were 10 MiB of host log when lines cost only their bytes).
pub(crate) const LINE_COST: usize = 64;

/// The budget and bookkeeping shared by both streams of one task.
pub(crate) struct Capture {
    labels: Arc<TaskLabels>,
    observer: Arc<dyn TaskObserver>,
    /// Redacted from every line.
    secrets: Arc<Secrets>,
    budget: usize,
    dropped: u64,
    lines: [Vec<u8>; 2],
    stderr_tail: VecDeque<u8>,
    /// Whether stderr's start has left the tail.
    stderr_cut: bool,
    /// Streams of this capture the guest holds (`get-stdout`,
    /// `get-stderr`): a warm instance may keep these, and only these.
    open_streams: usize,
}

impl Capture {
    pub(crate) fn new(
        labels: Arc<TaskLabels>,
        observer: Arc<dyn TaskObserver>,
        secrets: Arc<Secrets>,
        budget: usize,
    ) -> Arc<Mutex<Capture>> {
        Arc::new(Mutex::new(Capture {
            labels,
            observer,
            secrets,
            budget,
            dropped: 0,
            lines: [Vec::new(), Vec::new()],
            stderr_tail: VecDeque::new(),
            stderr_cut: false,
            open_streams: 0,
        }))
    }

    /// Starts over for the next task of a warm instance: the streams its
    /// guest kept write here, now under this task's labels, observer and
    /// budget.
    pub(crate) fn restart(
        &mut self,
        labels: Arc<TaskLabels>,
        observer: Arc<dyn TaskObserver>,
        budget: usize,
    ) {
        self.labels = labels;
        self.observer = observer;
        self.budget = budget;
        self.dropped = 0;
        self.lines.iter_mut().for_each(Vec::clear);
        self.stderr_tail.clear();
        self.stderr_cut = false;
    }

    /// Whether the task wrote more than its budget (the excess was dropped).
    pub(crate) fn overflowed(&self) -> bool {
        self.dropped > 0
    }

    /// The output streams of this capture the guest holds now.
    pub(crate) fn open_streams(&self) -> usize {
        self.open_streams
    }

    fn write(&mut self, stream: Stream, mut bytes: &[u8]) {
        // A line is cut where it grows past MAX_LINE, keeping back what may
        // be the start of a secret's value (see `split_line`).
        let hold = self.secrets.hold();
        if stream == Stream::Stderr {
            let kept = STDERR_TAIL + hold;
            let end = &bytes[bytes.len().saturating_sub(kept)..];
            self.stderr_tail.extend(end);
            let excess = self.stderr_tail.len().saturating_sub(kept);
            self.stderr_cut |= excess > 0 || end.len() < bytes.len();
            self.stderr_tail.drain(..excess);
        }
        let longest = MAX_LINE + hold;
        while !bytes.is_empty() {
            if self.budget < LINE_COST {
                // Not even an empty line fits any more: count the rest at once.
                self.dropped += bytes.len() as u64;
                return;
            }
            let line = &mut self.lines[stream as usize];
            let take = bytes.len().min(longest - line.len());
            match bytes[..take].iter().position(|&b| b == b'\n') {
                Some(end) => {
                    line.extend_from_slice(&bytes[..end]);
                    bytes = &bytes[end + 1..];
                    self.end_line(stream, 1);
                }
                None => {
                    line.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if line.len() >= longest {
                        self.split_line(stream, hold);
                    }
                }
            }
        }
    }

    /// Emits the first part of a stream's over-long pending line. Values
    /// are redacted first, then the line is cut `hold` bytes before its
    /// end: whatever is left there could be the start of a value whose rest
    /// is still to come, so it starts the next piece and is found there.
    fn split_line(&mut self, stream: Stream, hold: usize) {
        let index = stream as usize;
        if hold > 0 {
            self.secrets.redact_bytes(&mut self.lines[index]);
        }
        let cut = self.lines[index].len().saturating_sub(hold);
        if cut == 0 {
            return;
        }
        if self.admit(cut) {
            let piece = String::from_utf8_lossy(&self.lines[index][..cut]).into_owned();
            self.emit(stream, &piece);
        } else {
            self.budget = 0;
        }
        self.lines[index].drain(..cut);
    }

    /// Emits the stream's pending line if the budget covers it and its
    /// cost; otherwise drops it (with its `terminator` bytes) and closes the
    /// budget, so output after a dropped line is dropped too.
    fn end_line(&mut self, stream: Stream, terminator: usize) {
        let index = stream as usize;
        if self.admit(self.lines[index].len()) {
            self.emit(stream, &String::from_utf8_lossy(&self.lines[index]));
        } else {
            self.budget = 0;
            self.dropped += terminator as u64;
        }
        // Cleared, not replaced: the buffer serves the stream's next line.
        self.lines[index].clear();
    }

    fn emit(&self, stream: Stream, line: &str) {
        let line = self.secrets.redact(line);
        let TaskLabels {
            tenant,
            activity_type,
            activity_id,
        } = &*self.labels;
        // Escaped: a guest's control characters cannot forge a host log line.
        tracing::info!(target: "corral::guest", %tenant, %activity_type, %activity_id, %stream, "{}", Escaped(&line));
        self.observer.output(stream, &line);
    }

    /// Emits unterminated lines and reports dropped output. Called once when
    /// the task ends.
    pub(crate) fn finish(&mut self) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if !self.lines[stream as usize].is_empty() {
                self.end_line(stream, 0);
            }
        }
        if self.dropped > 0 {
            let TaskLabels {
                tenant,
                activity_type,
                activity_id,
            } = &*self.labels;
            tracing::warn!(
                target: "corral::guest", %tenant, %activity_type, %activity_id,
                dropped_bytes = self.dropped,
                "guest output over its budget: {} bytes dropped", self.dropped
            );
            self.observer.output_dropped(self.dropped);
        }
    }

    /// Takes a line of `len` bytes (a log message, or a line of output) from
    /// the budget, with its [`LINE_COST`]; `false` (and the bytes counted as
    /// dropped) when the budget cannot cover it.
    pub(crate) fn admit(&mut self, len: usize) -> bool {
        let cost = len.saturating_add(LINE_COST);
        if cost <= self.budget {
            self.budget -= cost;
            true
        } else {
            self.dropped += len as u64;
            false
        }
    }

    /// The last lines the guest wrote to stderr (a panic message, typically),
    /// its secrets' values redacted. When stderr's start was cut off, the
    /// first bytes kept could be the end of a value whose start is gone:
    /// they are left out, after the whole values were redacted (a value
    /// that began inside them would otherwise leave its end).
    pub(crate) fn stderr_tail(&self) -> String {
        let mut bytes: Vec<u8> = self.stderr_tail.iter().copied().collect();
        let cut = Cut {
            start: self.stderr_cut,
            end: false,
        };
        self.secrets.redact_cut(&mut bytes, cut);
        String::from_utf8_lossy(&bytes).trim_end().to_owned()
    }
}

/// One of a task's two output streams, as WASI sees it.
#[derive(Clone)]
pub(crate) struct GuestOutput {
    stream: Stream,
    capture: Arc<Mutex<Capture>>,
}

impl GuestOutput {
    pub(crate) fn new(stream: Stream, capture: &Arc<Mutex<Capture>>) -> Self {
        GuestOutput {
            stream,
            capture: capture.clone(),
        }
    }

    fn write_all(&self, bytes: &[u8]) {
        lock(&self.capture).write(self.stream, bytes);
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(OpenStream::new(self.clone()))
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_all(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    /// Always ready: what exceeds the budget is dropped, not pushed back on
    /// the guest.
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

/// A stream the guest holds, counted while it does (see
/// [`Capture::open_streams`]).
struct OpenStream(GuestOutput);

impl OpenStream {
    fn new(output: GuestOutput) -> Self {
        lock(&output.capture).open_streams += 1;
        OpenStream(output)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut capture = lock(&self.0.capture);
        capture.open_streams = capture.open_streams.saturating_sub(1);
    }
}

#[async_trait::async_trait]
impl OutputStream for OpenStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.0.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.0.check_write()
    }
}

#[async_trait::async_trait]
impl Pollable for OpenStream {
    async fn ready(&mut self) {}
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.write_all(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Lines(Mutex<Vec<(Stream, String)>>, Mutex<u64>);

    impl TaskObserver for Lines {
        fn output(&self, stream: Stream, line: &str) {
            self.0.lock().unwrap().push((stream, line.to_owned()));
        }

        fn output_dropped(&self, bytes: u64) {
            *self.1.lock().unwrap() += bytes;
        }
    }

    #[test]
    fn lines_are_split_budgeted_and_the_excess_counted() {
        let lines = Arc::new(Lines::default());
        // Room for three lines of five, four and five bytes.
        let budget = 3 * LINE_COST + 14;
        let capture = Capture::new(Arc::default(), lines.clone(), Arc::default(), budget);
        let out = GuestOutput::new(Stream::Stdout, &capture);
        let err = GuestOutput::new(Stream::Stderr, &capture);
        out.write_all(b"hello\nwor");
        err.write_all(b"oops\n");
        out.write_all(b"ld\nthis is dropped\n");
        lock(&capture).finish();
        let seen = lines.0.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                (Stream::Stdout, "hello".to_owned()),
                (Stream::Stderr, "oops".to_owned()),
                (Stream::Stdout, "world".to_owned()),
            ]
        );
        assert_eq!(*lines.1.lock().unwrap(), 16);
        assert_eq!(lock(&capture).stderr_tail(), "oops");
    }

    #[test]
    fn empty_lines_cost_their_overhead() {
        let lines = Arc::new(Lines::default());
        let capture = Capture::new(
            Arc::default(),
            lines.clone(),
            Arc::default(),
            10 * LINE_COST,
        );
        let out = GuestOutput::new(Stream::Stdout, &capture);
        out.write_all(&vec![b'\n'; 1 << 20]);
        lock(&capture).finish();
        assert_eq!(lines.0.lock().unwrap().len(), 10);
        assert_eq!(*lines.1.lock().unwrap(), (1 << 20) - 10);
    }

    #[test]
    fn long_lines_are_split_at_the_line_limit() {
        let lines = Arc::new(Lines::default());
        let capture = Capture::new(Arc::default(), lines.clone(), Arc::default(), 1 << 20);
        let out = GuestOutput::new(Stream::Stdout, &capture);
        out.write_all(&vec![b'x'; MAX_LINE * 2 + 1]);
        lock(&capture).finish();
        let seen: Vec<usize> = lines
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.len())
            .collect();
        assert_eq!(seen, vec![MAX_LINE, MAX_LINE, 1]);
    }

    fn one_secret(dir: &tempfile::TempDir, value: &str) -> Arc<Secrets> {
        use super::super::secrets::{SecretSource, SecretSpec};
        let path = dir.path().join("key");
        std::fs::write(&path, value).unwrap();
        Arc::new(
            Secrets::load(vec![SecretSpec {
                name: "KEY".into(),
                source: SecretSource::File(path),
                hosts: vec!["a.example".parse().unwrap()],
                in_query: false,
            }])
            .unwrap(),
        )
    }

    #[test]
    fn a_secret_split_by_the_line_limit_or_the_write_is_still_redacted() {
        const VALUE: &str = "sk_live_0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let secrets = one_secret(&dir, VALUE);
        // At every offset around the cut, in writes split anywhere.
        for offset in MAX_LINE - VALUE.len()..MAX_LINE + VALUE.len() {
            let lines = Arc::new(Lines::default());
            let capture = Capture::new(Arc::default(), lines.clone(), secrets.clone(), 1 << 20);
            let out = GuestOutput::new(Stream::Stdout, &capture);
            let mut text = vec![b'x'; offset];
            text.extend_from_slice(VALUE.as_bytes());
            text.extend_from_slice(&[b'y'; 3 * MAX_LINE]);
            let (a, b) = text.split_at(offset + 5);
            out.write_all(a);
            out.write_all(b);
            lock(&capture).finish();
            let seen: String = lines
                .0
                .lock()
                .unwrap()
                .iter()
                .map(|(_, l)| l.as_str())
                .collect();
            assert!(!seen.contains("sk_live_0"), "offset {offset}");
            assert!(!seen.contains("789abcdef"), "offset {offset}");
            assert_eq!(seen.matches("[secret KEY]").count(), 1, "offset {offset}");
            let longest = lines.0.lock().unwrap().iter().map(|(_, l)| l.len()).max();
            assert!(
                longest <= Some(MAX_LINE + secrets.hold()),
                "offset {offset}"
            );
        }
    }

    #[test]
    fn the_stderr_tail_never_quotes_part_of_a_secret() {
        const VALUE: &str = "sk_live_0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let secrets = one_secret(&dir, VALUE);
        let hold = secrets.hold();
        let kept = STDERR_TAIL + hold;
        let percent: String = VALUE.bytes().map(|b| format!("%{b:02X}")).collect();
        // The value as itself and percent-encoded (three times as long),
        // starting anywhere from before the tail's first byte to past the
        // bytes a cut start drops: straddling where the tail starts, and
        // whole inside the tail but reaching past the dropped bytes (where
        // dropping before redacting left its end in clear).
        for spelled in [VALUE.to_owned(), percent] {
            let before = hold + spelled.len();
            for start in 0..=before + spelled.len() {
                let capture = Capture::new(
                    Arc::default(),
                    Arc::new(Lines::default()),
                    secrets.clone(),
                    1 << 20,
                );
                let err = GuestOutput::new(Stream::Stderr, &capture);
                // The tail begins `start` bytes in, the value `before`.
                err.write_all(&vec![b'x'; before]);
                err.write_all(spelled.as_bytes());
                err.write_all(&vec![b'y'; kept - spelled.len() - before + start]);
                let tail = lock(&capture).stderr_tail();
                for piece in spelled.as_bytes().windows(4) {
                    let piece = std::str::from_utf8(piece).unwrap();
                    assert!(!tail.contains(piece), "{spelled} at {start}: {tail}");
                }
                assert!(tail.len() <= kept, "at {start}");
            }
        }
        // Whole in the tail: redacted, not dropped.
        let capture = Capture::new(Arc::default(), Arc::new(Lines::default()), secrets, 1 << 20);
        let err = GuestOutput::new(Stream::Stderr, &capture);
        err.write_all(format!("panicked: {VALUE}\n").as_bytes());
        assert_eq!(lock(&capture).stderr_tail(), "panicked: [secret KEY]");
    }
}
