//! `siesta volume ...`: volumes through the server, as the SDK's `Volume`
//! reaches them (the control API with the node's key, the content API with
//! the volume's own token).

use std::process::ExitCode;

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::Api;
use crate::files::remote;

#[derive(clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a volume; prints its id.
    Create {
        name: String,
        /// Size limit in MiB (default: the server's `--volume-size-mib`).
        #[arg(long)]
        size_mib: Option<u64>,
    },
    /// List volumes.
    List {
        /// Print the server's JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and every file in it.
    Rm { volume: String },
    /// Copy a file into or out of a volume: one side is `VOLUME:PATH`.
    Cp {
        from: String,
        to: String,
        /// Replace a file that is already there.
        #[arg(long)]
        force: bool,
    },
    /// List a directory of a volume.
    Ls {
        volume: String,
        #[arg(default_value = "/")]
        path: String,
        /// Print the entries as one JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: VolumeCommand) -> anyhow::Result<ExitCode> {
    let api = Api::from_env()?;
    match cmd {
        VolumeCommand::Create { name, size_mib } => {
            let body = json!({"name": name, "sizeLimitMB": size_mib});
            let (_, v) = api.call(Method::POST, "/volumes", Some(body)).await?;
            println!("{}", v["volumeID"].as_str().unwrap_or_default());
        }
        VolumeCommand::List { json } => {
            let (_, v) = api.call(Method::GET, "/volumes", None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<26} {:<24} {:>10} CREATED", "ID", "NAME", "LIMIT MiB");
            for vol in v.as_array().into_iter().flatten() {
                println!(
                    "{:<26} {:<24} {:>10} {}",
                    vol["volumeID"].as_str().unwrap_or("?"),
                    vol["name"].as_str().unwrap_or("?"),
                    vol["sizeLimitMB"].as_u64().unwrap_or(0),
                    vol["createdAt"].as_str().unwrap_or("?"),
                );
            }
        }
        VolumeCommand::Rm { volume } => {
            api.call(Method::DELETE, &format!("/volumes/{volume}"), None)
                .await?;
            println!("{volume} deleted");
        }
        VolumeCommand::Cp { from, to, force } => match (remote(&from), remote(&to)) {
            (None, Some((vol, path))) => {
                let body = std::fs::read(&from).with_context(|| format!("reading {from}"))?;
                let content = Content::of(&api, vol).await?;
                let force = if force { "true" } else { "false" };
                content
                    .send(
                        Method::PUT,
                        "file",
                        &[("path", path), ("force", force)],
                        body,
                    )
                    .await?;
            }
            (Some((vol, path)), None) => {
                let content = Content::of(&api, vol).await?;
                let body = content
                    .send(Method::GET, "file", &[("path", path)], Vec::new())
                    .await?;
                std::fs::write(&to, body).with_context(|| format!("writing {to}"))?;
            }
            _ => bail!("give one side as VOLUME:PATH and the other as a local path"),
        },
        VolumeCommand::Ls { volume, path, json } => {
            let content = Content::of(&api, &volume).await?;
            let body = content
                .send(Method::GET, "dir", &[("path", &path)], Vec::new())
                .await?;
            let entries: Value = serde_json::from_slice(&body).context("the server's listing")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
                return Ok(ExitCode::SUCCESS);
            }
            for e in entries.as_array().into_iter().flatten() {
                println!(
                    "{:<9} {:>5o} {:>5}:{:<5} {:>12} {}",
                    e["type"].as_str().unwrap_or("?"),
                    e["mode"].as_u64().unwrap_or(0),
                    e["uid"].as_u64().unwrap_or(0),
                    e["gid"].as_u64().unwrap_or(0),
                    e["size"].as_u64().unwrap_or(0),
                    e["path"].as_str().unwrap_or("?"),
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The content API of one volume.
struct Content<'a> {
    api: &'a Api,
    id: String,
    token: String,
}

impl<'a> Content<'a> {
    /// Looks the volume up (by id or name) for its id and token.
    async fn of(api: &'a Api, volume: &str) -> anyhow::Result<Self> {
        let (_, v) = api
            .call(Method::GET, &format!("/volumes/{volume}"), None)
            .await?;
        let field = |name: &str| {
            v[name]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("the server's volume has no {name}"))
        };
        Ok(Self {
            api,
            id: field("volumeID")?,
            token: field("token")?,
        })
    }

    async fn send(
        &self,
        method: Method,
        what: &str,
        query: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<Vec<u8>> {
        let url = format!("{}/volumecontent/{}/{what}", self.api.base, self.id);
        let resp = self
            .api
            .http()
            .request(method, url)
            .bearer_auth(&self.token)
            .query(query)
            .body(body)
            .send()
            .await
            .with_context(|| format!("no siesta server at {}", self.api.base))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.context("reading the server's answer")?;
        if status >= 400 {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let msg = v["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            bail!("server answered {status}: {msg}");
        }
        Ok(bytes.to_vec())
    }
}
