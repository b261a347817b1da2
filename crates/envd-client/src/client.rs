//! HTTP client for one sandbox's agent.

use crate::bounded;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::BytesMut;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use siesta_envd_proto::process::{
    process_event::{data_event::Output, Event},
    ProcessConfig, StartRequest, StartResponse,
};

use crate::error::{EnvdError as Error, Result};
use siesta_envd_proto::envelope::{encode, take_frame};

/// What `/init` tells a freshly resumed guest.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitParams {
    pub env_vars: HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// The host's wall clock: a guest resumed from a snapshot has a stale one.
    pub timestamp: String,
    pub default_user: String,
    pub default_workdir: String,
    /// Fresh randomness: every clone of one snapshot starts with the same
    /// random state until the agent reseeds the kernel with this.
    pub entropy: String,
    /// Volumes to mount (siesta's extension of envd's `/init`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub siesta_mounts: Vec<siesta_envd_proto::NfsMount>,
}

impl InitParams {
    pub fn new(
        access_token: Option<String>,
        env_vars: HashMap<String, String>,
        defaults: &GuestDefaults,
    ) -> Self {
        let mut entropy = [0u8; 64];
        rand::Rng::fill(&mut rand::thread_rng(), &mut entropy[..]);
        Self {
            env_vars,
            access_token,
            timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            default_user: defaults.user.clone(),
            default_workdir: defaults.workdir.clone(),
            entropy: base64::engine::general_purpose::STANDARD.encode(entropy),
            siesta_mounts: Vec::new(),
        }
    }
}

/// Who a guest's commands run as, and where, when a request names neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestDefaults {
    pub user: String,
    pub workdir: String,
}

impl Default for GuestDefaults {
    /// E2B's: user `user` in its home.
    fn default() -> Self {
        Self {
            user: "user".into(),
            workdir: "/home/user".into(),
        }
    }
}

/// Who runs a command, where, and with what environment.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// The guest user; the agent's default user if `None`.
    pub user: Option<String>,
    pub envs: HashMap<String, String>,
    /// The working directory; the agent's default if `None`.
    pub cwd: Option<String>,
}

/// The result of a command run to completion: its exit code and the last
/// [`bounded::EXEC_KEPT_BYTES`] of each stream (all of it went through
/// the caller's `on_output` as it came; a guest can print without end, so
/// the host keeps only the tail).
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

#[derive(Clone)]
pub struct EnvdClient {
    pub(crate) id: String,
    pub(crate) base: String,
    pub(crate) token: Option<String>,
    pub(crate) http: reqwest::Client,
}

impl EnvdClient {
    /// A client for the agent of sandbox `id`, reached at `addr`.
    pub fn new(id: &str, addr: SocketAddr, token: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .build()
            .expect("a client with static settings always builds");
        Self {
            id: id.to_string(),
            base: format!("http://{addr}"),
            token,
            http,
        }
    }

