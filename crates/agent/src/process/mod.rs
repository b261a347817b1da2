//! `process.Process`: starting processes as guest users, on pipes or a pty,
//! streaming their output to any number of attached clients, and signalling,
//! feeding and resizing them. Processes outlive the requests that start them.

mod handle;
mod pty;
mod run;
mod service;
mod spawn;
mod table;

pub use service::{ProcessService, DEFAULT_KEEPALIVE};
