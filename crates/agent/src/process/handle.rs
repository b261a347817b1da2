//! One tracked process: its config, its input, and the fan-out of its events
//! to every attached stream (the `Start` caller and any `Connect` callers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use siesta_envd_proto::process::{process_event, ProcessConfig, ProcessEvent};
use tokio::sync::mpsc;

use super::pty::PtyMaster;
use super::spawn::Input;
use crate::rpc::{Code, RpcError};

/// Events buffered per attached stream before the process's output readers
/// wait for that stream: backpressure instead of dropped output.
const SUBSCRIBER_BUFFER: usize = 64;

pub struct Process {
    pub pid: u32,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub pty: Option<Arc<PtyMaster>>,
    input: tokio::sync::Mutex<Option<Input>>,
    fanout: Mutex<Fanout>,
    /// Set once the exit status was collected: the pid may be reused from
    /// then on, so it must not be signalled any more.
    exited: AtomicBool,
}

#[derive(Default)]
struct Fanout {
    subscribers: Vec<mpsc::Sender<ProcessEvent>>,
    end: Option<process_event::EndEvent>,
}

/// What attaching to a process yields.
pub enum Subscription {
    /// Live events up to and including `end`.
    Live(mpsc::Receiver<ProcessEvent>),
    /// The process already ended: only its `end` is left to report.
    Ended(process_event::EndEvent),
}

impl Process {
    pub fn new(
        pid: u32,
        config: ProcessConfig,
        tag: Option<String>,
        pty: Option<Arc<PtyMaster>>,
        input: Option<Input>,
    ) -> Self {
        Self {
            pid,
            config,
            tag,
            pty,
            input: tokio::sync::Mutex::new(input),
            fanout: Mutex::default(),
            exited: AtomicBool::new(false),
        }
    }

    fn fanout(&self) -> MutexGuard<'_, Fanout> {
        // A panic elsewhere must not wedge the process table.
        self.fanout.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self) -> Subscription {
        let mut f = self.fanout();
        if let Some(end) = &f.end {
            return Subscription::Ended(end.clone());
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        f.subscribers.push(tx);
        Subscription::Live(rx)
    }

    /// Delivers `event` to every attached stream, waiting for slow ones;
    /// streams whose client went away are dropped.
    pub async fn publish(&self, event: ProcessEvent) {
        let subscribers = self.fanout().subscribers.clone();
        for tx in &subscribers {
            let _ = tx.send(event.clone()).await;
        }
        self.fanout().subscribers.retain(|tx| !tx.is_closed());
    }

    /// Delivers the final `end` event; later subscribers get it from
    /// [`Subscription::Ended`].
    pub async fn finish(&self, end: process_event::EndEvent) {
        let subscribers = {
            let mut f = self.fanout();
            f.end = Some(end.clone());
            std::mem::take(&mut f.subscribers)
        };
        let event = ProcessEvent {
            event: Some(process_event::Event::End(end)),
        };
        for tx in subscribers {
            let _ = tx.send(event.clone()).await;
        }
    }

    pub fn mark_exited(&self) {
        self.exited.store(true, Ordering::SeqCst);
    }

    /// Sends `signal` to the process, or to its whole process group (the
    /// process leads its own session, so the group is everything it started
    /// that did not move away).
    pub fn signal(&self, signal: i32, group: bool) -> Result<(), RpcError> {
        if self.exited.load(Ordering::SeqCst) {
            return Err(RpcError::not_found(format!(
                "process {} already exited",
                self.pid
            )));
        }
        let pid = self.pid as libc::pid_t;
        // SAFETY: plain syscalls on a pid we spawned and have not reaped.
        let rc = unsafe {
            if group && libc::kill(-pid, signal) == 0 {
                0
            } else {
                libc::kill(pid, signal)
            }
        };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            return Err(if err.raw_os_error() == Some(libc::ESRCH) {
                RpcError::not_found(format!("process {} not found", self.pid))
            } else {
                RpcError::internal(format!("signal process {}: {err}", self.pid))
            });
        }
        Ok(())
    }

    /// Writes to stdin (pipe) or to the terminal (pty). `pty` says which the
    /// client meant; the bytes go wherever the process reads input.
    pub async fn write_input(&self, data: &[u8]) -> Result<(), RpcError> {
        use tokio::io::AsyncWriteExt;
        let mut input = self.input.lock().await;
        let result = match input.as_mut() {
            None => {
                return Err(RpcError::new(
                    Code::FailedPrecondition,
                    format!(
                        "process {} has no open stdin (start it with stdin: true)",
                        self.pid
                    ),
                ))
            }
            Some(Input::Pipe(stdin)) => match stdin.write_all(data).await {
                Ok(()) => stdin.flush().await,
                Err(e) => Err(e),
            },
            Some(Input::Pty(master)) => master.write_all(data).await,
        };
        result
            .map_err(|e| RpcError::internal(format!("writing input of process {}: {e}", self.pid)))
    }

    /// Closes stdin so the process reads EOF. A pty has no separate stdin to
    /// close; there the client sends EOT (^D) as input instead.
    pub async fn close_stdin(&self) -> Result<(), RpcError> {
        let mut input = self.input.lock().await;
        match input.as_ref() {
            Some(Input::Pty(_)) => Err(RpcError::new(
                Code::FailedPrecondition,
                "cannot close stdin of a pty process; send EOT (\\x04) instead",
            )),
            _ => {
                // Dropping the pipe closes it; closing twice is harmless.
                input.take();
                Ok(())
            }
        }
    }
}
