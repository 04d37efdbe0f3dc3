//! One client connection: frame reading with a size bound, the writer
//! thread and its outbound queue, keep-alive. Every command goes to the
//! broker core ([`pulsar_core::broker::Broker::handle_frame`]); this file
//! holds no broker logic.
//!
//! A frame larger than [`MAX_FRAME_SIZE`] or whose sizes disagree closes
//! this connection with a logged reason, as does every error the core
//! returns (a command that does not decode or lacks a required field, a
//! protocol violation); the process keeps serving others.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use prost::Message;
use pulsar_core::broker::{ConnectionError, FrameCutter, FramingError, OutFrame, MAX_FRAME_SIZE};
use pulsar_core::proto::command::{ty, BrokerCommand, Empty};

use super::record::Recorder;
use super::{lock, now_ms, Node};

/// Outbound bytes above which the connection is closed: only a peer that
/// keeps sending commands while not reading the replies gets there (the
/// core stops MESSAGE frames at its high watermark, one frame past it at
/// most).
pub const OUTBOUND_LIMIT: usize = pulsar_core::broker::OUTBOUND_HIGH_WATERMARK + 2 * MAX_FRAME_SIZE;
/// Bytes read from the socket per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// Why a connection was closed by the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket failure or end of stream.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A frame above the bound, or sizes that disagree.
    #[error(transparent)]
    Framing(#[from] FramingError),
    /// A stream that ends inside a frame.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The broker core closed the connection.
    #[error(transparent)]
    Core(#[from] ConnectionError),
    /// No CONNECT, or no command at all (not even the PONG to the server's
    /// PING), within two keep-alive intervals (Pulsar's `keepAliveIntervalSeconds`).
    #[error("keep-alive timeout: {0}")]
    KeepAlive(String),
    /// The peer does not read what the server writes.
    #[error("outbound queue above {OUTBOUND_LIMIT} bytes: the client does not read its socket")]
    NotReading,
}

/// One queued frame: its bytes and whether the core counted them (PINGs
/// the adapter sends for keep-alive are not the core's).
struct Queued {
    bytes: Vec<u8>,
    counted: bool,
}

/// Frames waiting for the connection's writer thread.
#[derive(Default)]
struct Outbound {
    frames: VecDeque<Queued>,
    /// Bytes queued or being written.
    bytes: usize,
    /// Set when the connection is closed or the socket failed.
    closed: bool,
    /// The hard limit was crossed.
    overflowed: bool,
}

/// The write half of a connection. [`send`](Self::send) only queues the
/// frame (never blocks on the socket), so a peer that stops reading stalls
/// nothing but its own connection; the connection's writer thread writes
/// the queue in order and reports the bytes written to the core.
pub struct ConnWriter {
    /// Broker-side connection id.
    pub id: u64,
    out: Mutex<Outbound>,
    ready: Condvar,
    /// A handle to the socket for `shutdown` (unblocks both halves).
    socket: TcpStream,
    recorder: Option<Arc<Recorder>>,
}

impl ConnWriter {
    /// Queues one frame of the core's.
    pub fn send(&self, frame: &OutFrame) {
        self.queue(&frame.command, frame.payload.len(), frame.encode(), true);
    }

    /// Queues `buf` (the frame whose command bytes are `command`); closes
    /// the connection when its queue would exceed [`OUTBOUND_LIMIT`].
    fn queue(&self, command: &[u8], payload_len: usize, buf: Vec<u8>, counted: bool) {
        let mut out = lock(&self.out);
        if out.closed {
            return;
        }
        if out.bytes + buf.len() > OUTBOUND_LIMIT {
            out.overflowed = true;
            drop(out);
            self.close();
            return;
        }
        // Recorded under the queue lock: the recording's order is the wire's.
        if let Some(r) = &self.recorder {
            r.record("out", self.id, command, payload_len);
        }
        out.bytes += buf.len();
        out.frames.push_back(Queued {
            bytes: buf,
            counted,
        });
        self.ready.notify_one();
    }

    /// Queues the keep-alive PING.
    fn ping(&self) {
        let cmd = BrokerCommand {
            r#type: ty::PING,
            ping: Some(Empty {}),
            ..Default::default()
        };
        let frame = OutFrame {
            command: cmd.encode_to_vec(),
            payload: Vec::new(),
        };
        self.queue(&frame.command, 0, frame.encode(), false);
    }

    fn overflowed(&self) -> bool {
        lock(&self.out).overflowed
    }

    /// Closes the connection (both socket halves).
    pub fn close(&self) {
        lock(&self.out).closed = true;
        self.ready.notify_all();
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// The writer thread: writes queued frames in order until the
    /// connection closes or a write fails; reports each batch written to
    /// the core (which dispatches again once the connection is below its
    /// high watermark).
    fn write_queue(&self, node: &Node, mut stream: TcpStream) {
        loop {
            let batch: Vec<Queued> = {
                let mut out = lock(&self.out);
                while out.frames.is_empty() && !out.closed {
                    out = self.ready.wait(out).unwrap_or_else(|p| p.into_inner());
                }
                if out.closed {
                    return;
                }
                out.frames.drain(..).collect()
            };
            let mut counted = 0usize;
            let mut batch = batch.into_iter();
            while let Some(frame) = batch.next() {
                if frame.counted && node.fail_this_write(&frame.bytes) {
                    // The test fault: this frame is not written; the core
                    // learns it after what was written before it.
                    let mut out = lock(&self.out);
                    out.bytes = out.bytes.saturating_sub(frame.bytes.len());
                    drop(out);
                    let (written, failed) = (std::mem::take(&mut counted), frame.bytes.len());
                    node.with(|core| {
                        core.handle_written(self.id, written, now_ms());
                        core.handle_write_failed(self.id, failed, now_ms());
                    });
                    continue;
                }
                if let Err(e) = stream.write_all(&frame.bytes) {
                    tracing::debug!(conn = self.id, error = %e, "write failed");
                    // This frame and the rest of the batch are not written.
                    let failed: usize = std::iter::once(&frame)
                        .chain(batch.as_slice())
                        .filter(|f| f.counted)
                        .map(|f| f.bytes.len())
                        .sum();
                    node.with(|core| {
                        core.handle_written(self.id, counted, now_ms());
                        core.handle_write_failed(self.id, failed, now_ms());
                    });
                    self.close();
                    return;
                }
                let mut out = lock(&self.out);
                out.bytes = out.bytes.saturating_sub(frame.bytes.len());
                if frame.counted {
                    counted += frame.bytes.len();
                }
            }
            if counted > 0 {
                node.with(|core| core.handle_written(self.id, counted, now_ms()));
            }
        }
    }
}

/// Serves one connection until it ends; returns why it ended. Two
/// threads: this one reads frames and hands each to the core, a second one
/// writes the connection's outbound queue. Every `keep_alive` without a
/// command the server sends PING; a second interval without one (or
/// without CONNECT) closes the connection.
pub fn serve_connection(
    node: Arc<Node>,
    stream: TcpStream,
    id: u64,
    recorder: Option<Arc<Recorder>>,
    keep_alive: Duration,
) -> ConnError {
    let _ = stream.set_nodelay(true);
    if let Err(e) = stream.set_read_timeout(Some(keep_alive)) {
        return ConnError::Io(e);
    }
    let (write_half, socket) = match (stream.try_clone(), stream.try_clone()) {
        (Ok(w), Ok(s)) => (w, s),
        (Err(e), _) | (_, Err(e)) => return ConnError::Io(e),
    };
    let writer = Arc::new(ConnWriter {
        id,
        out: Mutex::new(Outbound::default()),
        ready: Condvar::new(),
        socket,
        recorder: recorder.clone(),
    });
    node.open(Arc::clone(&writer));
    let writer_thread = {
        let writer = Arc::clone(&writer);
        let node = Arc::clone(&node);
        std::thread::Builder::new()
            .name(format!("conn-{id}-write"))
            .spawn(move || writer.write_queue(&node, write_half))
    };
    let writer_thread = match writer_thread {
        Ok(t) => t,
        Err(e) => {
            node.close(id);
            return ConnError::Io(e);
        }
    };
    let mut err = read_loop(&node, &writer, recorder.as_deref(), stream, keep_alive);
    if writer.overflowed() {
        err = ConnError::NotReading;
    }
    node.close(id);
    writer.close();
    let _ = writer_thread.join();
    err
}

/// Reads frames as their bytes arrive (a declared size allocates nothing up
/// front: memory follows the bytes received, one frame and one read chunk
/// at most) and hands the whole frames of each read to the core in one
/// turn; returns why the connection ends.
fn read_loop(
    node: &Node,
    writer: &ConnWriter,
    recorder: Option<&Recorder>,
    mut stream: TcpStream,
    keep_alive: Duration,
) -> ConnError {
    let id = writer.id;
    let mut cutter = FrameCutter::default();
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut awaiting_pong = false;
    let mut frames = Vec::new();
    loop {
        // Every whole frame received goes to the core in one turn (its
        // SENDs and acks share a group commit).
        let framing = loop {
            match cutter.next_frame() {
                Ok(Some(f)) => {
                    if let Some(r) = recorder {
                        r.record("in", id, f.command(), f.payload().len());
                    }
                    frames.push(f);
                }
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        if !frames.is_empty() {
            if let Err(e) = node.handle_frames(id, &frames) {
                return ConnError::Core(e);
            }
            frames.clear();
        }
        if let Some(e) = framing {
            return ConnError::Framing(e);
        }
        // Whatever the socket holds, up to a chunk (a frame above the bound
        // is refused from its size alone, before its bytes are kept).
        match stream.read(&mut chunk) {
            Ok(0) if cutter.pending() == 0 => {
                return ConnError::Io(std::io::Error::from(ErrorKind::UnexpectedEof))
            }
            Ok(0) => {
                return ConnError::Malformed(format!(
                    "the stream ended inside a frame ({} bytes of it received)",
                    cutter.pending()
                ))
            }
            Ok(n) => {
                cutter.push(&chunk[..n]);
                awaiting_pong = false;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if !node.with(|core| core.is_connected(id)) {
                    return ConnError::KeepAlive(format!(
                        "no CONNECT within {} s",
                        keep_alive.as_secs_f64()
                    ));
                }
                if awaiting_pong {
                    return ConnError::KeepAlive(format!(
                        "no command (PONG) within {} s of the server's PING",
                        keep_alive.as_secs_f64()
                    ));
                }
                awaiting_pong = true;
                writer.ping();
            }
            Err(e) => return ConnError::Io(e),
        }
    }
}
