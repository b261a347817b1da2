use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cluster configuration: {0}")]
    Config(String),
    #[error("no etcd member answered (tried {endpoints}): {detail}")]
    Unreachable { endpoints: String, detail: String },
    #[error("etcd refused {what}: {detail}")]
    Etcd { what: String, detail: String },
    #[error("the cluster record of {key} is not valid JSON: {detail}")]
    BadRecord { key: String, detail: String },
    #[error(
        "the cluster record {key} is not sealed with this node's cluster key (forged, \
         moved, or written by a node with another --cluster-key-file)"
    )]
    Unsealed { key: String },
    #[error("node id {id:?} is already registered by a live node (another `siesta serve` with the same SIESTA_NODE_ID?)")]
    NodeIdTaken { id: String },
}

pub type Result<T> = std::result::Result<T, Error>;
