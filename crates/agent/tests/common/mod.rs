//! The temporary guest the agent's integration tests run against.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::PathBuf;

use siesta_agent::rpc::RequestContext;
use siesta_agent::state::AgentState;
use siesta_agent::users::UserDb;

/// A temporary guest: a passwd with `user` (the test's own uid, so chown
/// works unprivileged) and `other` (a stranger), homes under a temp dir.
pub struct Guest {
    pub dir: tempfile::TempDir,
    pub state: AgentState,
    pub base: String,
    pub http: reqwest::Client,
}

impl Guest {
    pub async fn start() -> Guest {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        // SAFETY: as above.
        let gid = unsafe { libc::getgid() };
        let home = root.join("home/user");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(root.join("home/other")).unwrap();
        let passwd = root.join("passwd");
        let group = root.join("group");
        std::fs::write(
            &passwd,
            format!(
                "root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{gid}::{}:/bin/sh\nother:x:54321:54321::{}:/bin/sh\n",
                home.display(),
                root.join("home/other").display()
            ),
        )
        .unwrap();
        std::fs::write(
            &group,
            format!("root:x:0:\nusers:x:{gid}:\nother:x:54321:\n"),
        )
        .unwrap();
        let state = AgentState::new(UserDb { passwd, group });
        // What `/init defaultUser` sets in a sandbox: the SDK sends no user.
        state.defaults.write().await.user = Some("user".into());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(siesta_agent::serve(listener, state.clone()));
        Guest {
            dir,
            state,
            base,
            http: reqwest::Client::new(),
        }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home/user")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn files_url(&self, path: &str) -> String {
        let mut u = reqwest::Url::parse(&self.url("/files")).unwrap();
        u.query_pairs_mut().append_pair("path", path);
        u.to_string()
    }
}

pub fn ctx(user: &str) -> RequestContext {
    RequestContext {
        user: user.to_string(),
        timeout: None,
        keepalive: None,
    }
}

/// Asserts an envd JSON error (`{"code": status, "message"}`) and returns the message.
pub async fn error_json(resp: reqwest::Response, status: u16) -> String {
    assert_eq!(resp.status().as_u16(), status);
    let v: serde_json::Value = resp.json().await.expect("error body is JSON");
    assert_eq!(v["code"], status);
    v["message"].as_str().expect("message").to_string()
}
