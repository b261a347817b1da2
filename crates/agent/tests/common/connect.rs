//! A small hand-written Connect client for the agent's tests: unary, server
//! and client streaming, in the JSON and the binary protobuf codec, plus raw
//! requests for protocol-error tests.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::pin::Pin;

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub trait Msg: prost::Message + Default + Serialize + DeserializeOwned {}
impl<T: prost::Message + Default + Serialize + DeserializeOwned> Msg for T {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

impl Codec {
    fn encode<M: Msg>(self, m: &M) -> Vec<u8> {
        match self {
            Codec::Json => serde_json::to_vec(m).unwrap(),
            Codec::Proto => m.encode_to_vec(),
        }
    }
    fn decode<M: Msg>(self, b: &[u8]) -> M {
        match self {
            Codec::Json => serde_json::from_slice(b).unwrap_or_else(|e| {
                panic!("bad JSON message {:?}: {e}", String::from_utf8_lossy(b))
            }),
            Codec::Proto => M::decode(b).expect("bad proto message"),
        }
    }
    fn unary_type(self) -> &'static str {
        match self {
            Codec::Json => "application/json",
            Codec::Proto => "application/proto",
        }
    }
    pub fn stream_type(self) -> &'static str {
        match self {
            Codec::Json => "application/connect+json",
            Codec::Proto => "application/connect+proto",
        }
    }
}

/// A Connect error as the client sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

pub fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![flags];
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    /// Sent on every request (e.g. `X-Access-Token`).
    pub headers: Vec<(String, String)>,
}

impl Client {
    pub fn new(base: &str) -> Self {
        Self {
            base: base.to_string(),
            http: reqwest::Client::new(),
            headers: Vec::new(),
        }
    }

    /// A raw POST, for protocol-error tests.
    pub async fn raw(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", content_type)
            .header("connect-protocol-version", "1")
            .body(body);
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("request failed")
    }

    pub async fn unary<Req: Msg, Resp: Msg>(
        &self,
        codec: Codec,
        path: &str,
        req: &Req,
        headers: &[(&str, &str)],
    ) -> Result<Resp, ConnectError> {
        let resp = self
            .raw(path, codec.unary_type(), codec.encode(req), headers)
            .await;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.unwrap();
        if status != 200 {
            return Err(parse_error(status, &body));
        }
        Ok(codec.decode(&body))
    }

    /// Opens a server stream (one request message).
    pub async fn stream<Req: Msg, Resp: Msg>(
        &self,
        codec: Codec,
        path: &str,
        req: &Req,
        headers: &[(&str, &str)],
    ) -> Result<ServerStream<Resp>, ConnectError> {
        self.stream_raw(codec, path, envelope(0, &codec.encode(req)), headers)
            .await
    }

    /// A client stream: all `reqs`, then EOF; returns the response messages
    /// and the end-of-stream JSON.
    pub async fn client_stream<Req: Msg, Resp: Msg>(
        &self,
        codec: Codec,
        path: &str,
        reqs: &[Req],
    ) -> Result<(Vec<Resp>, serde_json::Value), ConnectError> {
        let body: Vec<u8> = reqs
            .iter()
            .flat_map(|r| envelope(0, &codec.encode(r)))
            .collect();
        let mut s = self.stream_raw::<Resp>(codec, path, body, &[]).await?;
        let mut out = Vec::new();
        while let Some(m) = s.next().await {
            out.push(m);
        }
        Ok((out, s.end.clone().expect("no end-of-stream envelope")))
    }

    pub async fn stream_raw<Resp: Msg>(
        &self,
        codec: Codec,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<ServerStream<Resp>, ConnectError> {
        let resp = self.raw(path, codec.stream_type(), body, headers).await;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.bytes().await.unwrap();
            return Err(parse_error(status, &body));
        }
        let ct = resp
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(ct, codec.stream_type(), "stream content type must be exact");
        Ok(ServerStream {
            codec,
            body: Box::pin(resp.bytes_stream()),
            buf: BytesMut::new(),
            end: None,
            _m: std::marker::PhantomData,
        })
    }
}

fn parse_error(status: u16, body: &[u8]) -> ConnectError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|_| {
        panic!(
            "error body is not JSON: {:?}",
            String::from_utf8_lossy(body)
        )
    });
    ConnectError {
        status,
        code: v["code"].as_str().expect("string code").to_string(),
        message: v["message"].as_str().unwrap_or_default().to_string(),
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The messages of a streaming response; `end` holds the end-of-stream JSON
/// once it arrived.
pub struct ServerStream<M> {
    codec: Codec,
    body: ByteStream,
    buf: BytesMut,
    pub end: Option<serde_json::Value>,
    _m: std::marker::PhantomData<M>,
}

impl<M: Msg> ServerStream<M> {
    /// The next message; `None` after the end-of-stream envelope.
    pub async fn next(&mut self) -> Option<M> {
        loop {
            if self.buf.len() >= 5 {
                let flags = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let payload = self.buf.split_to(len);
                    assert_eq!(flags & 1, 0, "compressed envelope");
                    if flags & 2 != 0 {
                        // The end envelope is JSON in both codecs.
                        self.end =
                            Some(serde_json::from_slice(&payload).expect("end envelope JSON"));
                        return None;
                    }
                    return Some(self.codec.decode(&payload));
                }
            }
            if self.end.is_some() {
                return None;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => panic!("stream body failed: {e}"),
                None => panic!("stream ended without an end-of-stream envelope"),
            }
        }
    }

    /// The end envelope's error, if any (after `next` returned `None`).
    pub fn end_error(&self) -> Option<String> {
        self.end
            .as_ref()?
            .get("error")
            .map(|e| e["code"].as_str().unwrap_or("").to_string())
    }
}
