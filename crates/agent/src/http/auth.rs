//! Who may use `/files`: the holder of the access token (`X-Access-Token`),
//! or anyone with a URL the SDK signed with it (`download_url`/`upload_url`).
//!
//! Until `/init` sets a token there is nothing to check, as in envd: a fresh
//! template build has no token yet.

use axum::http::HeaderMap;

use super::HttpError;
use crate::auth::ACCESS_TOKEN_HEADER;
use siesta_envd_proto::secrets_match;

pub use siesta_envd_proto::file_signature as signature;

/// What a `/files` request presents, taken from its query.
pub struct FileAccess<'a> {
    pub path: &'a str,
    /// `read` (GET) or `write` (POST).
    pub operation: &'a str,
    /// The `username` query parameter as sent (empty when absent).
    pub user: &'a str,
    pub signature: Option<&'a str>,
    pub expiration: Option<&'a str>,
}

/// Admits the request or says why not (401).
pub fn authorize(
    token: Option<&str>,
    headers: &HeaderMap,
    access: &FileAccess<'_>,
) -> Result<(), HttpError> {
    let Some(token) = token else { return Ok(()) };
    let given = headers
        .get(ACCESS_TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if secrets_match(given, token.as_bytes()) {
        return Ok(());
    }
    let Some(sig) = access.signature else {
        return Err(HttpError::unauthorized("missing or invalid access token"));
    };
    let expiration =
        match access.expiration {
            None => None,
            Some(s) => Some(s.parse::<i64>().map_err(|_| {
                HttpError::bad_request("signature_expiration is not a Unix timestamp")
            })?),
        };
    if let Some(exp) = expiration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        if exp < now {
            return Err(HttpError::unauthorized("signature is already expired"));
        }
    }
    let want = signature(
        access.path,
        access.operation,
        access.user,
        token,
        expiration,
    );
    // The signature is standard base64: a `+` left unescaped in the URL
    // arrives decoded as a space.
    let sig = sig.replace(' ', "+");
    if secrets_match(sig.as_bytes(), want.as_bytes()) {
        Ok(())
    } else {
        Err(HttpError::unauthorized("invalid signature"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access<'a>(sig: Option<&'a str>, exp: Option<&'a str>) -> FileAccess<'a> {
        FileAccess {
            path: "/home/user/a.txt",
            operation: "read",
            user: "user",
            signature: sig,
            expiration: exp,
        }
    }

    #[test]
    fn signature_matches_the_sdk_formula() {
        // sha256("/p:read::tok") computed independently with Python's hashlib.
        let sig = signature("/p", "read", "", "tok", None);
        assert_eq!(sig, "v1_vA+ciHOxgaXZBpEwyVns1ZqsIlgt+ufyM/mke1l9F+0");
        assert_ne!(sig, signature("/p", "write", "", "tok", None));
        assert_ne!(sig, signature("/p", "read", "", "tok", Some(1)));
    }

    #[test]
    fn token_or_valid_signature_admits() {
        let mut h = HeaderMap::new();
        assert!(authorize(None, &h, &access(None, None)).is_ok());
        assert_eq!(
            authorize(Some("tok"), &h, &access(None, None))
                .unwrap_err()
                .status,
            401
        );
        h.insert("x-access-token", "tok".parse().unwrap());
        assert!(authorize(Some("tok"), &h, &access(None, None)).is_ok());

        let h = HeaderMap::new();
        let good = signature("/home/user/a.txt", "read", "user", "tok", None);
        assert!(authorize(Some("tok"), &h, &access(Some(&good), None)).is_ok());
        assert!(authorize(Some("other"), &h, &access(Some(&good), None)).is_err());

        let future = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 60) as i64;
        let f = future.to_string();
        let sig = signature("/home/user/a.txt", "read", "user", "tok", Some(future));
        assert!(authorize(Some("tok"), &h, &access(Some(&sig), Some(&f))).is_ok());
        let sig = signature("/home/user/a.txt", "read", "user", "tok", Some(1));
        assert_eq!(
            authorize(Some("tok"), &h, &access(Some(&sig), Some("1")))
                .unwrap_err()
                .status,
            401
        );
    }
}
