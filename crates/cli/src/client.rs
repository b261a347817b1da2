//! `siesta sandbox ...`: talks to the running server's API.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use siesta_envd_client::EnvdClient;

#[derive(clap::Subcommand)]
pub enum SandboxCommand {
    /// Resume a new sandbox from a template.
    Create {
        #[arg(long, default_value = "base")]
        template: String,
    },
    /// List sandboxes.
    List {
        /// Print the server's JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox, streaming its output; exits with its code.
    Exec {
        id: String,
        /// Run as this user (default: the sandbox's default user).
        #[arg(long)]
        user: Option<String>,
        /// Run the words as one `bash -l -c` command line (pipes,
        /// redirections) instead of as a program and its arguments.
        #[arg(long)]
        shell: bool,
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// An interactive login shell in the sandbox, in a terminal sized like
    /// this one (raw mode; Ctrl-C goes to the sandbox); exits with the
    /// shell's code. With stdin not a terminal, the input is typed into the
    /// shell, followed by an end-of-file.
    Attach {
        id: String,
        /// The shell to run (started with -i -l).
        #[arg(long, default_value = "/bin/bash")]
        shell: String,
        /// Run as this user (default: the sandbox's default user).
        #[arg(long)]
        user: Option<String>,
    },
    /// Pause a sandbox to disk.
    Pause { id: String },
    /// Resume a paused sandbox.
    Resume { id: String },
    /// Snapshot a running sandbox (it runs on); prints the snapshot's id,
    /// which `sandbox create --template ID` starts new sandboxes from.
    Snapshot {
        id: String,
        /// A name to find the snapshot by, instead of its id.
        #[arg(long)]
        name: Option<String>,
    },
    /// Copy a running sandbox into N new ones (it runs on); prints each
    /// child's id, or its error.
    Fork {
        id: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Stop a sandbox and delete its files.
    Kill { id: String },
}

pub(crate) struct Api {
    pub(crate) base: String,
    key: String,
    http: reqwest::Client,
}

impl Api {
    pub(crate) fn from_env() -> anyhow::Result<Self> {
        let base = std::env::var("SIESTA_URL").unwrap_or_else(|_| "http://127.0.0.1:3000".into());
        let key = match std::env::var("SIESTA_API_KEY") {
            Ok(k) => k,
            Err(_) => {
                let home =
                    std::env::var("SIESTA_HOME").unwrap_or_else(|_| "/var/lib/siesta".into());
                let path = format!("{home}/secrets/api-key");
                std::fs::read_to_string(&path)
                    .with_context(|| format!("reading the API key {path} (or set SIESTA_API_KEY)"))?
                    .trim()
                    .to_string()
            }
        };
        let http = reqwest::Client::builder().no_proxy().build()?;
        Ok(Self { base, key, http })
    }

    /// The HTTP client, for calls that are not JSON (volume content).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-API-KEY", &self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.with_context(|| {
            format!(
                "no siesta server at {} (start it with `make up` or `siesta serve`)",
                self.base
            )
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status >= 400 {
            let msg = value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or(&text);
            bail!("server answered {status}: {msg}");
        }
        Ok((status, value))
    }
}

pub async fn run(cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    let api = Api::from_env()?;
    use reqwest::Method;
    match cmd {
        SandboxCommand::Create { template } => {
            let body = json!({"templateID": template, "metadata": {}, "envVars": {}});
            let (_, v) = api.call(Method::POST, "/v2/sandboxes", Some(body)).await?;
            println!("{}", v["sandboxID"].as_str().unwrap_or_default());
        }
        SandboxCommand::List { json } => {
            let (_, v) = api
                .call(
                    Method::GET,
                    "/v2/sandboxes?state=running%2Cpaused%2Cdead&limit=1000",
                    None,
                )
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<22} {:<12} {:<8} STARTED", "ID", "TEMPLATE", "STATE");
            for s in v.as_array().into_iter().flatten() {
                println!(
                    "{:<22} {:<12} {:<8} {}",
                    s["sandboxID"].as_str().unwrap_or("?"),
                    s["templateID"].as_str().unwrap_or("?"),
                    s["state"].as_str().unwrap_or("?"),
                    s["startedAt"].as_str().unwrap_or("?"),
                );
            }
        }
        SandboxCommand::Exec {
            id,
            user,
            shell,
            command,
        } => return exec(&api, &id, user, shell, &command).await,
        SandboxCommand::Attach { id, shell, user } => {
            return crate::attach::attach(&api, &id, &shell, user.as_deref()).await
        }
        SandboxCommand::Pause { id } => {
            api.call(
                Method::POST,
                &format!("/sandboxes/{id}/pause"),
                Some(json!({})),
            )
            .await?;
            println!("{id} paused");
        }
        SandboxCommand::Resume { id } => {
            let (status, _) = api
                .call(
                    Method::POST,
                    &format!("/v2/sandboxes/{id}/connect"),
                    Some(json!({})),
                )
                .await?;
            println!(
                "{id} {}",
                if status == 201 {
                    "resumed"
                } else {
                    "was running"
                }
            );
        }
        SandboxCommand::Snapshot { id, name } => {
            let (_, v) = api
                .call(
                    Method::POST,
                    &format!("/sandboxes/{id}/snapshots"),
                    Some(json!({ "name": name })),
                )
                .await?;
            println!("{}", v["snapshotID"].as_str().unwrap_or_default());
        }
        SandboxCommand::Fork { id, count } => return fork(&api, &id, count).await,
        SandboxCommand::Kill { id } => {
            api.call(Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await?;
            println!("{id} killed");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn fork(api: &Api, id: &str, count: u32) -> anyhow::Result<ExitCode> {
    let (_, v) = api
        .call(
            reqwest::Method::POST,
            &format!("/sandboxes/{id}/fork"),
            Some(json!({ "count": count })),
        )
        .await?;
    let mut failed = 0;
    for child in v.as_array().into_iter().flatten() {
        match child["sandbox"]["sandboxID"].as_str() {
            Some(child_id) => println!("{child_id}"),
            None => {
                failed += 1;
                eprintln!("a child failed: {}", child["error"]["message"]);
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A client for running sandbox `id`'s agent through the server's front
/// door, with the sandbox's access token.
pub(crate) async fn agent_of(api: &Api, id: &str) -> anyhow::Result<EnvdClient> {
    let (_, v) = api
        .call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .with_context(|| format!("looking up sandbox {id}"))?;
    match v["state"].as_str() {
        Some("running") => {}
        Some("paused") => {
            bail!("sandbox {id} is paused; resume it first: siesta sandbox resume {id}")
        }
        state => bail!(
            "sandbox {id} is {}, not running",
            state.unwrap_or("in no known state")
        ),
    }
    let token = v["envdAccessToken"].as_str().map(str::to_string);
    Ok(EnvdClient::through_front_door(id, &api.base, token)?)
}

/// Runs `command` in sandbox `id` through the server's front door (so it
/// works wherever the API does), streaming its output.
async fn exec(
    api: &Api,
    id: &str,
    user: Option<String>,
    shell: bool,
    command: &[String],
) -> anyhow::Result<ExitCode> {
    let client = agent_of(api, id).await?;
    let on_output = |is_stdout: bool, bytes: &[u8]| {
        if is_stdout {
            let _ = std::io::stdout().write_all(bytes);
            let _ = std::io::stdout().flush();
        } else {
            let _ = std::io::stderr().write_all(bytes);
        }
    };
    let out = if shell {
        client
            .exec(&command.join(" "), user.as_deref(), on_output)
            .await?
    } else {
        let (program, args) = command.split_first().context("no command given")?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        client
            .run(program, &args, user.as_deref(), on_output)
            .await?
    };
    Ok(ExitCode::from(out.exit_code.clamp(0, 255) as u8))
}
