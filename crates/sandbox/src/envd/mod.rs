//! The host's side of the guest agent (envd protocol, port 49983): readiness,
//! `/init`, and running commands for `siesta sandbox exec`.

//! Connect envelopes are framed by `siesta_envd_proto::envelope`, the same
//! code the agent uses.

mod client;

pub use client::{EnvdClient, ExecOptions, ExecOutput, InitParams};
