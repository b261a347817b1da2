//! Signed file URLs that name no sandbox.
//!
//! A secure sandbox's `download_url()`/`upload_url()` is
//! `{E2B_SANDBOX_URL}/files?path=…&signature=v1_…`: with one sandbox URL
//! for all sandboxes, and no `E2b-Sandbox-Id` header (a browser or `curl`
//! fetches it), nothing in the request says which sandbox it is for. The
//! signature does: it is a digest over the sandbox's access token, so the
//! sandbox whose token reproduces it is the one. The guest agent then
//! checks the signature (and its expiry) itself, as for any other request.

use axum::http::{Method, Uri};

/// What a signed `/files` request presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedFiles {
    pub path: String,
    /// `read` for GET, `write` for POST.
    pub operation: &'static str,
    pub user: String,
    pub signature: String,
    pub expiration: Option<i64>,
}

impl SignedFiles {
    /// The signed-URL form of `method uri`, if it is one.
    pub fn of(method: &Method, uri: &Uri) -> Option<Self> {
        if uri.path() != "/files" {
            return None;
        }
        let operation = match *method {
            Method::GET => "read",
            Method::POST => "write",
            _ => return None,
        };
        let mut out = SignedFiles {
            path: String::new(),
            operation,
            user: String::new(),
            signature: String::new(),
            expiration: None,
        };
        for (k, v) in form_urlencoded::parse(uri.query()?.as_bytes()) {
            match k.as_ref() {
                "path" => out.path = v.into_owned(),
                "username" => out.user = v.into_owned(),
                // A `+` of the base64 left unescaped decodes as a space.
                "signature" => out.signature = v.replace(' ', "+"),
                "signature_expiration" => out.expiration = v.parse().ok(),
                _ => {}
            }
        }
        (!out.signature.is_empty()).then_some(out)
    }

    /// True when the URL carries an expiration earlier than `now` (Unix
    /// seconds). The agent refuses such a URL; the front door does not
    /// wake a sandbox for it.
    pub fn expired(&self, now: i64) -> bool {
        self.expiration.is_some_and(|exp| exp < now)
    }

    /// True if `token` (a sandbox's access token) made this signature.
    /// Compared in constant time: an early exit on the first wrong byte
    /// would let a client find a valid signature byte by byte.
    pub fn signed_with(&self, token: &str) -> bool {
        let want = siesta_envd_proto::file_signature(
            &self.path,
            self.operation,
            &self.user,
            token,
            self.expiration,
        );
        siesta_envd_proto::secrets_match(want.as_bytes(), self.signature.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_signature_and_checks_it_against_a_token() {
        let sig = siesta_envd_proto::file_signature("/tmp/a b", "read", "", "tok", Some(99));
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("path", "/tmp/a b")
            .append_pair("signature", &sig)
            .append_pair("signature_expiration", "99")
            .finish();
        let uri: Uri = format!("/files?{query}").parse().unwrap();
        let s = SignedFiles::of(&Method::GET, &uri).expect("a signed URL");
        assert!(s.signed_with("tok"));
        assert!(!s.signed_with("other"));
        let post = SignedFiles::of(&Method::POST, &uri).unwrap();
        assert!(!post.signed_with("tok"), "a read signature does not write");
        assert!(SignedFiles::of(&Method::GET, &"/files?path=/x".parse().unwrap()).is_none());
        assert!(SignedFiles::of(&Method::GET, &"/other?signature=x".parse().unwrap()).is_none());
    }

    #[test]
    fn a_signature_right_but_for_its_last_byte_or_cut_short_is_refused() {
        let sig = siesta_envd_proto::file_signature("/p", "read", "", "tok", None);
        let signed = |signature: &str| SignedFiles {
            path: "/p".into(),
            operation: "read",
            user: String::new(),
            signature: signature.into(),
            expiration: None,
        };
        assert!(signed(&sig).signed_with("tok"));
        let mut last = sig.clone();
        let flipped = if last.ends_with('A') { 'B' } else { 'A' };
        last.pop();
        last.push(flipped);
        assert!(!signed(&last).signed_with("tok"));
        assert!(!signed(&sig[..sig.len() - 1]).signed_with("tok"));
        assert!(!signed("").signed_with("tok"));
    }
}
