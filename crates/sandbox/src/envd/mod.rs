//! The host's side of the guest agent (envd protocol, port 49983): readiness,
//! `/init`, running commands for `siesta sandbox exec`, and interactive
//! terminals (`pty`) for `siesta sandbox attach`.

//! Connect envelopes are framed by `siesta_envd_proto::envelope`, the same
//! code the agent uses.

mod bounded;
mod client;
mod pty;

pub use client::{EnvdClient, ExecOptions, ExecOutput, InitParams};
pub use pty::{PtyEvent, PtySession, PtySize, PtySpec};
