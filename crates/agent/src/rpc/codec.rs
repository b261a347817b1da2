//! The two Connect codecs: proto3 JSON (what the E2B SDKs speak) and binary
//! protobuf, chosen per request by its content type.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::RpcError;

/// Every message the agent sends or receives can use either codec.
pub trait Message:
    prost::Message + Default + Serialize + DeserializeOwned + Send + 'static
{
}
impl<T> Message for T where
    T: prost::Message + Default + Serialize + DeserializeOwned + Send + 'static
{
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

/// Whether the request is unary (`application/*`) or streaming
/// (`application/connect+*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Unary,
    Stream,
}

impl Codec {
    /// Parses a request content type. Parameters (`; charset=utf-8`) are
    /// ignored on requests; responses never carry them, because the SDK
    /// rejects a stream response whose type is not exactly
    /// `application/connect+json`.
    pub fn from_content_type(value: &str) -> Option<(Codec, Framing)> {
        let base = value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match base.as_str() {
            "application/json" => Some((Codec::Json, Framing::Unary)),
            "application/proto" => Some((Codec::Proto, Framing::Unary)),
            "application/connect+json" => Some((Codec::Json, Framing::Stream)),
            "application/connect+proto" => Some((Codec::Proto, Framing::Stream)),
            _ => None,
        }
    }

    /// The response content type for this codec and framing.
    pub fn content_type(self, framing: Framing) -> &'static str {
        match (self, framing) {
            (Codec::Json, Framing::Unary) => "application/json",
            (Codec::Proto, Framing::Unary) => "application/proto",
            (Codec::Json, Framing::Stream) => "application/connect+json",
            (Codec::Proto, Framing::Stream) => "application/connect+proto",
        }
    }

    pub fn decode<M: Message>(self, bytes: &[u8]) -> Result<M, RpcError> {
        match self {
            Codec::Json => {
                // An empty unary body means the empty message, as in connect-go.
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    return Ok(M::default());
                }
                serde_json::from_slice(bytes)
                    .map_err(|e| RpcError::invalid_argument(format!("unmarshal message: {e}")))
            }
            Codec::Proto => M::decode(bytes)
                .map_err(|e| RpcError::invalid_argument(format!("unmarshal message: {e}"))),
        }
    }

    pub fn encode<M: Message>(self, msg: &M) -> Result<Vec<u8>, RpcError> {
        match self {
            Codec::Json => serde_json::to_vec(msg)
                .map_err(|e| RpcError::internal(format!("marshal message: {e}"))),
            Codec::Proto => Ok(msg.encode_to_vec()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use siesta_envd_proto::process::{process_event, ProcessEvent, StartRequest};

    #[test]
    fn content_types() {
        assert_eq!(
            Codec::from_content_type("application/json; charset=utf-8"),
            Some((Codec::Json, Framing::Unary))
        );
        assert_eq!(
            Codec::from_content_type("application/connect+proto"),
            Some((Codec::Proto, Framing::Stream))
        );
        assert_eq!(Codec::from_content_type("text/plain"), None);
    }

    #[test]
    fn json_is_proto3_json_and_lenient() {
        let req: StartRequest = Codec::Json
            .decode(br#"{"process":{"cmd":"ls","args":["-l"]},"stdin":false,"futureField":1}"#)
            .unwrap();
        assert_eq!(req.process.unwrap().cmd, "ls");
        assert_eq!(req.stdin, Some(false));
        let ev = ProcessEvent {
            event: Some(process_event::Event::End(process_event::EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            })),
        };
        let json = String::from_utf8(Codec::Json.encode(&ev).unwrap()).unwrap();
        assert_eq!(json, r#"{"end":{"exited":true,"status":"exit status 0"}}"#);
        assert!(Codec::Json.decode::<StartRequest>(b"{not json").is_err());
    }
}
