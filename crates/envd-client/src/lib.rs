//! siesta-envd-client: the host's side of the guest agent (envd protocol,
//! port 49983): readiness, `/init`, running commands for `siesta sandbox
//! exec` and template builds, files, and interactive terminals (`pty`) for
//! `siesta sandbox attach`.
//!
//! It knows nothing of sandboxes' rows or the node: the server, template
//! builds and the CLI's remote client all use it.
//!
//! Connect envelopes are framed by `siesta_envd_proto::envelope`, the same
//! code the agent uses.

mod bounded;
mod client;
mod error;
mod pty;

pub use client::{EnvdClient, ExecOptions, ExecOutput, GuestDefaults, InitParams};
pub use error::{EnvdError, Result};
pub use pty::{PtyEvent, PtySession, PtySize, PtySpec};
