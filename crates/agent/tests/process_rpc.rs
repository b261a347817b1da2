//! `process.Process` over real HTTP to an in-process agent on a loopback
//! socket: both codecs, streaming, reattach, timeouts, pty, input, signals.

mod common;
#[path = "common/connect.rs"]
mod connect;

use std::time::{Duration, Instant};

use connect::{Client, Codec, ServerStream};
use siesta_envd_proto::process::process_event::{data_event::Output, EndEvent, Event};
use siesta_envd_proto::process::*;

const START: &str = "/process.Process/Start";
const CONNECT: &str = "/process.Process/Connect";

async fn guest() -> (common::Guest, Client) {
    let g = common::Guest::start().await;
    let c = Client::new(&g.base);
    (g, c)
}

fn sh(script: &str) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    }
}

fn pid_sel(pid: u32) -> Option<ProcessSelector> {
    Some(ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
    })
}

#[derive(Default, Debug)]
struct Run {
    pid: u32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    pty: Vec<u8>,
    end: Option<EndEvent>,
}

impl Run {
    /// Applies one event; returns whether it was the end.
    fn apply(&mut self, ev: Event) -> bool {
        match ev {
            Event::Start(s) => panic!("second start event {s:?}"),
            Event::Data(d) => match d.output.expect("data without output") {
                Output::Stdout(b) => self.stdout.extend(b),
                Output::Stderr(b) => self.stderr.extend(b),
                Output::Pty(b) => self.pty.extend(b),
            },
            Event::End(e) => {
                self.end = Some(e);
                return true;
            }
            Event::Keepalive(_) => {}
        }
        false
    }
}

/// Reads the mandatory first `start{pid}` event.
async fn started(s: &mut ServerStream<StartResponse>) -> u32 {
    match next_event(s).await {
        Some(Event::Start(st)) => st.pid,
        other => panic!("expected start first, got {other:?}"),
    }
}

async fn next_event(s: &mut ServerStream<StartResponse>) -> Option<Event> {
    tokio::time::timeout(Duration::from_secs(20), s.next())
        .await
        .expect("no event within 20 s")
        .map(|r| {
            r.event
                .expect("response without event")
                .event
                .expect("empty event")
        })
}

/// Reads the rest of a process's events up to `end` and the end envelope.
async fn finish(s: &mut ServerStream<StartResponse>, run: &mut Run) {
    while let Some(ev) = next_event(s).await {
        if run.apply(ev) {
            assert!(s.next().await.is_none(), "message after end");
            assert_eq!(s.end.as_ref(), Some(&serde_json::json!({})));
            return;
        }
    }
    panic!("stream ended without an end event: {run:?}");
}

/// Reads events until the pty output contains `needle`.
async fn pty_until(s: &mut ServerStream<StartResponse>, run: &mut Run, needle: &str) {
    while !String::from_utf8_lossy(&run.pty).contains(needle) {
        let ev = next_event(s).await.expect("stream ended");
        assert!(!run.apply(ev), "process ended before {needle:?}: {run:?}");
    }
}

async fn run(c: &Client, codec: Codec, req: StartRequest, headers: &[(&str, &str)]) -> Run {
    let mut s = c.stream(codec, START, &req, headers).await.expect("start");
    let mut r = Run {
        pid: started(&mut s).await,
        ..Default::default()
    };
    finish(&mut s, &mut r).await;
    r
}

#[tokio::test]
async fn start_reports_output_and_exit_in_both_codecs() {
    let (_g, c) = guest().await;
    for codec in [Codec::Json, Codec::Proto] {
        let r = run(&c, codec, sh("echo out; echo err >&2; exit 3"), &[]).await;
        assert!(r.pid > 0);
        assert_eq!(r.stdout, b"out\n");
        assert_eq!(r.stderr, b"err\n");
        let end = r.end.unwrap();
        assert_eq!((end.exit_code, end.exited), (3, true));
        assert_eq!(end.status, "exit status 3");
        assert_eq!(end.error.as_deref(), Some("exit status 3"));

        let ok = run(&c, codec, sh("true"), &[]).await.end.unwrap();
        assert_eq!((ok.exit_code, ok.exited, ok.error), (0, true, None));
    }
}

