//! The parts of an image's configuration a template keeps as its defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `Env`, `WorkingDir`, `User`, `Entrypoint`, `Cmd` and `ExposedPorts` of
/// an image config, as the template's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// Environment in the image's order (`PATH` among them).
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `8080/tcp` and the like.
    pub exposed_ports: Vec<String>,
    /// `os` and `architecture` of the config (`linux`, `amd64`).
    pub platform: String,
}

#[derive(Deserialize, Default)]
struct ConfigFile {
    #[serde(default)]
    config: Option<RunConfig>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    architecture: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    env: Option<Vec<String>>,
    working_dir: Option<String>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
}

impl ImageConfig {
    /// Parses an image config blob (OCI or Docker; both use these names).
    pub fn parse(json: &[u8]) -> Result<Self, serde_json::Error> {
        let file: ConfigFile = serde_json::from_slice(json)?;
        let run = file.config.unwrap_or_default();
        let env = run
            .env
            .unwrap_or_default()
            .into_iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (kv, String::new()),
            })
            .collect();
        let non_empty = |s: Option<String>| s.filter(|s| !s.trim().is_empty());
        Ok(ImageConfig {
            env,
            workdir: non_empty(run.working_dir),
            user: non_empty(run.user),
            entrypoint: run.entrypoint.unwrap_or_default(),
            cmd: run.cmd.unwrap_or_default(),
            exposed_ports: run.exposed_ports.unwrap_or_default().into_keys().collect(),
            platform: format!(
                "{}/{}",
                file.os.unwrap_or_else(|| "linux".into()),
                file.architecture.unwrap_or_else(|| "amd64".into())
            ),
        })
    }

    /// The image's start command, `Entrypoint` followed by `Cmd`, as Docker
    /// runs it; empty when the image names none.
    pub fn command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_a_template_needs() {
        let json = br#"{"architecture":"amd64","os":"linux","config":{
            "Env":["PATH=/usr/local/bin:/usr/bin:/bin","LANG=C.UTF-8","EMPTY"],
            "WorkingDir":"/app","User":"1000","Entrypoint":["/entry.sh"],"Cmd":["serve","--port=80"],
            "ExposedPorts":{"80/tcp":{}}}}"#;
        let c = ImageConfig::parse(json).unwrap();
        assert_eq!(
            c.env[0],
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())
        );
        assert_eq!(c.env[2], ("EMPTY".into(), String::new()));
        assert_eq!(c.workdir.as_deref(), Some("/app"));
        assert_eq!(c.user.as_deref(), Some("1000"));
        assert_eq!(c.command(), vec!["/entry.sh", "serve", "--port=80"]);
        assert_eq!(c.exposed_ports, vec!["80/tcp"]);
        assert_eq!(c.platform, "linux/amd64");
    }

    #[test]
    fn a_config_without_run_settings_is_empty() {
        let c = ImageConfig::parse(br#"{"config":{"WorkingDir":"","User":""}}"#).unwrap();
        assert_eq!(c.workdir, None);
        assert_eq!(c.user, None);
        assert!(c.command().is_empty());
        assert!(ImageConfig::parse(b"not json").is_err());
    }
}
