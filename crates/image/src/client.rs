//! The HTTP side of a registry pull: one client for the token dance, the
//! manifests (`manifest.rs`) and the blobs (`registry.rs`).
//!
//! It is ours rather than `oci-client`'s because a pull an API client asked
//! for must not connect where it pleases (see `reach.rs`): this client
//! resolves names through [`GuardedResolver`], checks addresses written in
//! URLs before each request and on each redirect, and uses no proxy from
//! the environment (a proxy would resolve names itself, past the check).
//! The token dance follows the distribution spec: `GET /v2/`, and on a
//! `Bearer` challenge a token from its `realm` for
//! `repository:<name>:pull`; a `Basic` challenge takes the user and
//! password as they are.

use std::time::Duration;

use oci_client::Reference;

use crate::error::{chain, ImageError, Result};
use crate::reach::{refusal_in, GuardedResolver, Reach};
use crate::source::FetchOptions;

/// The most of an error or token response that is read.
const SMALL_BODY_MAX: u64 = 64 << 10;
/// Redirects followed for one request (registries send blobs to a CDN).
const MAX_REDIRECTS: usize = 10;

/// A bearer token from the registry's token service, or a user and
/// password for a registry that takes Basic authentication, or nothing.
pub(crate) enum Auth {
    Bearer(String),
    Basic(String, String),
    Anonymous,
}

/// A registry for one pull: its client, scheme and credentials.
pub(crate) struct RegistryClient {
    http: reqwest::Client,
    reach: Reach,
    /// `http` or `https`.
    pub(crate) scheme: &'static str,
    auth: Auth,
}

impl RegistryClient {
    /// A client for `reference`'s registry, logged in as `opts` says.
    pub(crate) async fn connect(reference: &Reference, opts: &FetchOptions) -> Result<Self> {
        let mut client = Self::new(reference, opts)?;
        client.auth = client.log_in(reference, opts).await?;
        Ok(client)
    }

    /// A client for `reference`'s registry, not yet logged in.
    pub(crate) fn new(reference: &Reference, opts: &FetchOptions) -> Result<Self> {
        let whole = reference.whole();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(120))
            .user_agent(concat!("siesta/", env!("CARGO_PKG_VERSION")));
        if let Reach::Public { .. } = &opts.reach {
            let reach = opts.reach.clone();
            builder = builder
                .no_proxy()
                .dns_resolver(GuardedResolver {
                    reach: opts.reach.clone(),
                })
                .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                    if attempt.previous().len() >= MAX_REDIRECTS {
                        return attempt.error("too many redirects");
                    }
                    match reach.check_url(attempt.url()) {
                        Ok(()) => attempt.follow(),
                        Err(refused) => attempt.error(refused),
                    }
                }));
        }
        let http = builder.build().map_err(|e| ImageError::Registry {
            reference: whole.clone(),
            detail: format!("making an HTTP client: {}", chain(&e)),
        })?;
        Ok(Self {
            http,
            reach: opts.reach.clone(),
            scheme: if opts.plain_http(reference.registry()) {
                "http"
            } else {
                "https"
            },
            auth: Auth::Anonymous,
        })
    }

    /// `GET url` with the credentials of the pull and `accept`, once the URL
    /// is checked against the pull's reach.
    pub(crate) async fn get(
        &self,
        reference: &Reference,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response> {
        let mut request = self.request(reference, url)?;
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        let request = match &self.auth {
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Basic(user, password) => request.basic_auth(user, Some(password)),
            Auth::Anonymous => request,
        };
        request
            .send()
            .await
            .map_err(|e| request_error(&reference.whole(), &e))
    }

    /// A request for `url` without credentials, the URL checked.
    fn request(&self, reference: &Reference, url: &str) -> Result<reqwest::RequestBuilder> {
        let whole = reference.whole();
        let parsed = reqwest::Url::parse(url).map_err(|e| ImageError::Registry {
            reference: whole.clone(),
            detail: format!("{url:?} is not a URL: {e}"),
        })?;
        self.reach
            .check_url(&parsed)
            .map_err(|refused| ImageError::Forbidden {
                reference: whole,
                refused,
            })?;
        Ok(self.http.get(parsed))
    }

    /// `scheme://registry` of `reference` (Docker Hub's `docker.io` is
    /// `index.docker.io`).
    pub(crate) fn base(&self, reference: &Reference) -> String {
        format!("{}://{}", self.scheme, reference.resolve_registry())
    }

    /// The token dance: what the registry's `/v2/` asks for.
    async fn log_in(&self, reference: &Reference, opts: &FetchOptions) -> Result<Auth> {
        let whole = reference.whole();
        let basic = || match &opts.credentials {
            Some(c) => Auth::Basic(c.username.clone(), c.password.clone()),
            None => Auth::Anonymous,
        };
        let url = format!("{}/v2/", self.base(reference));
        let response = self
            .request(reference, &url)?
            .send()
            .await
            .map_err(|e| request_error(&whole, &e))?;
        let Some(challenge) = response
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|h| h.to_str().ok())
        else {
            return Ok(basic());
        };
        let Some((realm, service)) = bearer_challenge(challenge) else {
            return Ok(basic());
        };
        let mut token_url = reqwest::Url::parse(&realm)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| ImageError::Registry {
                reference: whole.clone(),
                detail: format!("its token service {realm:?} is not an HTTP(S) URL"),
            })?;
        token_url.query_pairs_mut().append_pair(
            "scope",
            &format!("repository:{}:pull", reference.repository()),
        );
        if let Some(service) = &service {
            token_url.query_pairs_mut().append_pair("service", service);
        }
        let mut request = self.request(reference, token_url.as_str())?;
        if let Some(c) = &opts.credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| request_error(&whole, &e))?;
        let status = response.status();
        let body = read_small(&mut response, &whole).await?;
        if !status.is_success() {
            return Err(ImageError::AuthFailed {
                reference: whole,
                detail: format!(
                    "its token service answered {status}: {}",
                    excerpt(&body.unwrap_or_default())
                ),
            });
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token = body
            .and_then(|b| serde_json::from_slice::<Token>(&b).ok())
            .and_then(|t| t.token.or(t.access_token))
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ImageError::AuthFailed {
                reference: whole,
                detail: "its token service answered without a token".into(),
            })?;
        Ok(Auth::Bearer(token))
    }
}