#[tokio::test]
async fn environment_user_and_cwd() {
    let (g, c) = guest().await;
    g.state
        .defaults
        .write()
        .await
        .env_vars
        .insert("FROM_INIT".into(), "i".into());
    let mut req = sh("echo $FROM_INIT $FROM_REQ $USER $HOME; id -u; pwd");
    let cfg = req.process.as_mut().unwrap();
    cfg.envs.insert("FROM_REQ".into(), "r".into());
    cfg.cwd = Some("/tmp".into());
    // The default user (`user`, the test's own uid) and explicitly by Basic auth.
    // SAFETY: a plain libc call with no preconditions.
    let uid = unsafe { libc::getuid() };
    for headers in [&[][..], &[("authorization", "Basic dXNlcjo=")][..]] {
        let r = run(&c, Codec::Json, req.clone(), headers).await;
        let expected = format!("i r user {}\n{uid}\n/tmp\n", g.home().display());
        assert_eq!(String::from_utf8_lossy(&r.stdout), expected);
    }
    // Without a cwd the process starts in the user's home.
    let r = run(&c, Codec::Json, sh("pwd"), &[]).await;
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim(),
        g.home().display().to_string()
    );

    req.process.as_mut().unwrap().cwd = Some("/no/such/dir".into());
    let err = c
        .stream::<_, StartResponse>(Codec::Json, START, &req, &[])
        .await
        .err()
        .unwrap();
    assert_eq!((err.status, err.code.as_str()), (400, "invalid_argument"));
    // An unknown user is refused too.
    let err = c
        .stream::<_, StartResponse>(
            Codec::Json,
            START,
            &sh("true"),
            &[("authorization", "Basic bm9ib2R5Og==")],
        )
        .await
        .err()
        .unwrap();
    assert_eq!(err.code, "invalid_argument");
}

#[tokio::test]
async fn output_streams_before_the_process_ends() {
    let (_g, c) = guest().await;
    let t0 = Instant::now();
    let mut s = c
        .stream(
            Codec::Json,
            START,
            &sh("for i in 1 2 3 4; do echo $i; sleep 0.4; done"),
            &[],
        )
        .await
        .unwrap();
    started(&mut s).await;
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "start was not flushed at once"
    );
    let mut r = Run::default();
    let mut chunks_before_end = 0;
    while let Some(ev) = next_event(&mut s).await {
        if matches!(ev, Event::Data(_)) && t0.elapsed() < Duration::from_millis(1400) {
            chunks_before_end += 1;
        }
        if r.apply(ev) {
            break;
        }
    }
    assert!(
        chunks_before_end >= 2,
        "output was buffered: {chunks_before_end} early chunks"
    );
    assert_eq!(r.stdout, b"1\n2\n3\n4\n");
}

#[tokio::test]
async fn process_survives_disconnect_and_is_reattached() {
    let (_g, c) = guest().await;
    let mut req = sh("read line; echo got $line");
    req.stdin = Some(true);
    req.tag = Some("bg-job".into());
    let mut s = c.stream(Codec::Json, START, &req, &[]).await.unwrap();
    let pid = started(&mut s).await;
    drop(s); // the client goes away; the process must not
    tokio::time::sleep(Duration::from_millis(300)).await;

    let list: ListResponse = c
        .unary(Codec::Json, "/process.Process/List", &ListRequest {}, &[])
        .await
        .unwrap();
    let info = list
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("process listed");
    assert_eq!(info.tag.as_deref(), Some("bg-job"));
    assert_eq!(info.config.as_ref().unwrap().cmd, "/bin/sh");

    // Attach by tag, then feed it.
    let by_tag = ConnectRequest {
        process: Some(ProcessSelector {
            selector: Some(process_selector::Selector::Tag("bg-job".into())),
        }),
    };
    let mut s = c
        .stream(
            Codec::Json,
            CONNECT,
            &by_tag,
            &[("keepalive-ping-interval", "1")],
        )
        .await
        .unwrap();
    assert_eq!(started(&mut s).await, pid);
    let input = SendInputRequest {
        process: pid_sel(pid),
        input: Some(ProcessInput {
            input: Some(process_input::Input::Stdin(b"hello\n".to_vec())),
        }),
    };
    let _: SendInputResponse = c
        .unary(Codec::Json, "/process.Process/SendInput", &input, &[])
        .await
        .unwrap();
    let mut r = Run::default();
    finish(&mut s, &mut r).await;
    assert_eq!(r.stdout, b"got hello\n");
    assert_eq!(r.end.unwrap().exit_code, 0);

    // Once its end was delivered the process is gone.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = c
        .stream::<_, StartResponse>(
            Codec::Json,
            CONNECT,
            &ConnectRequest {
                process: pid_sel(pid),
            },
            &[],
        )
        .await
        .err()
        .unwrap();
    assert_eq!(err.code, "not_found");
}

