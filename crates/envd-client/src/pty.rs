//! Interactive terminals in the guest (`siesta sandbox attach`): a process
//! started in a pty (`process.Process/Start` with `pty`), keystrokes sent
//! to it (`SendInput`), resizes (`Update`) and a kill when the caller gives
//! up (`SendSignal`). The same calls the E2B SDK's `sandbox.pty` makes.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Serialize;
use siesta_envd_proto::envelope::take_frame;
use siesta_envd_proto::process::{
    process_event::{data_event::Output, Event},
    process_input::Input,
    process_selector::Selector,
    pty, ProcessConfig, ProcessInput, ProcessSelector, Pty, SendInputRequest, SendSignalRequest,
    Signal, StartRequest, StartResponse, UpdateRequest,
};

use crate::error::Result;
use crate::EnvdClient;

/// How long a unary call (input, resize, kill) may take. Generous: a guest
/// under load still answers, and a keystroke lost to a short timeout is
/// worse than a slow one.
const UNARY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the agent sends a keepalive on a silent stream (seconds): an
/// idle shell must not look like a dead connection to anything in between.
const KEEPALIVE_SECS: &str = "30";

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// What to run in the pty, as whom.
#[derive(Debug, Clone)]
pub struct PtySpec {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: HashMap<String, String>,
    /// The guest user; the agent's default user if `None`.
    pub user: Option<String>,
    pub size: PtySize,
}

/// One thing that happened to the process in the pty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyEvent {
    /// Bytes the terminal printed.
    Output(Bytes),
    /// The process ended with this code (-1: killed by a signal).
    Exit(i32),
}

/// A process running in a pty in the guest, and its event stream.
pub struct PtySession {
    pid: u32,
    client: EnvdClient,
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    buf: BytesMut,
    exit: Option<i32>,
}

impl PtySession {
    /// The process's id in the guest: what input and resizes address.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The next event: output, then the exit; `None` once the stream ended
    /// after the exit. An error if the stream breaks or ends early.
    pub async fn next_event(&mut self) -> Result<Option<PtyEvent>> {
        loop {
            while let Some(env) = take_frame(&mut self.buf)
                .map_err(|e| self.client.agent_err(format!("pty stream: {e}")))?
            {
                if env.is_end_stream() {
                    return self.finish(&env.payload);
                }
                let msg: StartResponse = serde_json::from_slice(&env.payload)
                    .map_err(|e| self.client.agent_err(format!("bad pty event: {e}")))?;
                match msg.event.and_then(|e| e.event) {
                    Some(Event::Data(d)) => match d.output {
                        // A pty has one output; stdout/stderr only appear
                        // if the agent ran it without one, and belong on
                        // the screen all the same.
                        Some(Output::Pty(b))
                        | Some(Output::Stdout(b))
                        | Some(Output::Stderr(b))
                            if !b.is_empty() =>
                        {
                            return Ok(Some(PtyEvent::Output(b.into())))
                        }
                        _ => {}
                    },
                    Some(Event::End(end)) => {
                        self.exit = Some(end.exit_code);
                        return Ok(Some(PtyEvent::Exit(end.exit_code)));
                    }
                    // Start was consumed by `start_pty`; keepalives only
                    // keep the connection busy.
                    _ => {}
                }
            }
            match self.body.next().await {
                Some(chunk) => {
                    let chunk = chunk
                        .map_err(|e| self.client.agent_err(format!("pty stream broke: {e}")))?;
                    self.buf.extend_from_slice(&chunk);
                }
                None if self.exit.is_some() => return Ok(None),
                None => {
                    return Err(self
                        .client
                        .agent_err("pty stream ended before the process did"))
                }
            }
        }
    }

    /// The end-of-stream message: an error the agent reports, or the end.
    fn finish(&mut self, payload: &[u8]) -> Result<Option<PtyEvent>> {
        let end: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
        if let Some(err) = end.get("error") {
            return Err(self.client.agent_err(format!("pty process failed: {err}")));
        }
        if self.exit.is_none() {
            return Err(self
                .client
                .agent_err("pty process ended without an exit code"));
        }
        // Drain: nothing may follow the end of the stream.
        self.body = futures::stream::empty().boxed();
        Ok(None)
    }
}

