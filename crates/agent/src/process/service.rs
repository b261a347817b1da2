//! The `process.Process` RPC handlers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use siesta_envd_proto::process::*;
use tokio::sync::RwLock;

use super::handle::{Process, Subscription};
use super::run::supervise;
use super::spawn::{spawn, SpawnSpec};
use super::table::ProcessTable;
use crate::rpc::{Code, RequestContext, RequestStream, RpcError, RpcStream};
use crate::state::Defaults;
use crate::users::{User, UserDb};

/// Keepalive interval when the client sends no `Keepalive-Ping-Interval`
/// (envd's default).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// PATH when the agent itself has none (as PID 1 it may start without one).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long after a `Start` call's deadline (`connect-timeout-ms`) its
/// process group is killed: the stream's `deadline_exceeded` goes first.
const KILL_AFTER_DEADLINE: Duration = Duration::from_millis(100);

/// The pty size when a client asks for a pty without giving one.
const DEFAULT_PTY: (u16, u16) = (80, 24);

pub struct ProcessService {
    table: Arc<ProcessTable>,
    users: Arc<UserDb>,
    defaults: Arc<RwLock<Defaults>>,
}

impl ProcessService {
    pub fn new(users: Arc<UserDb>, defaults: Arc<RwLock<Defaults>>) -> Self {
        Self {
            table: Arc::default(),
            users,
            defaults,
        }
    }

    pub async fn list(
        &self,
        _ctx: &RequestContext,
        _req: ListRequest,
    ) -> Result<ListResponse, RpcError> {
        let processes = self
            .table
            .all()
            .into_iter()
            .map(|p| ProcessInfo {
                config: Some(p.config.clone()),
                pid: p.pid,
                tag: p.tag.clone(),
            })
            .collect();
        Ok(ListResponse { processes })
    }

    pub async fn start(
        &self,
        ctx: &RequestContext,
        req: StartRequest,
    ) -> Result<RpcStream<StartResponse>, RpcError> {
        let config = req
            .process
            .ok_or_else(|| RpcError::invalid_argument("no process config given"))?;
        if config.cmd.is_empty() {
            return Err(RpcError::invalid_argument("empty cmd"));
        }
        let user = self.users.lookup(&ctx.user)?;
        let defaults = self.defaults.read().await.clone();
        let cwd = resolve_cwd(config.cwd.as_deref(), defaults.workdir.as_deref(), &user)?;
        let mut groups = vec![user.gid];
        groups.extend(self.users.supplementary_gids(&user.name));
        let pty = req.pty.map(|p| {
            p.size
                .map(|s| {
                    (
                        clamp_u16(s.cols, DEFAULT_PTY.0),
                        clamp_u16(s.rows, DEFAULT_PTY.1),
                    )
                })
                .unwrap_or(DEFAULT_PTY)
        });
        let spawned = spawn(SpawnSpec {
            cmd: config.cmd.clone(),
            args: config.args.clone(),
            env: environment(&user, &defaults, &config),
            cwd,
            uid: user.uid,
            gid: user.gid,
            groups,
            // envd pipes stdin unless told not to; older clients omit the field.
            stdin: req.stdin.unwrap_or(true),
            pty,
        })?;
        let pid = spawned.pid;
        tracing::debug!(pid, cmd = %config.cmd, user = %user.name, "started process");
        let process = Arc::new(Process::new(
            pid,
            config,
            req.tag,
            spawned.pty,
            spawned.input,
        ));
        // Attach the caller before any output is forwarded, so it misses none.
        let subscription = process.subscribe();
        self.table.insert(process.clone());
        supervise(
            self.table.clone(),
            process,
            spawned.waiter,
            spawned.output,
            // Just after the call's own deadline ends its stream with
            // deadline_exceeded, so the caller sees the timeout, not a kill.
            ctx.timeout.map(|t| t + KILL_AFTER_DEADLINE),
        );
        Ok(events(pid, subscription, keepalive(ctx), |event| {
            StartResponse { event: Some(event) }
        }))
    }

    pub async fn connect(
        &self,
        ctx: &RequestContext,
        req: ConnectRequest,
    ) -> Result<RpcStream<ConnectResponse>, RpcError> {
        let process = self.table.select(req.process.as_ref())?;
        let subscription = process.subscribe();
        Ok(events(process.pid, subscription, keepalive(ctx), |event| {
            ConnectResponse { event: Some(event) }
        }))
    }

