//! Processes while the PID-1 reaper owns `waitpid` (as in a guest): exit
//! statuses must come from the reaper, not from tokio. A separate test
//! binary, because the reaper is process-global.

mod common;
#[path = "common/connect.rs"]
mod connect;

use connect::{Client, Codec};
use siesta_envd_proto::process::process_event::Event;
use siesta_envd_proto::process::*;

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

/// Every event of a Start stream up to its end envelope; the last one.
async fn drain(s: &mut connect::ServerStream<StartResponse>) -> Option<Event> {
    let mut last = None;
    while let Some(m) = tokio::time::timeout(std::time::Duration::from_secs(20), s.next())
        .await
        .expect("no event in 20 s")
    {
        last = m.event.and_then(|e| e.event);
    }
    last
}

#[tokio::test]
async fn exit_status_and_kill_through_the_reaper() {
    siesta_agent::reaper::start().unwrap();
    assert!(siesta_agent::reaper::is_active());
    let g = common::Guest::start().await;
    let c = Client::new(&g.base);

    let start = "/process.Process/Start";
    let mut s = c
        .stream::<_, StartResponse>(Codec::Json, start, &sh("echo x; exit 4"), &[])
        .await
        .unwrap();
    match drain(&mut s).await {
        Some(Event::End(e)) => assert_eq!(e.status, "exit status 4"),
        other => panic!("last event {other:?}"),
    }

    // Past its deadline the call ends with deadline_exceeded and the
    // process is killed; the reaper reaps it (a zombie keeps /proc/PID).
    let mut s = c
        .stream::<_, StartResponse>(
            Codec::Json,
            start,
            &sh("sleep 30"),
            &[("connect-timeout-ms", "300")],
        )
        .await
        .unwrap();
    let pid = match s.next().await.and_then(|m| m.event).and_then(|e| e.event) {
        Some(Event::Start(st)) => st.pid,
        other => panic!("first event {other:?}"),
    };
    drain(&mut s).await;
    assert_eq!(s.end_error().as_deref(), Some("deadline_exceeded"));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            std::time::Instant::now() < until,
            "process {pid} not reaped"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