#[tokio::test]
async fn keepalives_fill_silence() {
    let (_g, c) = guest().await;
    let mut s = c
        .stream(
            Codec::Json,
            START,
            &sh("sleep 2.5"),
            &[("keepalive-ping-interval", "1")],
        )
        .await
        .unwrap();
    started(&mut s).await;
    let mut keepalives = 0;
    loop {
        match next_event(&mut s).await.unwrap() {
            Event::Keepalive(_) => keepalives += 1,
            Event::End(e) => {
                assert_eq!(e.exit_code, 0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(keepalives >= 2, "{keepalives} keepalives");
}

#[tokio::test]
async fn connect_timeout_ends_the_stream_and_kills_the_process() {
    let (_g, c) = guest().await;
    let t0 = Instant::now();
    let mut s = c
        .stream(
            Codec::Json,
            START,
            &sh("sleep 30"),
            &[("connect-timeout-ms", "500")],
        )
        .await
        .expect("start");
    let pid = started(&mut s).await;
    // As envd: the call ends with deadline_exceeded (the SDK's
    // TimeoutException), not with an end event of a killed process.
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(20), s.next())
        .await
        .expect("the stream ends within 20 s")
    {
        let ev = ev.event.and_then(|e| e.event);
        assert!(
            !matches!(ev, Some(Event::End(_))),
            "an end event instead of the deadline: {ev:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(s.end_error().as_deref(), Some("deadline_exceeded"));
    // And the process does not outlive its call.
    let gone = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < gone, "process {pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pty_session_with_resize() {
    let (_g, c) = guest().await;
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sh".into(),
            envs: [("PS1".to_string(), "$ ".to_string())].into(),
            ..Default::default()
        }),
        pty: Some(Pty {
            size: Some(pty::Size { cols: 80, rows: 24 }),
        }),
        ..Default::default()
    };
    let mut s = c.stream(Codec::Json, START, &req, &[]).await.unwrap();
    let pid = started(&mut s).await;
    let send = |data: &'static [u8]| {
        let c = c.clone();
        async move {
            let req = SendInputRequest {
                process: pid_sel(pid),
                input: Some(ProcessInput {
                    input: Some(process_input::Input::Pty(data.to_vec())),
                }),
            };
            let _: SendInputResponse = c
                .unary(Codec::Json, "/process.Process/SendInput", &req, &[])
                .await
                .unwrap();
        }
    };
    let mut r = Run::default();
    send(b"stty size\n").await;
    pty_until(&mut s, &mut r, "24 80").await;

    let update = UpdateRequest {
        process: pid_sel(pid),
        pty: Some(Pty {
            size: Some(pty::Size {
                cols: 100,
                rows: 40,
            }),
        }),
    };
    let _: UpdateResponse = c
        .unary(Codec::Proto, "/process.Process/Update", &update, &[])
        .await
        .unwrap();
    send(b"stty size\n").await;
    pty_until(&mut s, &mut r, "40 100").await;
    assert!(
        r.stdout.is_empty() && r.stderr.is_empty(),
        "pty output came as stdout/stderr"
    );

    send(b"exit 7\n").await;
    finish(&mut s, &mut r).await;
    assert_eq!(r.end.unwrap().exit_code, 7);
}

#[tokio::test]
async fn stdin_by_send_input_stream_input_and_close() {
    let (_g, c) = guest().await;
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: "cat".into(),
            ..Default::default()
        }),
        stdin: Some(true),
        ..Default::default()
    };
    let mut s = c.stream(Codec::Proto, START, &req, &[]).await.unwrap();
    let pid = started(&mut s).await;
    let stdin = |b: &[u8]| {
        Some(ProcessInput {
            input: Some(process_input::Input::Stdin(b.to_vec())),
        })
    };
    let _: SendInputResponse = c
        .unary(
            Codec::Json,
            "/process.Process/SendInput",
            &SendInputRequest {
                process: pid_sel(pid),
                input: stdin(b"a\n"),
            },
            &[],
        )
        .await
        .unwrap();

    use stream_input_request::{DataEvent, Event as In, StartEvent};
    let msgs = vec![
        StreamInputRequest {
            event: Some(In::Start(StartEvent {
                process: pid_sel(pid),
            })),
        },
        StreamInputRequest {
            event: Some(In::Data(DataEvent {
                input: stdin(b"b\n"),
            })),
        },
        StreamInputRequest {
            event: Some(In::Keepalive(stream_input_request::KeepAlive {})),
        },
        StreamInputRequest {
            event: Some(In::Data(DataEvent {
                input: stdin(b"c\n"),
            })),
        },
    ];
    for codec in [Codec::Json, Codec::Proto] {
        let (resps, end) = c
            .client_stream::<_, StreamInputResponse>(codec, "/process.Process/StreamInput", &msgs)
            .await
            .unwrap();
        assert_eq!(
            resps.len(),
            1,
            "client stream must answer exactly one message"
        );
        assert_eq!(end, serde_json::json!({}));
    }

    let close = CloseStdinRequest {
        process: pid_sel(pid),
    };
    let _: CloseStdinResponse = c
        .unary(Codec::Json, "/process.Process/CloseStdin", &close, &[])
        .await
        .unwrap();
    let mut r = Run::default();
    finish(&mut s, &mut r).await;
    assert_eq!(r.stdout, b"a\nb\nc\nb\nc\n");
    assert_eq!(r.end.unwrap().exit_code, 0);

    // Input to a process without stdin is refused, not silently dropped.
    let mut s = c
        .stream(Codec::Json, START, &sh("sleep 5"), &[])
        .await
        .unwrap();
    let pid = started(&mut s).await;
    let err = c
        .unary::<_, SendInputResponse>(
            Codec::Json,
            "/process.Process/SendInput",
            &SendInputRequest {
                process: pid_sel(pid),
                input: stdin(b"x"),
            },
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, "failed_precondition");
    let kill = SendSignalRequest {
        process: pid_sel(pid),
        signal: Signal::Sigkill as i32,
    };
    let _: SendSignalResponse = c
        .unary(Codec::Json, "/process.Process/SendSignal", &kill, &[])
        .await
        .unwrap();
}

