//! Typed errors: every failure names the slot (or pool) it concerns and, for
//! external commands, the command line and its stderr.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("invalid network config: {0}")]
    Config(String),

    #[error("{scope}: `{command}` failed ({status}): {stderr}")]
    Command {
        scope: String,
        command: String,
        status: String,
        stderr: String,
    },

    #[error("{scope}: cannot run `{command}`: {source}")]
    Spawn {
        scope: String,
        command: String,
        #[source]
        source: io::Error,
    },

    #[error("{scope}: {what}: {source}")]
    Io {
        scope: String,
        what: String,
        #[source]
        source: io::Error,
    },

    #[error("pool {tag}: all {capacity} slots are in use (the most sandboxes this node runs at once: max_slots)")]
    Exhausted { tag: String, capacity: usize },

    #[error("pool {tag}: {state}")]
    State { tag: String, state: &'static str },
}

impl NetError {
    pub(crate) fn io(scope: impl Into<String>, what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            scope: scope.into(),
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = NetError> = std::result::Result<T, E>;
