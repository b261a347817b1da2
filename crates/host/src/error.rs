//! Errors of the host layer: a file, a host program, or an image on the
//! node. `siesta-sandbox` turns each into its own error of the same kind.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A disk image (written by a VM, or fetched) that is damaged or asks
    /// for what no image of ours does.
    #[error("snapshot {path} is corrupt: {detail}; rebuild the template or delete the snapshot")]
    CorruptImage { path: PathBuf, detail: String },

    /// A host program ran and failed.
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },

    /// A host program the node needs is not installed.
    #[error("{command} is missing on this node (it {used_for}): install package {package} (scripts/install-deps.sh), then retry; `siesta doctor` checks the rest")]
    MissingTool {
        command: String,
        package: String,
        used_for: String,
    },

    /// A setting or a name that cannot be used.
    #[error("invalid request: {0}")]
    Invalid(String),

    #[error("VMM for {id}: {source}")]
    Vmm {
        id: String,
        // Boxed: VMM errors carry logs and would make every Result large.
        #[source]
        source: Box<siesta_vmm::VmmError>,
    },

    #[error("network for {id}: {source}")]
    Net {
        id: String,
        #[source]
        source: siesta_net::NetError,
    },

    /// Work on a blocking thread panicked: a fault of siesta itself.
    #[error("internal error while {what}: {detail}")]
    Internal { what: String, detail: String },
}

impl HostError {
    pub fn vmm(id: impl Into<String>, source: siesta_vmm::VmmError) -> Self {
        HostError::Vmm {
            id: id.into(),
            source: Box::new(source),
        }
    }

    /// A [`HostError::MissingTool`] for `command`, one of
    /// [`crate::tools::HOST_TOOLS`].
    pub fn missing_tool(command: &str) -> Self {
        let tool = crate::tools::HOST_TOOLS
            .iter()
            .find(|t| t.command == command);
        HostError::MissingTool {
            command: command.to_string(),
            package: tool.map_or("?", |t| t.package).to_string(),
            used_for: tool.map_or("is needed", |t| t.used_for).to_string(),
        }
    }
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;
