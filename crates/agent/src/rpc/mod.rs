//! The Connect RPC layer: framing, codecs (JSON and binary protobuf), error
//! mapping and dispatch of `/{package.Service}/{Method}` to handlers.

pub mod codec;
mod context;
mod dispatch;
pub mod envelope;
mod error;
mod server;

pub use codec::{Codec, Framing, Message};
pub use context::RequestContext;
pub use dispatch::handle;
pub use error::{Code, RpcError};
pub use server::{error_response, RequestStream, RpcStream};