/// The `realm` and `service` of the first `Bearer` challenge in a
/// `WWW-Authenticate` header.
fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    http_auth::parser::ChallengeParser::new(header)
        .filter_map(|c| c.ok())
        .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))
        .and_then(|c| {
            let param = |name: &str| {
                c.params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            Some((param("realm")?, param("service")))
        })
}

/// A short body (an error's, a token's): `None` when longer than
/// [`SMALL_BODY_MAX`].
pub(crate) async fn read_small(
    response: &mut reqwest::Response,
    whole: &str,
) -> Result<Option<Vec<u8>>> {
    read_capped(response, SMALL_BODY_MAX, whole).await
}

/// The body, or `None` when it is longer than `cap` (read no further).
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    cap: u64,
    whole: &str,
) -> Result<Option<Vec<u8>>> {
    if response.content_length().is_some_and(|n| n > cap) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_error(whole, &e))?
    {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// At most 200 characters of a registry's text, on one line.
fn excerpt(body: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(body)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    text.trim().to_string()
}

/// What a failed request means: a connection the pull's reach refused, a
/// registry that cannot be reached, or another failure.
pub(crate) fn request_error(whole: &str, e: &reqwest::Error) -> ImageError {
    let reference = whole.to_string();
    if let Some(refused) = refusal_in(e) {
        return ImageError::Forbidden { reference, refused };
    }
    if e.is_connect() || e.is_timeout() {
        ImageError::Unreachable {
            reference,
            detail: chain(e),
        }
    } else {
        ImageError::Registry {
            reference,
            detail: chain(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_give_their_realm_and_service() {
        let (realm, service) = bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        )
        .unwrap();
        assert_eq!(realm, "https://auth.docker.io/token");
        assert_eq!(service.as_deref(), Some("registry.docker.io"));
        assert_eq!(
            bearer_challenge(r#"Basic realm="x", Bearer realm="http://t/""#).map(|c| c.0),
            Some("http://t/".to_string())
        );
        assert!(bearer_challenge(r#"Basic realm="siesta-test""#).is_none());
        assert!(bearer_challenge("Bearer service=\"x\"").is_none());
    }

    #[test]
    fn excerpts_are_short_and_one_line() {
        assert_eq!(excerpt(b"bad\npassword"), "bad password");
        assert_eq!(excerpt(&[b'a'; 500]).len(), 200);
    }
}
