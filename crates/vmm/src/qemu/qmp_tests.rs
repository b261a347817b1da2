//! QMP parsing and client behaviour against a scripted peer on a socketpair.
//! The peer stands in for QEMU only in what these tests check: message
//! framing, id matching, event separation and SCM_RIGHTS delivery. The real
//! QEMU is exercised by tests/qemu_snapshot.rs.

use super::*;
use std::io::{IoSliceMut, Read, Seek, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;

use nix::sys::socket::{recvmsg, ControlMessageOwned};

#[test]
fn parses_every_message_kind() {
    let g = br#"{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}"#;
    match parse_message(g).unwrap() {
        QmpMessage::Greeting { version } => assert_eq!(version["qemu"]["major"], 7),
        m => panic!("{m:?}"),
    }
    let r =
        parse_message(b"{\"return\": {\"status\": \"paused\", \"running\": false}, \"id\": 7}\r\n")
            .unwrap();
    assert_eq!(
        r,
        QmpMessage::Return {
            id: Some(json!(7)),
            value: json!({"status": "paused", "running": false})
        }
    );
    let e =
        parse_message(br#"{"id": 3, "error": {"class": "GenericError", "desc": "no migration"}}"#)
            .unwrap();
    assert_eq!(
        e,
        QmpMessage::Error {
            id: Some(json!(3)),
            class: "GenericError".into(),
            desc: "no migration".into()
        }
    );
    let ev = br#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "MIGRATION", "data": {"status": "completed"}}"#;
    assert_eq!(
        parse_message(ev).unwrap(),
        QmpMessage::Event(QmpEvent {
            event: "MIGRATION".into(),
            data: json!({"status": "completed"})
        })
    );
    let bad = parse_message(b"{\"return\": ").unwrap_err();
    assert!(matches!(bad, QmpError::Protocol { .. }), "{bad}");
    assert!(parse_message(b"[1,2]").is_err());
    assert!(parse_message(b"{\"foo\": 1}").is_err());
}

#[test]
fn decodes_typed_replies() {
    let m: MigrationInfo = serde_json::from_value(json!({
        "status": "failed", "error-desc": "Unable to write", "total-time": 12
    }))
    .unwrap();
    assert_eq!(m.status.as_deref(), Some("failed"));
    assert_eq!(m.error_desc.as_deref(), Some("Unable to write"));
    let empty: MigrationInfo = serde_json::from_value(json!({})).unwrap();
    assert!(empty.status.is_none());
    let s: StatusInfo =
        serde_json::from_value(json!({"status": "running", "running": true, "singlestep": false}))
            .unwrap();
    assert!(s.running);
}

/// The peer's side: reads one request line (and any descriptor sent with it).
struct Peer {
    sock: StdUnixStream,
    buf: Vec<u8>,
}

impl Peer {
    fn send(&mut self, line: &str) {
        self.sock.write_all(line.as_bytes()).unwrap();
        self.sock.write_all(b"\r\n").unwrap();
    }

    /// Receives until a full line, collecting SCM_RIGHTS descriptors.
    fn recv(&mut self) -> (Value, Vec<OwnedFd>) {
        let mut fds = Vec::new();
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return (serde_json::from_slice(&line).unwrap(), fds);
            }
            let mut data = [0u8; 4096];
            let mut cmsg = nix::cmsg_space!([RawFd; 4]);
            let raw = self.sock.as_raw_fd();
            let mut iov = [IoSliceMut::new(&mut data)];
            let msg = recvmsg::<()>(raw, &mut iov, Some(&mut cmsg), MsgFlags::empty()).unwrap();
            for c in msg.cmsgs().unwrap() {
                if let ControlMessageOwned::ScmRights(r) = c {
                    // SAFETY: the kernel just installed these descriptors in
                    // this process for us; nothing else owns them.
                    fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
            let n = msg.bytes;
            assert!(n > 0, "client closed");
            self.buf.extend_from_slice(&data[..n]);
        }
    }
}

fn pair() -> (UnixStream, Peer) {
    let (a, b) = StdUnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (
        UnixStream::from_std(a).unwrap(),
        Peer {
            sock: b,
            buf: Vec::new(),
        },
    )
}

fn greet(p: &mut Peer) {
    p.send(r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}"#);
    let (req, _) = p.recv();
    assert_eq!(req["execute"], "qmp_capabilities");
    p.send(&format!(r#"{{"return": {{}}, "id": {}}}"#, req["id"]));
}

#[tokio::test]
async fn matches_replies_by_id_and_queues_events() {
    let (sock, mut peer) = pair();
    let server = std::thread::spawn(move || {
        greet(&mut peer);
        let (req, _) = peer.recv();
        assert_eq!(req["execute"], "query-status");
        let id = &req["id"];
        // An event, a stale reply and a blank line come before the answer.
        peer.send(
            r#"{"event": "STOP", "data": {}, "timestamp": {"seconds": 0, "microseconds": 0}}"#,
        );
        peer.send(r#"{"return": {"status": "running", "running": true}, "id": 999}"#);
        peer.sock.write_all(b"\r\n").unwrap();
        // The reply in two pieces, as a slow socket may deliver it.
        let reply =
            format!(r#"{{"return": {{"status": "paused", "running": false}}, "id": {id}}}"#);
        let (a, b) = reply.split_at(10);
        peer.sock.write_all(a.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        peer.send(b);
        let (req, _) = peer.recv();
        assert_eq!(req["execute"], "migrate-set-capabilities");
        assert_eq!(
            req["arguments"]["capabilities"][0]["capability"],
            "x-ignore-shared"
        );
        peer.send(&format!(
            r#"{{"error": {{"class": "GenericError", "desc": "There's a migration process in progress"}}, "id": {}}}"#,
            req["id"]
        ));
        // Then QEMU goes away.
    });
    let mut c = QmpClient::handshake(sock, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(c.version["qemu"]["major"], 7);
    let st = c.query_status().await.unwrap();
    assert_eq!(st.status, "paused");
    let ev = c.take_events();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].event, "STOP");
    let e = c.set_capability("x-ignore-shared", true).await.unwrap_err();
    assert!(
        matches!(&e, QmpError::Command { desc, .. } if desc.contains("in progress")),
        "{e}"
    );
    server.join().unwrap();
    let e = c.cont().await.unwrap_err();
    assert!(e.is_disconnect(), "{e}");
}

#[tokio::test]
async fn times_out_when_qemu_does_not_answer() {
    let (sock, mut peer) = pair();
    let server = std::thread::spawn(move || {
        greet(&mut peer);
        let _ = peer.recv();
        peer // keep the socket open, never answer
    });
    let mut c = QmpClient::handshake(sock, Duration::from_millis(200))
        .await
        .unwrap();
    let e = c.stop().await.unwrap_err();
    assert!(matches!(e, QmpError::Timeout(_)), "{e}");
    drop(server.join().unwrap());
}

#[tokio::test]
async fn getfd_passes_a_working_descriptor() {
    let (sock, mut peer) = pair();
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(b"state-bytes").unwrap();
    file.rewind().unwrap();
    let server = std::thread::spawn(move || {
        greet(&mut peer);
        let (req, fds) = peer.recv();
        assert_eq!(req["execute"], "getfd");
        assert_eq!(req["arguments"]["fdname"], "incoming");
        assert_eq!(fds.len(), 1, "exactly one descriptor with getfd");
        // Read through the received descriptor: it is the same open file.
        let mut got = String::new();
        std::fs::File::from(fds.into_iter().next().unwrap())
            .read_to_string(&mut got)
            .unwrap();
        peer.send(&format!(r#"{{"return": {{}}, "id": {}}}"#, req["id"]));
        // A plain command afterwards carries no descriptor.
        let (req, fds) = peer.recv();
        assert!(fds.is_empty());
        peer.send(&format!(r#"{{"return": {{}}, "id": {}}}"#, req["id"]));
        got
    });
    let mut c = QmpClient::handshake(sock, Duration::from_secs(5))
        .await
        .unwrap();
    c.getfd("incoming", file.as_fd()).await.unwrap();
    c.migrate_incoming("fd:incoming").await.unwrap();
    assert_eq!(server.join().unwrap(), "state-bytes");
}

#[tokio::test]
async fn waits_for_the_event_asked_for() {
    let (sock, mut peer) = pair();
    let server = std::thread::spawn(move || {
        greet(&mut peer);
        let (req, _) = peer.recv();
        assert_eq!(req["execute"], "migrate-incoming");
        // Received with the reply: queued, then found there.
        peer.send(r#"{"event": "MIGRATION", "data": {"status": "setup"}, "timestamp": {"seconds": 0, "microseconds": 0}}"#);
        peer.send(&format!(r#"{{"return": {{}}, "id": {}}}"#, req["id"]));
        std::thread::sleep(Duration::from_millis(20));
        // Read while waiting: other events are kept, a late reply dropped.
        peer.send(
            r#"{"event": "RESUME", "data": {}, "timestamp": {"seconds": 0, "microseconds": 0}}"#,
        );
        peer.send(r#"{"return": {}, "id": 999}"#);
        peer.send(r#"{"event": "MIGRATION", "data": {"status": "completed"}, "timestamp": {"seconds": 0, "microseconds": 0}}"#);
        peer // then silence
    });
    let mut c = QmpClient::handshake(sock, Duration::from_secs(5))
        .await
        .unwrap();
    c.migrate_incoming("fd:x").await.unwrap();
    let status =
        |s: &'static str| move |e: &QmpEvent| e.event == "MIGRATION" && e.data["status"] == s;
    let ev = c
        .wait_event(status("setup"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ev.data["status"], "setup");
    let ev = c
        .wait_event(status("completed"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ev.data["status"], "completed");
    let kept = c.take_events();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].event, "RESUME");
    let e = c
        .wait_event(status("failed"), Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(e, QmpError::Timeout(_)), "{e}");
    drop(server.join().unwrap());
}
