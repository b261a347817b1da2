//! `siesta sandbox attach ID`: an interactive login shell in a pty in the
//! sandbox, through the server's front door.
//!
//! The local terminal goes into raw mode, so every key (Ctrl-C included)
//! reaches the remote shell as a byte and the remote pty does the echo and
//! line editing. Local stdin is read on a thread of its own and sent with
//! `SendInput`; the pty's output is copied to stdout; a local resize
//! (SIGWINCH) is sent with `Update`. When stdin is not a terminal (a pipe,
//! a test), nothing is put in raw mode, the size is `$COLUMNS`x`$LINES` or
//! 80x24, and at the end of the input the shell gets an end-of-file
//! (Ctrl-D), so it exits once it has run what it read.

use std::collections::HashMap;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::process::ExitCode;

use anyhow::Context;
use nix::sys::termios::{self, SetArg, Termios};
use siesta_envd_client::{EnvdClient, PtyEvent, PtySession, PtySize, PtySpec};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use crate::client::{agent_of, Api};

/// The size of a terminal that does not say, as most programs assume.
const DEFAULT_SIZE: PtySize = PtySize { cols: 80, rows: 24 };

/// Most bytes of input sent in one `SendInput`: a paste goes in a few
/// calls, not one per read.
const MAX_BATCH: usize = 64 * 1024;

/// End of file at the start of a line, for a shell in a pty.
const CTRL_D: &[u8] = b"\x04";

/// Runs an interactive `shell` in sandbox `id` as `user` and returns its
/// exit code.
pub async fn attach(
    api: &Api,
    id: &str,
    shell: &str,
    user: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let client = agent_of(api, id).await?;
    let interactive = std::io::stdin().is_terminal();
    let spec = PtySpec {
        cmd: shell.to_string(),
        // A login shell reads the profile (PATH, prompt) as an ssh
        // session's does; -i because its stdin is a terminal either way.
        args: vec!["-i".into(), "-l".into()],
        envs: environment(interactive),
        user: user.map(str::to_string),
        size: local_size().unwrap_or_else(size_from_env),
    };
    let session = client
        .start_pty(&spec)
        .await
        .with_context(|| format!("starting {shell} in sandbox {id}"))?;
    // Raw only once the remote shell runs: an error before leaves the
    // terminal as it was. The guard restores it however this returns.
    let raw = if interactive {
        Some(RawMode::enable().context("putting the terminal in raw mode")?)
    } else {
        None
    };
    let pid = session.pid();
    let outcome = pump(&client, session, interactive).await;
    drop(raw);
    match outcome {
        Ok(Ended::Exited(code)) => Ok(exit_code(code)),
        Ok(Ended::Left(signo)) => {
            kill_quietly(&client, pid).await;
            eprintln!("siesta: left sandbox {id} on signal {signo}; its shell was killed");
            Ok(ExitCode::from(128u8.saturating_add(signo)))
        }
        Err(e) => {
            kill_quietly(&client, pid).await;
            Err(e.context(format!("attached to sandbox {id}")))
        }
    }
}

/// How a session ended.
enum Ended {
    /// The remote process exited with this code.
    Exited(i32),
    /// A signal told this process to go (SIGINT, SIGTERM, SIGHUP) first.
    Left(u8),
}

/// Copies input to the pty and its output to stdout until the remote
/// process ends (or a signal says to leave).
async fn pump(
    client: &EnvdClient,
    mut session: PtySession,
    interactive: bool,
) -> anyhow::Result<Ended> {
    let pid = session.pid();
    let mut signals = Signals::new()?;
    let mut input = spawn_input(client.clone(), pid, interactive);
    // An input error after the process has ended is expected (nothing to
    // send to); it only matters if the output stream fails too.
    let mut input_error: Option<anyhow::Error> = None;
    let mut input_done = false;
    let mut exit: Option<i32> = None;
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            event = session.next_event() => match event {
                Ok(Some(PtyEvent::Output(bytes))) => {
                    stdout.write_all(&bytes).context("writing to stdout")?;
                    stdout.flush().context("writing to stdout")?;
                }
                Ok(Some(PtyEvent::Exit(code))) => exit = Some(code),
                Ok(None) => break,
                // The code came; a broken end-of-stream loses nothing.
                Err(_) if exit.is_some() => break,
                Err(e) => {
                    let e = anyhow::Error::new(e);
                    return Err(match input_error {
                        Some(first) => e.context(format!("after input failed: {first:#}")),
                        None => e,
                    });
                }
            },
            done = &mut input, if !input_done => {
                input_done = true;
                match done {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => input_error = Some(e),
                    Err(e) => input_error = Some(anyhow::anyhow!("input task: {e}")),
                }
            }
            _ = signals.winch.recv() => {
                if let Some(size) = local_size() {
                    // A lost resize only leaves the old size; not worth
                    // ending the session for.
                    let _ = client.pty_resize(pid, size).await;
                }
            }
            _ = signals.int.recv() => return Ok(Ended::Left(libc::SIGINT as u8)),
            _ = signals.term.recv() => return Ok(Ended::Left(libc::SIGTERM as u8)),
            _ = signals.hup.recv() => return Ok(Ended::Left(libc::SIGHUP as u8)),
        }
    }
    input.abort();
    exit.map(Ended::Exited)
        .context("the shell's stream ended without its exit code")
}