    /// A client for the agent of sandbox `id` through a server's front door
    /// at `server` (`http://host:port`): every request carries the
    /// `E2b-Sandbox-Id` header the front door routes by, as the E2B SDK's
    /// do, so it works from any machine that reaches the server.
    pub fn through_front_door(id: &str, server: &str, token: Option<String>) -> Result<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = reqwest::header::HeaderValue::from_str(id).map_err(|_| Error::Agent {
            id: id.to_string(),
            detail: "a sandbox id is letters and digits".into(),
        })?;
        headers.insert("e2b-sandbox-id", value);
        let http = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .default_headers(headers)
            .build()
            .expect("a client with static settings always builds");
        Ok(Self {
            id: id.to_string(),
            base: server.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }

    pub(crate) fn agent_err(&self, detail: impl std::fmt::Display) -> Error {
        Error::Agent {
            id: self.id.clone(),
            detail: detail.to_string(),
        }
    }

    /// Polls `GET /health` until it answers 2xx or `timeout` passes.
    /// Returns the time it took.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        let url = format!("{}/health", self.base);
        let mut last_error = String::from("no answer yet");
        while started.elapsed() < timeout {
            let attempt = self
                .http
                .get(&url)
                .timeout(Duration::from_millis(500))
                .send()
                .await;
            match attempt {
                Ok(resp) if resp.status().is_success() => return Ok(started.elapsed()),
                Ok(resp) => last_error = format!("HTTP {}", resp.status()),
                Err(e) => last_error = e.to_string(),
            }
            // Short: the guest usually answers within a few hundred ms of a
            // resume and every ms here is resume latency.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Err(Error::GuestNotReady {
            id: self.id.clone(),
            secs: timeout.as_secs(),
            detail: last_error,
        })
    }

    /// `POST /init`.
    pub async fn init(&self, params: &InitParams) -> Result<()> {
        let mut req = self
            .http
            .post(format!("{}/init", self.base))
            .timeout(Duration::from_secs(10))
            .json(params);
        if let Some(t) = &self.token {
            req = req.header("X-Access-Token", t);
        }
        let resp = self.send_ok(req, "/init").await?;
        if !params.siesta_mounts.is_empty() {
            self.check_mounted(params, resp).await?;
        }
        Ok(())
    }

    /// An agent that mounted volumes lists them in its answer; an older one
    /// ignores the field, and its sandbox must not run without them.
    async fn check_mounted(&self, params: &InitParams, resp: reqwest::Response) -> Result<()> {
        #[derive(serde::Deserialize)]
        struct Mounted {
            mounts: Vec<String>,
        }
        let mounted = resp
            .json::<Mounted>()
            .await
            .map(|m| m.mounts)
            .unwrap_or_default();
        match params.siesta_mounts.iter().find(|m| !mounted.contains(&m.path)) {
            None => Ok(()),
            Some(m) => Err(self.agent_err(format!(
                "the guest agent did not mount the volume at {} (the template's agent predates volumes): rebuild the template",
                m.path
            ))),
        }
    }

    /// `GET /metrics`: the guest's CPU, memory and disk use (JSON as the
    /// agent reports it).
    pub async fn metrics(&self) -> Result<serde_json::Value> {
        let mut req = self
            .http
            .get(format!("{}/metrics", self.base))
            .timeout(Duration::from_secs(10));
        if let Some(t) = &self.token {
            req = req.header("X-Access-Token", t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.agent_err(format!("/metrics: {e}")))?;
        if !resp.status().is_success() {
            return Err(self.agent_err(format!("/metrics answered {}", resp.status())));
        }
        let body = bounded::read_whole(resp, bounded::JSON_ANSWER_BYTES, "/metrics")
            .await
            .map_err(|e| self.agent_err(e))?;
        serde_json::from_slice(&body).map_err(|e| self.agent_err(format!("/metrics: {e}")))
    }

    /// Runs `/bin/bash -l -c cmd` as `user`, calling `on_output` with each
    /// chunk (`true` for stdout) as it arrives; returns the exit code and
    /// everything printed.
    pub async fn exec(
        &self,
        cmd: &str,
        user: Option<&str>,
        on_output: impl FnMut(bool, &[u8]),
    ) -> Result<ExecOutput> {
        let opts = ExecOptions {
            user: user.map(str::to_string),
            ..Default::default()
        };
        self.run_with("/bin/bash", &["-l", "-c", cmd], &opts, on_output)
            .await
    }

    /// Runs `program args` directly (no shell) and waits for it.
    pub async fn run(
        &self,
        program: &str,
        args: &[&str],
        user: Option<&str>,
        on_output: impl FnMut(bool, &[u8]),
    ) -> Result<ExecOutput> {
        let opts = ExecOptions {
            user: user.map(str::to_string),
            ..Default::default()
        };
        self.run_with(program, args, &opts, on_output).await
    }

    /// Runs `program args` with `opts` and waits for it.
    pub async fn run_with(
        &self,
        program: &str,
        args: &[&str],
        opts: &ExecOptions,
        mut on_output: impl FnMut(bool, &[u8]),
    ) -> Result<ExecOutput> {
        let user = opts.user.as_deref();
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: program.into(),
                args: args.iter().map(|a| a.to_string()).collect(),
                envs: opts.envs.clone(),
                cwd: opts.cwd.clone(),
            }),
            pty: None,
            tag: None,
            stdin: Some(false),
        };
        let json = serde_json::to_vec(&request).map_err(|e| self.agent_err(e))?;
        let resp = self.send_ok(self.start_call(&json, user), "Start").await?;
        let mut out = ExecOutput::default();
        let mut ended = false;
        let mut buf = BytesMut::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.agent_err(format!("Start stream: {e}")))?;
            buf.extend_from_slice(&chunk);
            while let Some(env) =
                take_frame(&mut buf).map_err(|e| self.agent_err(format!("Start stream: {e}")))?
            {
                if env.is_end_stream() {
                    return self.finish_stream(&env.payload, ended, out);
                }
                let msg: StartResponse = serde_json::from_slice(&env.payload)
                    .map_err(|e| self.agent_err(format!("bad event: {e}")))?;
                match msg.event.and_then(|e| e.event) {
                    Some(Event::Data(d)) => match d.output {
                        Some(Output::Stdout(b)) => {
                            on_output(true, &b);
                            bounded::keep_tail(&mut out.stdout, &b);
                        }
                        Some(Output::Stderr(b)) | Some(Output::Pty(b)) => {
                            on_output(false, &b);
                            bounded::keep_tail(&mut out.stderr, &b);
                        }
                        None => {}
                    },
                    Some(Event::End(end)) => {
                        out.exit_code = end.exit_code;
                        ended = true;
                    }
                    _ => {}
                }
            }
        }
        Err(self.agent_err("Start stream ended without an end-of-stream message"))
    }

    /// Writes `body` to `path` in the guest as `user` (`POST /files`).
    pub async fn upload(&self, path: &str, user: &str, body: Vec<u8>) -> Result<()> {
        self.upload_body(path, user, body.into()).await
    }

    /// Writes the host file `local` to `path` in the guest as `user`,
    /// streamed: however large, it never sits in the server's memory
    /// whole (review M5).
    pub async fn upload_file(&self, path: &str, user: &str, local: &std::path::Path) -> Result<()> {
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|source| Error::Io {
                what: "opening a file to upload to the guest",
                path: local.to_path_buf(),
                source,
            })?;
        let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 << 10);
        self.upload_body(path, user, reqwest::Body::wrap_stream(stream))
            .await
    }

    async fn upload_body(&self, path: &str, user: &str, body: reqwest::Body) -> Result<()> {
        let mut req = self
            .http
            .post(format!("{}/files", self.base))
            .query(&[("path", path), ("username", user)])
            .header("content-type", "application/octet-stream")
            .timeout(Duration::from_secs(600))
            .body(body);
        if let Some(t) = &self.token {
            req = req.header("X-Access-Token", t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.agent_err(format!("upload of {path}: {e}")))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = bounded::error_text(resp).await;
            return Err(self.agent_err(format!("upload of {path} answered {status}: {text}")));
        }
        Ok(())
    }

    /// Reads `path` in the guest as `user` (`GET /files`).
    pub async fn download(&self, path: &str, user: &str) -> Result<Vec<u8>> {
        let mut req = self
            .http
            .get(format!("{}/files", self.base))
            .query(&[("path", path), ("username", user)])
            .timeout(Duration::from_secs(600));
        if let Some(t) = &self.token {
            req = req.header("X-Access-Token", t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.agent_err(format!("download of {path}: {e}")))?;
        let status = resp.status();
        if !status.is_success() {
            let text = bounded::error_text(resp).await;
            return Err(self.agent_err(format!("download of {path} answered {status}: {text}")));
        }
        let what = format!("download of {path}");
        bounded::read_whole(resp, bounded::DOWNLOAD_BYTES, &what)
            .await
            .map_err(|e| self.agent_err(e))
    }

    /// The entries of directory `path` in the guest as `user`
    /// (`filesystem.Filesystem/ListDir`, Connect unary JSON): envd's
    /// `EntryInfo` objects as JSON.
    pub async fn list_dir(&self, path: &str, user: &str) -> Result<Vec<serde_json::Value>> {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        let mut req = self
            .http
            .post(format!("{}/filesystem.Filesystem/ListDir", self.base))
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1")
            .header("Authorization", format!("Basic {basic}"))
            .json(&serde_json::json!({ "path": path, "depth": 1 }));
        if let Some(t) = &self.token {
            req = req.header("X-Access-Token", t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.agent_err(format!("ListDir {path}: {e}")))?;
        let status = resp.status();
        let what = format!("ListDir {path}");
        let raw = bounded::read_whole(resp, bounded::JSON_ANSWER_BYTES, &what)
            .await
            .map_err(|e| self.agent_err(e))?;
        let body: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| self.agent_err(format!("{what}: {e}")))?;
        if !status.is_success() {
            let msg = body.get("message").and_then(|m| m.as_str()).unwrap_or("");
            return Err(self.agent_err(format!("ListDir {path} answered {status}: {msg}")));
        }
        Ok(body
            .get("entries")
            .and_then(|e| e.as_array())
            .cloned()
            .unwrap_or_default())
    }

    /// Sends `req`; a transport error or a non-2xx answer is an agent error
    /// naming `what` (and the answer's status and body).
    pub(crate) async fn send_ok(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::Response> {
        let resp = req
            .send()
            .await
            .map_err(|e| self.agent_err(format!("{what}: {e}")))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = bounded::error_text(resp).await;
            return Err(self.agent_err(format!("{what} answered {status}: {body}")));
        }
        Ok(resp)
    }

    /// `process.Process/Start` (a server stream) with `json` as its one
    /// request envelope, authorised as [`EnvdClient::authorized`] says.
    pub(crate) fn start_call(&self, json: &[u8], user: Option<&str>) -> reqwest::RequestBuilder {
        let req = self
            .http
            .post(format!("{}/process.Process/Start", self.base))
            .header("content-type", "application/connect+json")
            .header("connect-protocol-version", "1")
            .body(encode(0, json));
        self.authorized(req, user)
    }

    /// The guest's access token, and `user` as envd's Basic authorization
    /// (the user a process runs as).
    pub(crate) fn authorized(
        &self,
        mut req: reqwest::RequestBuilder,
        user: Option<&str>,
    ) -> reqwest::RequestBuilder {
        if let Some(t) = &self.token {
            req = req.header("X-Access-Token", t);
        }
        if let Some(u) = user {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{u}:"));
            req = req.header("Authorization", format!("Basic {basic}"));
        }
        req
    }

    fn finish_stream(&self, end: &[u8], ended: bool, mut out: ExecOutput) -> Result<ExecOutput> {
        bounded::trim_tail(&mut out.stdout);
        bounded::trim_tail(&mut out.stderr);
        let end: serde_json::Value = serde_json::from_slice(end).unwrap_or_default();
        if let Some(err) = end.get("error") {
            return Err(self.agent_err(format!("Start failed: {err}")));
        }
        if !ended {
            return Err(self.agent_err("command ended without an end event"));
        }
        Ok(out)
    }
}
