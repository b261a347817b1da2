//! Processes while the PID-1 reaper owns `waitpid` (as in a guest): exit
//! statuses must come from the reaper, not from tokio. A separate test
//! binary, because the reaper is process-global.

mod common;
#[path = "common/connect.rs"]
mod connect;

use connect::{Client, Codec};
use siesta_envd_proto::process::process_event::Event;
use siesta_envd_proto::process::*;

#[tokio::test]
async fn exit_status_and_kill_through_the_reaper() {
    siesta_agent::reaper::start().unwrap();
    assert!(siesta_agent::reaper::is_active());
    let g = common::Guest::start().await;
    let c = Client::new(&g.base);
    for (script, timeout, status) in [
        ("echo x; exit 4", None, "exit status 4"),
        ("sleep 30", Some("300"), "signal: killed"),
    ] {
        let req = StartRequest {
            process: Some(ProcessConfig {
                cmd: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()],
                ..Default::default()
            }),
            stdin: Some(false),
            ..Default::default()
        };
        let headers: Vec<(&str, &str)> = timeout
            .map(|t| ("connect-timeout-ms", t))
            .into_iter()
            .collect();
        let mut s = c
            .stream::<_, StartResponse>(Codec::Json, "/process.Process/Start", &req, &headers)
            .await
            .unwrap();
        let mut last = None;
        while let Some(m) = tokio::time::timeout(std::time::Duration::from_secs(20), s.next())
            .await
            .expect("no event in 20 s")
        {
            last = m.event.and_then(|e| e.event);
        }
        match last {
            Some(Event::End(e)) => assert_eq!(e.status, status),
            other => panic!("last event {other:?}"),
        }
    }
}
