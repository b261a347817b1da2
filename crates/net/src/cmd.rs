//! Running `ip`/`nft`/`sysctl`: every failure becomes a [`NetError`] naming
//! the scope, the command line and its stderr.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::error::{NetError, Result};

/// Runs `program args...`, optionally feeding `stdin`, and returns stdout.
pub(crate) async fn run(
    scope: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String> {
    let command = render(program, args);
    let spawn_err = |source| NetError::Spawn {
        scope: scope.to_owned(),
        command: command.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_err)?;
    if let Some(input) = stdin {
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(input.as_bytes()).await.map_err(spawn_err)?;
            // Dropping the pipe closes it so the program sees EOF.
        }
    }
    let out = child.wait_with_output().await.map_err(spawn_err)?;
    if !out.status.success() {
        return Err(NetError::Command {
            scope: scope.to_owned(),
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip ARGS...`
pub(crate) async fn ip(scope: &str, args: &[&str]) -> Result<String> {
    run(scope, "ip", args, None).await
}

/// `ip -n NETNS ARGS...`
pub(crate) async fn ip_in(scope: &str, netns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["-n", netns];
    full.extend_from_slice(args);
    run(scope, "ip", &full, None).await
}

/// `nft -f -` with `script` on stdin, in the root namespace or in `netns`.
pub(crate) async fn nft(scope: &str, netns: Option<&str>, script: &str) -> Result<String> {
    match netns {
        None => run(scope, "nft", &["-f", "-"], Some(script)).await,
        Some(ns) => {
            run(
                scope,
                "ip",
                &["netns", "exec", ns, "nft", "-f", "-"],
                Some(script),
            )
            .await
        }
    }
}

fn render(program: &str, args: &[&str]) -> String {
    let mut s = program.to_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn failure_names_scope_command_and_stderr() {
        let err = run(
            "slot 3 (siesta-t-3)",
            "sh",
            &["-c", "echo boom >&2; exit 3"],
            None,
        )
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("slot 3 (siesta-t-3): `sh -c echo boom >&2; exit 3` failed"));
        assert!(msg.ends_with(": boom"), "{msg}");
        let missing = run("pool t", "/nonexistent/ip", &[], None)
            .await
            .unwrap_err();
        assert!(matches!(missing, NetError::Spawn { .. }), "{missing}");
        let out = run("pool t", "cat", &[], Some("table ip x\n"))
            .await
            .unwrap();
        assert_eq!(out, "table ip x\n");
    }
}