#[tokio::test]
async fn sigkill_takes_the_process_group() {
    let (_g, c) = guest().await;
    let mut s = c
        .stream(Codec::Json, START, &sh("sleep 1000 & echo $!; wait"), &[])
        .await
        .unwrap();
    let pid = started(&mut s).await;
    let mut r = Run::default();
    while !r.stdout.ends_with(b"\n") {
        assert!(!r.apply(next_event(&mut s).await.unwrap()));
    }
    let child: i32 = String::from_utf8_lossy(&r.stdout).trim().parse().unwrap();

    // The SDK sends the enum by name.
    let resp = c
        .raw(
            "/process.Process/SendSignal",
            "application/json",
            format!(r#"{{"process":{{"pid":{pid}}},"signal":"SIGNAL_SIGKILL"}}"#).into_bytes(),
            &[],
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    finish(&mut s, &mut r).await;
    assert_eq!(r.end.unwrap().status, "signal: killed");
    // The backgrounded sleep died with its shell (gone, or a zombie of
    // whatever reaps orphans here).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
        if stat.is_empty() || state == Some('Z') {
            break;
        }
        assert!(Instant::now() < deadline, "child {child} survived: {stat}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Unknown pid: not_found, which the SDK turns into `kill() == False`.
    let err = c
        .unary::<_, SendSignalResponse>(
            Codec::Json,
            "/process.Process/SendSignal",
            &SendSignalRequest {
                process: pid_sel(999_999),
                signal: Signal::Sigkill as i32,
            },
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!((err.status, err.code.as_str()), (404, "not_found"));
}
