//! A typed async client for QEMU's QMP protocol over a Unix socket.
//!
//! QMP is line-delimited JSON: a greeting, then `qmp_capabilities`, then
//! commands answered by `{"return": ...}` or `{"error": ...}` carrying the
//! request's `id`, with asynchronous `{"event": ...}` messages interleaved.
//! The client is sequential (one command in flight, `&mut self`): every VM
//! operation is a short series of dependent commands, so concurrency would buy
//! nothing. Replies to other ids (left over from a command that timed out) are
//! skipped; events are kept in a bounded queue for the caller.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixStream;

/// QEMU's replies are small; a line this long means a broken peer.
const MAX_LINE: usize = 16 << 20;
/// Events nobody asked for are kept, but not without bound.
const MAX_EVENTS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("socket I/O: {0}")]
    Io(#[from] io::Error),
    #[error("QEMU closed the QMP connection")]
    Closed,
    #[error("no reply within {}ms", .0.as_millis())]
    Timeout(Duration),
    #[error("protocol error: {detail} (message: {raw})")]
    Protocol { detail: String, raw: String },
    #[error("QEMU returned {class}: {desc}")]
    Command { class: String, desc: String },
    #[error("unexpected reply shape: {detail} (reply: {raw})")]
    Decode { detail: String, raw: String },
}

impl QmpError {
    /// The connection is unusable (the QEMU process is probably gone).
    pub fn is_disconnect(&self) -> bool {
        matches!(self, QmpError::Closed | QmpError::Io(_))
    }
}

/// An asynchronous QEMU event, e.g. STOP, RESUME, MIGRATION, SHUTDOWN.
#[derive(Debug, Clone, PartialEq)]
pub struct QmpEvent {
    pub event: String,
    pub data: Value,
}

/// One parsed line from QEMU.
#[derive(Debug, Clone, PartialEq)]
pub enum QmpMessage {
    Greeting {
        version: Value,
    },
    Return {
        id: Option<Value>,
        value: Value,
    },
    Error {
        id: Option<Value>,
        class: String,
        desc: String,
    },
    Event(QmpEvent),
}

/// Parses one QMP line.
pub fn parse_message(line: &[u8]) -> Result<QmpMessage, QmpError> {
    let raw = || {
        String::from_utf8_lossy(line)
            .trim_end()
            .chars()
            .take(500)
            .collect::<String>()
    };
    let v: Value = serde_json::from_slice(line).map_err(|e| QmpError::Protocol {
        detail: format!("invalid JSON: {e}"),
        raw: raw(),
    })?;
    let Value::Object(mut m) = v else {
        return Err(QmpError::Protocol {
            detail: "not a JSON object".into(),
            raw: raw(),
        });
    };
    let id = m.remove("id");
    if let Some(value) = m.remove("return") {
        return Ok(QmpMessage::Return { id, value });
    }
    if let Some(err) = m.remove("error") {
        let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        return Ok(QmpMessage::Error {
            id,
            class: field("class"),
            desc: field("desc"),
        });
    }
    if let Some(Value::String(event)) = m.remove("event") {
        let data = m.remove("data").unwrap_or(Value::Null);
        return Ok(QmpMessage::Event(QmpEvent { event, data }));
    }
    if let Some(q) = m.remove("QMP") {
        let version = q.get("version").cloned().unwrap_or(Value::Null);
        return Ok(QmpMessage::Greeting { version });
    }
    Err(QmpError::Protocol {
        detail: "neither return, error, event nor greeting".into(),
        raw: raw(),
    })
}

/// `query-status`.
#[derive(Debug, Clone, Deserialize)]
pub struct StatusInfo {
    pub status: String,
    pub running: bool,
}

/// `query-migrate`; fields are absent before the first migration.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MigrationInfo {
    pub status: Option<String>,
    #[serde(rename = "error-desc")]
    pub error_desc: Option<String>,
    #[serde(rename = "total-time")]
    pub total_time: Option<u64>,
}