impl EnvdClient {
    /// Starts `spec` in a new pty and waits for its pid.
    pub async fn start_pty(&self, spec: &PtySpec) -> Result<PtySession> {
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: spec.cmd.clone(),
                args: spec.args.clone(),
                envs: spec.envs.clone(),
                cwd: None,
            }),
            pty: Some(pty_of(spec.size)),
            tag: None,
            // A pty's input is the terminal itself; no separate stdin pipe.
            stdin: Some(false),
        };
        let json = serde_json::to_vec(&request).map_err(|e| self.agent_err(e))?;
        // No Connect timeout: an interactive shell lives as long as its user.
        let req = self
            .start_call(&json, spec.user.as_deref())
            .header("keepalive-ping-interval", KEEPALIVE_SECS);
        let resp = self.send_ok(req, "starting the pty").await?;
        let mut session = PtySession {
            pid: 0,
            client: self.clone(),
            body: resp.bytes_stream().boxed(),
            buf: BytesMut::new(),
            exit: None,
        };
        session.pid = session.wait_started().await?;
        Ok(session)
    }

    /// Types `bytes` into the pty of process `pid`.
    pub async fn pty_input(&self, pid: u32, bytes: &[u8]) -> Result<()> {
        let request = SendInputRequest {
            process: Some(select(pid)),
            input: Some(ProcessInput {
                input: Some(Input::Pty(bytes.to_vec())),
            }),
        };
        self.unary("SendInput", &request).await
    }

    /// Resizes the pty of process `pid` (the guest's programs get SIGWINCH).
    pub async fn pty_resize(&self, pid: u32, size: PtySize) -> Result<()> {
        let request = UpdateRequest {
            process: Some(select(pid)),
            pty: Some(pty_of(size)),
        };
        self.unary("Update", &request).await
    }

    /// Kills process `pid` (SIGKILL): for a caller that leaves before the
    /// process ends, so no shell is left waiting for input nobody sends.
    pub async fn kill_process(&self, pid: u32) -> Result<()> {
        let request = SendSignalRequest {
            process: Some(select(pid)),
            signal: Signal::Sigkill as i32,
        };
        self.unary("SendSignal", &request).await
    }

    /// A Connect unary call of `process.Process/{method}` in JSON.
    async fn unary(&self, method: &str, request: &impl Serialize) -> Result<()> {
        let mut req = self
            .http
            .post(format!("{}/process.Process/{method}", self.base))
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1")
            .timeout(UNARY_TIMEOUT)
            .json(request);
        req = self.authorized(req, None);
        let resp = req
            .send()
            .await
            .map_err(|e| self.agent_err(format!("{method}: {e}")))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            let msg = body.get("message").and_then(|m| m.as_str()).unwrap_or("");
            return Err(self.agent_err(format!("{method} answered {status}: {msg}")));
        }
        Ok(())
    }
}

impl PtySession {
    /// Reads up to the start event, the first the agent sends.
    async fn wait_started(&mut self) -> Result<u32> {
        loop {
            if let Some(env) = take_frame(&mut self.buf)
                .map_err(|e| self.client.agent_err(format!("pty stream: {e}")))?
            {
                if env.is_end_stream() {
                    let end: serde_json::Value =
                        serde_json::from_slice(&env.payload).unwrap_or_default();
                    let detail = end.get("error").cloned().unwrap_or_default();
                    return Err(self
                        .client
                        .agent_err(format!("the pty did not start: {detail}")));
                }
                let msg: StartResponse = serde_json::from_slice(&env.payload)
                    .map_err(|e| self.client.agent_err(format!("bad pty event: {e}")))?;
                match msg.event.and_then(|e| e.event) {
                    Some(Event::Start(start)) => return Ok(start.pid),
                    Some(Event::Keepalive(_)) | None => continue,
                    Some(other) => {
                        return Err(self
                            .client
                            .agent_err(format!("expected the start event, got {other:?}")))
                    }
                }
            }
            match self.body.next().await {
                Some(chunk) => {
                    let chunk = chunk
                        .map_err(|e| self.client.agent_err(format!("pty stream broke: {e}")))?;
                    self.buf.extend_from_slice(&chunk);
                }
                None => {
                    return Err(self
                        .client
                        .agent_err("pty stream ended before the process started"))
                }
            }
        }
    }
}

fn select(pid: u32) -> ProcessSelector {
    ProcessSelector {
        selector: Some(Selector::Pid(pid)),
    }
}

fn pty_of(size: PtySize) -> Pty {
    Pty {
        size: Some(pty::Size {
            cols: u32::from(size.cols),
            rows: u32::from(size.rows),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON the agent (and envd) reads: proto3 JSON names, bytes as
    /// base64, the pid inside the selector.
    #[test]
    fn requests_use_envd_json_names() {
        let input = SendInputRequest {
            process: Some(select(7)),
            input: Some(ProcessInput {
                input: Some(Input::Pty(b"ls\r".to_vec())),
            }),
        };
        assert_eq!(
            serde_json::to_value(&input).unwrap(),
            serde_json::json!({"process": {"pid": 7}, "input": {"pty": "bHMN"}})
        );
        let update = UpdateRequest {
            process: Some(select(7)),
            pty: Some(pty_of(PtySize {
                cols: 100,
                rows: 30,
            })),
        };
        assert_eq!(
            serde_json::to_value(&update).unwrap(),
            serde_json::json!({"process": {"pid": 7}, "pty": {"size": {"cols": 100, "rows": 30}}})
        );
    }
}
