//! `siesta files cp|ls`: files of a running sandbox, through the server's
//! front door as the SDKs reach them.

use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::client::{agent_of, Api};

#[derive(clap::Subcommand)]
pub enum FilesCommand {
    /// Copy a file into or out of a sandbox: one side is `ID:PATH`.
    Cp {
        from: String,
        to: String,
        /// The guest user whose permissions apply.
        #[arg(long, default_value = "user")]
        user: String,
    },
    /// List a directory of a sandbox.
    Ls {
        id: String,
        #[arg(default_value = ".")]
        path: String,
        #[arg(long, default_value = "user")]
        user: String,
        /// Print envd's entries as one JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `ID:PATH` (a sandbox's or a volume's) split in two, if `arg` is one (a
/// local path with a colon must start with `./` or `/`).
pub(crate) fn remote(arg: &str) -> Option<(&str, &str)> {
    if arg.starts_with('/') || arg.starts_with('.') {
        return None;
    }
    arg.split_once(':')
        .filter(|(id, path)| !id.is_empty() && !path.is_empty())
}

pub async fn run(cmd: FilesCommand) -> anyhow::Result<ExitCode> {
    let api = Api::from_env()?;
    match cmd {
        FilesCommand::Cp { from, to, user } => match (remote(&from), remote(&to)) {
            (None, Some((id, path))) => {
                let body = std::fs::read(&from).with_context(|| format!("reading {from}"))?;
                agent_of(&api, id).await?.upload(path, &user, body).await?;
            }
            (Some((id, path)), None) => {
                let body = agent_of(&api, id).await?.download(path, &user).await?;
                std::fs::write(&to, body).with_context(|| format!("writing {to}"))?;
            }
            _ => bail!("give one side as ID:PATH and the other as a local path"),
        },
        FilesCommand::Ls {
            id,
            path,
            user,
            json,
        } => {
            let entries = agent_of(&api, &id).await?.list_dir(&path, &user).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                for e in &entries {
                    let kind = match e["type"].as_str() {
                        Some("FILE_TYPE_DIRECTORY") => "dir",
                        Some("FILE_TYPE_FILE") => "file",
                        _ => "other",
                    };
                    let size = e["size"].as_str().map_or_else(
                        || e["size"].as_u64().unwrap_or(0).to_string(),
                        str::to_string,
                    );
                    println!(
                        "{kind:<5} {size:>12}  {}",
                        e["name"].as_str().unwrap_or("?")
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::remote;

    #[test]
    fn remote_paths_are_id_colon_path() {
        assert_eq!(remote("abc:/tmp/x"), Some(("abc", "/tmp/x")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/tmp/a:b"), None);
        assert_eq!(remote("local.txt"), None);
        assert_eq!(remote(":x"), None);
    }
}