    pub async fn update(
        &self,
        _ctx: &RequestContext,
        req: UpdateRequest,
    ) -> Result<UpdateResponse, RpcError> {
        let process = self.table.select(req.process.as_ref())?;
        if let Some(size) = req.pty.and_then(|p| p.size) {
            let master = process.pty.as_ref().ok_or_else(|| {
                RpcError::new(
                    Code::FailedPrecondition,
                    format!("process {} has no pty", process.pid),
                )
            })?;
            master
                .resize(
                    clamp_u16(size.cols, DEFAULT_PTY.0),
                    clamp_u16(size.rows, DEFAULT_PTY.1),
                )
                .map_err(|e| RpcError::internal(format!("resizing the pty: {e}")))?;
        }
        Ok(UpdateResponse {})
    }

    pub async fn send_input(
        &self,
        _ctx: &RequestContext,
        req: SendInputRequest,
    ) -> Result<SendInputResponse, RpcError> {
        let process = self.table.select(req.process.as_ref())?;
        write(&process, req.input).await?;
        Ok(SendInputResponse {})
    }

    /// A `start{process}` message, then `data` messages until the client
    /// closes its side.
    pub async fn stream_input(
        &self,
        _ctx: &RequestContext,
        mut messages: RequestStream<StreamInputRequest>,
    ) -> Result<StreamInputResponse, RpcError> {
        use stream_input_request::Event;
        let mut process = None;
        while let Some(msg) = messages.message().await? {
            match msg.event {
                Some(Event::Start(start)) => {
                    process = Some(self.table.select(start.process.as_ref())?)
                }
                Some(Event::Data(data)) => {
                    let p = process.as_ref().ok_or_else(|| {
                        RpcError::invalid_argument("input before the start message")
                    })?;
                    write(p, data.input).await?;
                }
                Some(Event::Keepalive(_)) | None => {}
            }
        }
        Ok(StreamInputResponse {})
    }

    pub async fn send_signal(
        &self,
        _ctx: &RequestContext,
        req: SendSignalRequest,
    ) -> Result<SendSignalResponse, RpcError> {
        let process = self.table.select(req.process.as_ref())?;
        match Signal::try_from(req.signal) {
            // SIGKILL takes the whole group, so the children of a shell die
            // with it instead of lingering as orphans.
            Ok(Signal::Sigkill) => process.signal(libc::SIGKILL, true)?,
            Ok(Signal::Sigterm) => process.signal(libc::SIGTERM, false)?,
            _ => {
                return Err(RpcError::invalid_argument(format!(
                    "unsupported signal {}",
                    req.signal
                )))
            }
        }
        Ok(SendSignalResponse {})
    }

    pub async fn close_stdin(
        &self,
        _ctx: &RequestContext,
        req: CloseStdinRequest,
    ) -> Result<CloseStdinResponse, RpcError> {
        let process = self.table.select(req.process.as_ref())?;
        process.close_stdin().await?;
        Ok(CloseStdinResponse {})
    }
}

async fn write(process: &Process, input: Option<ProcessInput>) -> Result<(), RpcError> {
    use process_input::Input;
    match input.and_then(|i| i.input) {
        Some(Input::Stdin(bytes)) | Some(Input::Pty(bytes)) => process.write_input(&bytes).await,
        None => Ok(()),
    }
}

fn keepalive(ctx: &RequestContext) -> Duration {
    ctx.keepalive.unwrap_or(DEFAULT_KEEPALIVE)
}

fn clamp_u16(v: u32, default: u16) -> u16 {
    match v {
        0 => default,
        v => u16::try_from(v).unwrap_or(u16::MAX),
    }
}

/// `PATH`, `HOME`, `USER`, `LOGNAME`, then the `/init` variables, then the
/// request's: later entries win (the command applies them in order).
fn environment(user: &User, defaults: &Defaults, config: &ProcessConfig) -> Vec<(String, String)> {
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
    let mut env = vec![
        ("PATH".to_string(), path),
        ("HOME".to_string(), user.home.display().to_string()),
        ("USER".to_string(), user.name.clone()),
        ("LOGNAME".to_string(), user.name.clone()),
    ];
    let mut sorted = |vars: &std::collections::HashMap<String, String>| {
        let mut kv: Vec<_> = vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        kv.sort();
        env.extend(kv);
    };
    sorted(&defaults.env_vars);
    sorted(&config.envs);
    env
}