pub struct QmpClient {
    stream: BufReader<UnixStream>,
    /// Bytes of a line not yet complete; kept across a timed-out read so a
    /// cancelled read loses nothing.
    pending: Vec<u8>,
    next_id: u64,
    events: VecDeque<QmpEvent>,
    timeout: Duration,
    /// QEMU's version object from the greeting.
    pub version: Value,
}

/// QEMU greets once, on connection; a second greeting means the stream
/// is not what this client thinks it is.
fn greeting_mid_session() -> QmpError {
    QmpError::Protocol {
        detail: "greeting in the middle of a session".into(),
        raw: String::new(),
    }
}

impl QmpClient {
    /// Reads the greeting and leaves capabilities negotiation mode.
    pub async fn handshake(stream: UnixStream, timeout: Duration) -> Result<Self, QmpError> {
        let mut c = QmpClient {
            stream: BufReader::new(stream),
            pending: Vec::new(),
            next_id: 1,
            events: VecDeque::new(),
            timeout,
            version: Value::Null,
        };
        let first = tokio::time::timeout(timeout, c.read_message())
            .await
            .map_err(|_| QmpError::Timeout(timeout))??;
        match first {
            QmpMessage::Greeting { version } => c.version = version,
            other => {
                return Err(QmpError::Protocol {
                    detail: "expected the QMP greeting".into(),
                    raw: format!("{other:?}"),
                })
            }
        }
        c.run("qmp_capabilities", None).await?;
        Ok(c)
    }

    /// Runs `cmd` with optional `args` and decodes its `return` value as `R`
    /// ([`QmpClient::run`] when there is nothing to read).
    pub async fn execute<R: DeserializeOwned>(
        &mut self,
        cmd: &str,
        args: Option<Value>,
    ) -> Result<R, QmpError> {
        self.execute_inner(cmd, args, None).await
    }

    /// Runs `cmd` for its effect: its `return` value is not read.
    pub async fn run(&mut self, cmd: &str, args: Option<Value>) -> Result<(), QmpError> {
        self.execute::<serde::de::IgnoredAny>(cmd, args)
            .await
            .map(drop)
    }

    /// Like [`QmpClient::execute`], passing `fd` to QEMU with SCM_RIGHTS in the
    /// same message (as `getfd` and `add-fd` expect).
    pub async fn execute_with_fd<R: DeserializeOwned>(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        fd: BorrowedFd<'_>,
    ) -> Result<R, QmpError> {
        self.execute_inner(cmd, args, Some(fd)).await
    }

    async fn execute_inner<R: DeserializeOwned>(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<R, QmpError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({ "execute": cmd, "id": id });
        if let Some(a) = args {
            req["arguments"] = a;
        }
        let mut bytes = serde_json::to_vec(&req).map_err(|e| QmpError::Protocol {
            detail: format!("cannot encode request: {e}"),
            raw: cmd.to_string(),
        })?;
        bytes.push(b'\n');
        let timeout = self.timeout;
        let value = tokio::time::timeout(timeout, async {
            match fd {
                Some(fd) => self.send_with_fd(&bytes, fd).await?,
                None => self.stream.get_mut().write_all(&bytes).await?,
            }
            self.wait_reply(id).await
        })
        .await
        .map_err(|_| QmpError::Timeout(timeout))??;
        serde_json::from_value(value.clone()).map_err(|e| QmpError::Decode {
            detail: e.to_string(),
            raw: value.to_string().chars().take(500).collect(),
        })
    }

