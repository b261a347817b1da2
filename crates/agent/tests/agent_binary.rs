//! The `siesta-agent` binary as a child process: it binds at once, answers
//! `/health`, and runs a command end to end over a real socket.

#[path = "common/connect.rs"]
mod connect;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use connect::{Client, Codec};
use siesta_envd_proto::process::process_event::{data_event::Output, Event};
use siesta_envd_proto::process::*;

/// Kills the agent when the test ends, pass or fail.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_starts_fast_and_runs_a_command() {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_siesta-agent"))
        .args(["--listen", "127.0.0.1:0"])
        .env("SIESTA_AGENT_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let agent = Agent(child);
    let addr = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stderr).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                // "... listening on ADDR version=...": the first word.
                let rest = l.split("listening on ").nth(1)?;
                rest.split_whitespace().next().map(str::to_string)
            })
            .expect("no 'listening on' line");
        // Keep draining so the agent never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        addr
    })
    .await
    .unwrap();
    let base = format!("http://{addr}");
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status().as_u16(), 204);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "slow start: {:?}",
        t0.elapsed()
    );

    // Run as ourselves: root by default, or our own name when not root.
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let user = siesta_agent::users::UserDb::default().user_name(uid);
    let auth = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{user}:")
        )
    );
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), "echo hi; exit 2".into()],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let c = Client::new(&base);
    let mut s = c
        .stream::<_, StartResponse>(
            Codec::Json,
            "/process.Process/Start",
            &req,
            &[("authorization", &auth)],
        )
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(m) = s.next().await {
        events.push(m.event.unwrap().event.unwrap());
    }
    assert!(
        matches!(events.first(), Some(Event::Start(_))),
        "{events:?}"
    );
    let stdout: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            Event::Data(d) => match &d.output {
                Some(Output::Stdout(b)) => Some(b.clone()),
                _ => None,
            },
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(stdout, b"hi\n");
    match events.last() {
        Some(Event::End(e)) => assert_eq!(e.exit_code, 2),
        other => panic!("last event {other:?}"),
    }
    drop(agent);
}
