//! Bodies read from a guest's agent, bounded: the guest is untrusted, so
//! what it answers must not grow the host's memory without limit (review
//! M5). Error bodies are cut to their start (they only go into a message);
//! answers the host parses fail once past their cap.

use reqwest::Response;

/// What of an error body goes into an error message.
pub const ERROR_BODY_BYTES: usize = 16 * 1024;

/// Most of a JSON answer (metrics, a directory listing) the host parses.
pub const JSON_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Most of a file read whole into memory (`siesta files cp ID:PATH`).
pub const DOWNLOAD_BYTES: usize = 1024 * 1024 * 1024;

/// How much of each stream of a finished command the host keeps.
pub const EXEC_KEPT_BYTES: usize = 4 * 1024 * 1024;

/// Appends `more` to `kept`, keeping its last [`EXEC_KEPT_BYTES`] (trimmed
/// in batches, so the copying stays linear in what arrives).
pub fn keep_tail(kept: &mut Vec<u8>, more: &[u8]) {
    keep_tail_of(kept, more, EXEC_KEPT_BYTES);
}

fn keep_tail_of(kept: &mut Vec<u8>, more: &[u8], limit: usize) {
    if more.len() >= limit {
        kept.clear();
        kept.extend_from_slice(&more[more.len() - limit..]);
        return;
    }
    kept.extend_from_slice(more);
    if kept.len() > 2 * limit {
        kept.drain(..kept.len() - limit);
    }
}

/// `kept` cut to its last [`EXEC_KEPT_BYTES`], once the stream ended.
pub fn trim_tail(kept: &mut Vec<u8>) {
    if kept.len() > EXEC_KEPT_BYTES {
        kept.drain(..kept.len() - EXEC_KEPT_BYTES);
    }
}

/// Reads at most `limit` bytes of `resp`'s body; `Ok((bytes, true))` when
/// there was more (the rest is not read).
pub async fn read_at_most(mut resp: Response, limit: usize) -> reqwest::Result<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = limit - out.len();
        if chunk.len() > room {
            out.extend_from_slice(&chunk[..room]);
            return Ok((out, true));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, false))
}

/// The start of an error body as text, marked when it was cut.
pub async fn error_text(resp: Response) -> String {
    match read_at_most(resp, ERROR_BODY_BYTES).await {
        Ok((bytes, cut)) => {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if cut {
                format!("{text}... (cut at {} KiB)", ERROR_BODY_BYTES / 1024)
            } else {
                text
            }
        }
        Err(e) => format!("(body unreadable: {e})"),
    }
}

/// The whole body, or an error naming `what` when it is over `limit`.
pub async fn read_whole(resp: Response, limit: usize, what: &str) -> Result<Vec<u8>, String> {
    match read_at_most(resp, limit).await {
        Ok((bytes, false)) => Ok(bytes),
        Ok((_, true)) => Err(format!(
            "{what}: the answer is over {} MiB, more than the host reads",
            limit / (1024 * 1024)
        )),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real HTTP answer of `body` from a one-shot listener.
    async fn answer(body: Vec<u8>) -> Response {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let head = format!("HTTP/1.1 500 x\r\nContent-Length: {}\r\n\r\n", body.len());
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&body).await;
        });
        reqwest::get(format!("http://{addr}/")).await.unwrap()
    }

    #[test]
    fn a_stream_keeps_its_tail_only() {
        let mut kept = Vec::new();
        for i in 0..100u8 {
            keep_tail_of(&mut kept, &[i; 10], 25);
            assert!(kept.len() <= 50, "{}", kept.len());
        }
        let last = kept[kept.len() - 25..].to_vec();
        let mut want = vec![97u8; 5];
        want.extend([98u8; 10]);
        want.extend([99u8; 10]);
        assert_eq!(last, want);
        keep_tail_of(&mut kept, &[7; 40], 25);
        assert_eq!(kept, vec![7; 25]);
    }

    #[tokio::test]
    async fn a_long_error_body_is_cut_and_a_long_answer_refused() {
        let text = error_text(answer(vec![b'x'; 1024 * 1024]).await).await;
        assert!(text.len() < ERROR_BODY_BYTES + 64, "{}", text.len());
        assert!(
            text.ends_with("(cut at 16 KiB)"),
            "{}",
            &text[text.len() - 20..]
        );
        assert_eq!(error_text(answer(b"short".to_vec()).await).await, "short");
        let err = read_whole(answer(vec![b'{'; 4096]).await, 1024, "/metrics")
            .await
            .unwrap_err();
        assert!(err.contains("/metrics") && err.contains("over"), "{err}");
        let ok = read_whole(answer(b"{}".to_vec()).await, 1024, "/metrics").await;
        assert_eq!(ok.unwrap(), b"{}");
    }
}