    async fn send_with_fd(&mut self, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        let stream = self.stream.get_ref();
        let sock = stream.as_raw_fd();
        let fds = [fd.as_raw_fd()];
        // The descriptor travels with the first byte sent; if the kernel took
        // only part of the message, the rest goes out as plain bytes.
        let sent = stream
            .async_io(Interest::WRITABLE, || {
                let iov = [IoSlice::new(bytes)];
                let cmsg = [ControlMessage::ScmRights(&fds)];
                sendmsg::<()>(sock, &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            })
            .await?;
        if sent < bytes.len() {
            self.stream.get_mut().write_all(&bytes[sent..]).await?;
        }
        Ok(())
    }

    async fn wait_reply(&mut self, id: u64) -> Result<Value, QmpError> {
        loop {
            let msg = self.read_message().await?;
            let ours = |rid: &Option<Value>| rid.as_ref().and_then(Value::as_u64) == Some(id);
            match msg {
                QmpMessage::Return { id: rid, value } if ours(&rid) => return Ok(value),
                QmpMessage::Error {
                    id: rid,
                    class,
                    desc,
                } if ours(&rid) => return Err(QmpError::Command { class, desc }),
                QmpMessage::Event(e) => self.push_event(e),
                // A late reply to an earlier, timed-out command.
                QmpMessage::Return { .. } | QmpMessage::Error { .. } => {}
                QmpMessage::Greeting { .. } => return Err(greeting_mid_session()),
            }
        }
    }

    fn push_event(&mut self, e: QmpEvent) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    /// Waits up to `timeout` for an event `matches` accepts, received
    /// already (it leaves the queue) or read now; other events are queued,
    /// late replies dropped.
    pub async fn wait_event(
        &mut self,
        matches: impl Fn(&QmpEvent) -> bool,
        timeout: Duration,
    ) -> Result<QmpEvent, QmpError> {
        if let Some(i) = self.events.iter().position(&matches) {
            if let Some(e) = self.events.remove(i) {
                return Ok(e);
            }
        }
        let wait = async {
            loop {
                match self.read_message().await? {
                    QmpMessage::Event(e) if matches(&e) => return Ok(e),
                    QmpMessage::Event(e) => self.push_event(e),
                    QmpMessage::Return { .. } | QmpMessage::Error { .. } => {}
                    QmpMessage::Greeting { .. } => return Err(greeting_mid_session()),
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| QmpError::Timeout(timeout))?
    }

    /// Events received so far, oldest first; the queue is emptied.
    pub fn take_events(&mut self) -> Vec<QmpEvent> {
        self.events.drain(..).collect()
    }

    async fn read_message(&mut self) -> Result<QmpMessage, QmpError> {
        loop {
            let n = self.stream.read_until(b'\n', &mut self.pending).await?;
            if n == 0 {
                return Err(QmpError::Closed);
            }
            if self.pending.len() > MAX_LINE {
                return Err(QmpError::Protocol {
                    detail: format!("line longer than {MAX_LINE} bytes"),
                    raw: String::new(),
                });
            }
            if self.pending.last() != Some(&b'\n') {
                continue; // EOF in the middle of a line: the next read says Closed.
            }
            let line = std::mem::take(&mut self.pending);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return parse_message(&line);
        }
    }

    // Typed wrappers for the commands siesta uses.

    pub async fn stop(&mut self) -> Result<(), QmpError> {
        self.run("stop", None).await
    }

    pub async fn cont(&mut self) -> Result<(), QmpError> {
        self.run("cont", None).await
    }

    pub async fn query_status(&mut self) -> Result<StatusInfo, QmpError> {
        self.execute("query-status", None).await
    }

    pub async fn set_capability(&mut self, capability: &str, state: bool) -> Result<(), QmpError> {
        self.set_capabilities(&[(capability, state)]).await
    }

    /// `migrate-set-capabilities` with several at once (one round trip).
    pub async fn set_capabilities(&mut self, caps: &[(&str, bool)]) -> Result<(), QmpError> {
        let caps: Vec<Value> = caps
            .iter()
            .map(|(capability, state)| json!({ "capability": capability, "state": state }))
            .collect();
        let args = json!({ "capabilities": caps });
        self.run("migrate-set-capabilities", Some(args)).await
    }

    /// `migrate-set-parameters` with the given object, e.g.
    /// `{"max-bandwidth": 107374182400}`.
    pub async fn set_migrate_parameters(&mut self, params: Value) -> Result<(), QmpError> {
        self.run("migrate-set-parameters", Some(params)).await
    }

    /// Hands `fd` to QEMU under `name` (usable as `fd:NAME` in migration URIs).
    pub async fn getfd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        self.execute_with_fd::<serde::de::IgnoredAny>("getfd", Some(json!({ "fdname": name })), fd)
            .await
            .map(drop)
    }

    /// `add-fd`: hands `fd` to QEMU in a new fd set and returns the set's
    /// id. QEMU opens the file as `/dev/fdset/ID`, taking a descriptor of
    /// the set whose access mode (read-only, write-only, read-write) is the
    /// one it asks for.
    pub async fn add_fd(&mut self, fd: BorrowedFd<'_>) -> Result<u64, QmpError> {
        #[derive(Deserialize)]
        struct Added {
            #[serde(rename = "fdset-id")]
            fdset_id: u64,
        }
        let added: Added = self.execute_with_fd("add-fd", None, fd).await?;
        Ok(added.fdset_id)
    }

    /// `remove-fd` of a whole set: QEMU closes its descriptors once nothing
    /// opened from the set is still in use.
    pub async fn remove_fdset(&mut self, fdset_id: u64) -> Result<(), QmpError> {
        self.run("remove-fd", Some(json!({ "fdset-id": fdset_id })))
            .await
    }

    pub async fn migrate(&mut self, uri: &str) -> Result<(), QmpError> {
        self.run("migrate", Some(json!({ "uri": uri }))).await
    }

    pub async fn migrate_incoming(&mut self, uri: &str) -> Result<(), QmpError> {
        self.run("migrate-incoming", Some(json!({ "uri": uri })))
            .await
    }

    pub async fn query_migrate(&mut self) -> Result<MigrationInfo, QmpError> {
        self.execute("query-migrate", None).await
    }

    /// `blockdev-snapshot-sync`: the existing qcow2 overlay `file` (which
    /// may be a `/dev/fdset/ID`), named `snapshot_node`, put above image
    /// node `node` (which becomes its backing and is written no more). The
    /// overlay's header keeps the backing name it was created with.
    pub async fn blockdev_snapshot_sync(
        &mut self,
        node: &str,
        file: &str,
        snapshot_node: &str,
    ) -> Result<(), QmpError> {
        let args = json!({
            "node-name": node,
            "snapshot-file": file,
            "snapshot-node-name": snapshot_node,
            "format": "qcow2",
            "mode": "existing",
        });
        self.run("blockdev-snapshot-sync", Some(args)).await
    }

    /// `blockdev-add` of the node `args` describes.
    pub async fn blockdev_add(&mut self, args: Value) -> Result<(), QmpError> {
        self.run("blockdev-add", Some(args)).await
    }

    /// `blockdev-reopen` with `args` (`{"options": [node, ...]}`).
    pub async fn blockdev_reopen(&mut self, args: Value) -> Result<(), QmpError> {
        self.run("blockdev-reopen", Some(args)).await
    }

    /// `blockdev-del` of a node added by `blockdev-add` or `-blockdev`.
    pub async fn blockdev_del(&mut self, node: &str) -> Result<(), QmpError> {
        let args = json!({ "node-name": node });
        self.run("blockdev-del", Some(args)).await
    }

    /// `xen-save-devices-state` with `live: false`: every device section a
    /// `migrate` would write, without RAM, to `filename` (opened by QEMU).
    /// Leaves a stopped VM stopped and its disks active.
    pub async fn xen_save_devices_state(&mut self, filename: &str) -> Result<(), QmpError> {
        let args = json!({ "filename": filename, "live": false });
        self.run("xen-save-devices-state", Some(args)).await
    }

    /// Asks QEMU to exit; it may close the socket before or after replying.
    pub async fn quit(&mut self) -> Result<(), QmpError> {
        match self.execute::<serde::de::IgnoredAny>("quit", None).await {
            Ok(_) | Err(QmpError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
#[path = "qmp_tests.rs"]
mod tests;

/// Hostile input (issue 12): whatever line a QMP socket sends is a message
/// or an error, never a panic.
#[cfg(test)]
mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        #[test]
        fn any_line_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_message(&bytes);
        }

        #[test]
        fn any_json_text_never_panics(text in "\\{(\"(return|error|event|QMP|id|class|desc|data)\": ?(\\{\\}|\\[\\]|\"[a-z]*\"|[0-9]+|null),? ?){0,4}\\}") {
            let _ = parse_message(text.as_bytes());
        }
    }
}