/// Forwards local stdin to the pty of `pid`, batching what has arrived,
/// until stdin ends; then, when it is not a terminal, sends Ctrl-D.
fn spawn_input(
    client: EnvdClient,
    pid: u32,
    interactive: bool,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    // A plain thread, not tokio's stdin: a blocking read of a terminal
    // cannot be cancelled, and tokio's runtime would wait for it at exit
    // (until the user pressed a key). This thread just dies with the
    // process.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    });
    tokio::spawn(async move {
        while let Some(mut batch) = rx.recv().await {
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(more) => batch.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
            client
                .pty_input(pid, &batch)
                .await
                .context("sending input")?;
        }
        if !interactive {
            client
                .pty_input(pid, CTRL_D)
                .await
                .context("sending end of input")?;
        }
        Ok(())
    })
}

/// The signals a session watches.
struct Signals {
    winch: Signal,
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        let on = |kind: SignalKind| signal(kind).context("installing a signal handler");
        Ok(Self {
            winch: on(SignalKind::window_change())?,
            // In raw mode Ctrl-C is a byte, not SIGINT; a SIGINT that still
            // comes was sent on purpose (or stdin is not a terminal), and
            // means leave.
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        })
    }
}

/// The remote shell's environment: what a terminal program needs to draw.
fn environment(interactive: bool) -> HashMap<String, String> {
    let term = match std::env::var("TERM") {
        Ok(t) if interactive && !t.is_empty() => t,
        // The E2B SDK's choice for a terminal that does not say.
        _ if interactive => "xterm-256color".into(),
        // Output read by a program: no colours, no bracketed-paste codes.
        _ => "dumb".into(),
    };
    HashMap::from([
        ("TERM".to_string(), term),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ])
}

/// The size of the local terminal (stdin's, else stdout's), if either is one.
fn local_size() -> Option<PtySize> {
    [std::io::stdin().as_raw_fd(), std::io::stdout().as_raw_fd()]
        .into_iter()
        .find_map(|fd| {
            let mut ws = libc::winsize {
                ws_row: 0,
                ws_col: 0,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own;
            // on a descriptor that is no terminal it fails and writes nothing.
            let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
            (rc == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some(PtySize {
                cols: ws.ws_col,
                rows: ws.ws_row,
            })
        })
}

/// `$COLUMNS` x `$LINES`, or 80x24 where they are unset or not numbers.
fn size_from_env() -> PtySize {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|n| *n > 0)
    };
    PtySize {
        cols: var("COLUMNS").unwrap_or(DEFAULT_SIZE.cols),
        rows: var("LINES").unwrap_or(DEFAULT_SIZE.rows),
    }
}

/// The remote code as this process's: 0-255 as is; anything else (a shell
/// killed by a signal reports -1) is a failure.
fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(c) => ExitCode::from(c),
        Err(_) => ExitCode::FAILURE,
    }
}

/// Kills the remote process of a session this side is leaving, so no shell
/// waits in the sandbox for input nobody will send. Best effort: the
/// sandbox may be gone, which is why the session ended.
async fn kill_quietly(client: &EnvdClient, pid: u32) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), client.kill_process(pid)).await;
}

/// The local terminal in raw mode for as long as this lives; the settings
/// it had are put back on drop (normal return, error or panic).
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enable() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).context("reading the terminal's settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSADRAIN, &raw)
            .context("changing the terminal's settings")?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing to report to if this fails: the terminal is going away.
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_codes_map_to_local_ones() {
        assert_eq!(exit_code(0), ExitCode::SUCCESS);
        assert_eq!(exit_code(3), ExitCode::from(3));
        assert_eq!(exit_code(-1), ExitCode::FAILURE);
        assert_eq!(exit_code(300), ExitCode::FAILURE);
    }

    #[test]
    fn piped_sessions_ask_for_a_plain_terminal() {
        assert_eq!(environment(false)["TERM"], "dumb");
        assert_eq!(environment(false)["LANG"], "C.UTF-8");
    }
}
