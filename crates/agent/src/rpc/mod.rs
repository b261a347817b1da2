//! The Connect RPC layer: framing, codecs (JSON and binary protobuf), error
//! mapping and dispatch of `/{package.Service}/{Method}` to handlers.

mod context;
mod error;

pub use context::RequestContext;
pub use error::{Code, RpcError};
