//! The host's side of the guest agent (envd protocol, port 49983): readiness,
//! `/init`, and running commands for `siesta sandbox exec`.

mod client;
mod envelope;

pub use client::{EnvdClient, ExecOptions, ExecOutput, InitParams};
pub use envelope::{decode_envelopes, encode_envelope, Envelope};
