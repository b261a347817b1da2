//! siesta-agent: the envd-compatible agent that runs inside every sandbox.
//!
//! It serves the envd protocol on port 49983: plain HTTP endpoints (`/health`,
//! `/init`, `/files`, `/envs`) and two Connect RPC services, `process.Process`
//! and `filesystem.Filesystem`, in both the JSON and the binary protobuf codec.
//! In a guest it also runs as PID 1 (see [`pid1`]).

pub mod rpc;
pub mod state;
pub mod users;
