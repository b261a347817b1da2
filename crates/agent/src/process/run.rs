//! A process's life after spawning: forwarding output, the optional
//! lifetime limit, collecting the exit status and reporting `end`.

use std::io;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use siesta_envd_proto::process::process_event::{self, data_event};
use siesta_envd_proto::process::ProcessEvent;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::handle::Process;
use super::pty::PtyMaster;
use super::spawn::{status_string, Output, Waiter};
use super::table::ProcessTable;

/// Read size for pipes, as in envd.
const PIPE_CHUNK: usize = 32 * 1024;
/// Read size for a pty, as in envd.
const PTY_CHUNK: usize = 16 * 1024;
/// After the process exited, output readers stop at the first pause this
/// long. Waiting for EOF instead would hang whenever a background child
/// (`sleep 100 &`) inherited the pipe and keeps it open.
const DRAIN_QUIET: Duration = Duration::from_millis(50);

/// Runs the process to its end in the background, independent of any
/// request: a client disconnecting does not stop it. With `limit`, the
/// process group is killed when it elapses (`connect-timeout-ms` on `Start`).
pub fn supervise(
    table: Arc<ProcessTable>,
    process: Arc<Process>,
    waiter: Waiter,
    output: Output,
    limit: Option<Duration>,
) {
    let (exited_tx, exited_rx) = watch::channel(false);
    let readers: Vec<JoinHandle<()>> = match output {
        Output::Pipes { stdout, stderr } => vec![
            forward(
                process.clone(),
                exited_rx.clone(),
                Source::Pipe(Box::new(stdout)),
                data_event::Output::Stdout,
            ),
            forward(
                process.clone(),
                exited_rx,
                Source::Pipe(Box::new(stderr)),
                data_event::Output::Stderr,
            ),
        ],
        Output::Pty(master) => vec![forward(
            process.clone(),
            exited_rx,
            Source::Pty(master),
            data_event::Output::Pty,
        )],
    };

    tokio::spawn(async move {
        let wait = waiter.wait();
        tokio::pin!(wait);
        let status = match limit {
            Some(limit) => tokio::select! {
                status = &mut wait => status,
                _ = tokio::time::sleep(limit) => {
                    tracing::debug!(pid = process.pid, "lifetime limit reached, killing the process group");
                    let _ = process.signal(libc::SIGKILL, true);
                    wait.await
                }
            },
            None => wait.await,
        };
        process.mark_exited();
        let _ = exited_tx.send(true);
        for r in readers {
            let _ = r.await;
        }
        process.finish(end_event(status)).await;
        table.remove(&process);
    });
}

/// Where a forwarder reads output from.
enum Source {
    Pipe(Box<dyn AsyncRead + Unpin + Send>),
    Pty(Arc<PtyMaster>),
}

impl Source {
    fn chunk(&self) -> usize {
        match self {
            Source::Pipe(_) => PIPE_CHUNK,
            Source::Pty(_) => PTY_CHUNK,
        }
    }

    /// Cancel-safe: nothing is consumed unless the read completes.
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::Pipe(r) => r.read(buf).await,
            Source::Pty(m) => m.read(buf).await,
        }
    }
}

/// Reads chunks and publishes them as `data` events until EOF, or, once the
/// process has exited, until the output goes quiet.
fn forward(
    process: Arc<Process>,
    mut exited: watch::Receiver<bool>,
    mut source: Source,
    wrap: fn(Vec<u8>) -> data_event::Output,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; source.chunk()];
        loop {
            let n = if *exited.borrow() {
                match tokio::time::timeout(DRAIN_QUIET, source.read(&mut buf)).await {
                    Ok(n) => n,
                    Err(_) => return,
                }
            } else {
                tokio::select! {
                    n = source.read(&mut buf) => n,
                    changed = exited.changed() => {
                        // Only a panicked supervisor drops the sender.
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
            };
            let n = match n {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let event = ProcessEvent {
                event: Some(process_event::Event::Data(process_event::DataEvent {
                    output: Some(wrap(buf[..n].to_vec())),
                })),
            };
            process.publish(event).await;
        }
    })
}

/// The `end` event as envd reports it (Go's `ProcessState` semantics).
pub fn end_event(status: io::Result<ExitStatus>) -> process_event::EndEvent {
    match status {
        Ok(status) => {
            let text = status_string(&status);
            let exit_code = status.code().unwrap_or(-1);
            process_event::EndEvent {
                exit_code,
                exited: status.code().is_some(),
                error: (!status.success()).then(|| text.clone()),
                status: text,
            }
        }
        Err(e) => process_event::EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".to_string(),
            error: Some(format!("waiting for the process: {e}")),
        },
    }
}
