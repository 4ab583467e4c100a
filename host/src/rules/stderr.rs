//! A rule's stderr and stdout: captured per call, logged at INFO with the rule's name, rate-limited.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Bytes kept per call; a rule that writes more has the rest dropped (and counted).
const CAPTURE_BYTES: usize = 4096;
/// Lines logged per window per rule instance; the rest are counted, not logged.
const LINES_PER_WINDOW: u32 = 20;
const WINDOW: Duration = Duration::from_secs(10);
/// Lines and bytes of a rule's output quoted in a fault's message.
const LAST_WORDS_LINES: usize = 3;
const LAST_WORDS_BYTES: usize = 400;

/// The sink a rule's output streams write into. Cloning shares the buffer.
#[derive(Clone, Default)]
pub struct CapturedOutput {
    buffer: Arc<Mutex<Captured>>,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
}

impl CapturedOutput {
    fn append(&self, data: &[u8]) {
        let mut captured = self.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = CAPTURE_BYTES.saturating_sub(captured.bytes.len());
        let kept = room.min(data.len());
        captured.bytes.extend_from_slice(&data[..kept]);
        captured.dropped += (data.len() - kept) as u64;
    }

    /// The last few lines written since the last take (a panic message, the end of a
    /// traceback), on one line, for a fault's WARN line; `None` if the rule wrote nothing.
    pub fn last_words(&self) -> Option<String> {
        let captured = self.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let text = String::from_utf8_lossy(&captured.bytes);
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE")).collect();
        let words = crate::health::untrusted_text(&lines[lines.len().saturating_sub(LAST_WORDS_LINES)..].join(" | "));
        if words.is_empty() {
            return None;
        }
        let cut = (0..=words.len().min(LAST_WORDS_BYTES)).rev().find(|&i| words.is_char_boundary(i)).unwrap_or(0);
        Some(if cut < words.len() { format!("{}…", &words[..cut]) } else { words })
    }

    /// Takes what was written since the last call: the bytes kept and how many were dropped.
    fn take(&self) -> (Vec<u8>, u64) {
        let mut captured = self.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (std::mem::take(&mut captured.bytes), std::mem::take(&mut captured.dropped))
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always writable: output beyond the capture is dropped rather than blocking the rule.
        Ok(CAPTURE_BYTES)
    }
}

impl AsyncWrite for CapturedOutput {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Logs captured output line by line, at most [`LINES_PER_WINDOW`] lines per window.
pub struct OutputLogger {
    window_start: Instant,
    lines_in_window: u32,
    /// Lines (or bytes past the capture) not logged because of the rate limit.
    pub suppressed: u64,
}

impl Default for OutputLogger {
    fn default() -> Self {
        OutputLogger { window_start: Instant::now(), lines_in_window: 0, suppressed: 0 }
    }
}

impl OutputLogger {
    pub fn drain(&mut self, output: &CapturedOutput, queue: &str, rule: &str) {
        let (bytes, dropped) = output.take();
        self.suppressed += dropped;
        if bytes.is_empty() {
            return;
        }
        if self.window_start.elapsed() >= WINDOW {
            if self.suppressed > 0 {
                tracing::info!(queue, rule, suppressed = self.suppressed, "rule output suppressed by rate limit");
            }
            self.window_start = Instant::now();
            self.lines_in_window = 0;
            self.suppressed = 0;
        }
        for line in String::from_utf8_lossy(&bytes).lines().filter(|l| !l.trim().is_empty()) {
            if self.lines_in_window < LINES_PER_WINDOW {
                self.lines_in_window += 1;
                tracing::info!(queue, rule, "rule output: {}", crate::health::untrusted_text(line));
            } else {
                self.suppressed += 1;
            }
        }
    }
}