/// The working directory: the request's (relative to the user's home, `~`
/// expanded; it must exist), else the `/init` default, else the home.
fn resolve_cwd(
    requested: Option<&str>,
    default: Option<&str>,
    user: &User,
) -> Result<PathBuf, RpcError> {
    let expand = |c: &str| -> PathBuf {
        if c == "~" {
            user.home.clone()
        } else if let Some(rest) = c.strip_prefix("~/") {
            user.home.join(rest)
        } else {
            user.home.join(c) // join keeps absolute paths as they are
        }
    };
    if let Some(c) = requested.filter(|c| !c.is_empty()) {
        let path = expand(c);
        if !path.is_dir() {
            return Err(RpcError::invalid_argument(format!(
                "cwd {c:?} does not exist or is not a directory"
            )));
        }
        return Ok(path);
    }
    let fallback = [default.map(expand), Some(user.home.clone())];
    Ok(fallback
        .into_iter()
        .flatten()
        .find(|p| p.is_dir())
        .unwrap_or_else(|| Path::new("/").to_path_buf()))
}

/// The event stream of one attached client: `start{pid}` first, then live
/// events (or just `end` for a process that already finished), with a
/// `keepalive` after every `keepalive` of silence.
fn events<R: Send + 'static>(
    pid: u32,
    subscription: Subscription,
    keepalive: Duration,
    wrap: fn(ProcessEvent) -> R,
) -> RpcStream<R> {
    use process_event::Event;
    enum State {
        Start(u32, Subscription),
        Live(tokio::sync::mpsc::Receiver<ProcessEvent>),
        Ended(process_event::EndEvent),
        Done,
    }
    let event = |e: Event| ProcessEvent { event: Some(e) };
    futures::stream::unfold(State::Start(pid, subscription), move |state| async move {
        let (next, state) = match state {
            State::Start(pid, sub) => (
                event(Event::Start(process_event::StartEvent { pid })),
                match sub {
                    Subscription::Live(rx) => State::Live(rx),
                    Subscription::Ended(end) => State::Ended(end),
                },
            ),
            State::Ended(end) => (event(Event::End(end)), State::Done),
            State::Live(mut rx) => match tokio::time::timeout(keepalive, rx.recv()).await {
                Err(_) => (
                    event(Event::Keepalive(process_event::KeepAlive {})),
                    State::Live(rx),
                ),
                Ok(Some(ev)) => {
                    let last = matches!(ev.event, Some(Event::End(_)));
                    (ev, if last { State::Done } else { State::Live(rx) })
                }
                Ok(None) => return None,
            },
            State::Done => return None,
        };
        Some((Ok(wrap(next)), state))
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
            shell: "/bin/sh".into(),
        }
    }

    #[test]
    fn cwd_resolution() {
        let u = user();
        assert_eq!(
            resolve_cwd(Some("/tmp"), None, &u).unwrap(),
            Path::new("/tmp")
        );
        assert_eq!(
            resolve_cwd(Some("/no/such/dir"), None, &u)
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        assert_eq!(
            resolve_cwd(None, Some("/tmp"), &u).unwrap(),
            Path::new("/tmp")
        );
        let home_or_root = resolve_cwd(None, Some("/no/such/dir"), &u).unwrap();
        assert!(home_or_root == Path::new("/root") || home_or_root == Path::new("/"));
    }

    #[test]
    fn environment_order() {
        let mut d = Defaults::default();
        d.env_vars.insert("A".into(), "init".into());
        d.env_vars.insert("HOME".into(), "/elsewhere".into());
        let mut c = ProcessConfig::default();
        c.envs.insert("A".into(), "request".into());
        let env = environment(&user(), &d, &c);
        let last = |k: &str| {
            env.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(last("A"), Some("request"));
        assert_eq!(last("HOME"), Some("/elsewhere"));
        assert_eq!(last("USER"), Some("root"));
        assert_eq!(env[0].0, "PATH");
    }
}
