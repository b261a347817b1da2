//! E2B's sandbox network options (`network` and `allow_internet_access` on
//! create) as an egress policy. What siesta cannot enforce yet is refused
//! with a 400 that says so, never accepted and ignored.

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use siesta_net::{Cidr, DomainPattern, EgressPolicy};
use utoipa::ToSchema;

use crate::error::ApiError;

/// Egress rules: `allowOut` wins over `denyOut`, which wins over
/// `allow_internet_access`. The other E2B network options are refused with
/// 400 (not supported yet).
#[derive(Deserialize, Default, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkBody {
    /// IPv4 addresses, CIDRs or domain patterns (`example.com`,
    /// `*.example.com`) it may reach.
    #[serde(default)]
    allow_out: Vec<String>,
    /// IPv4 addresses or CIDRs it may not reach.
    #[serde(default)]
    deny_out: Vec<String>,
    /// Create only; `false`: its ports (but envd's) need the
    /// `trafficAccessToken` in `e2b-traffic-access-token`.
    allow_public_traffic: Option<bool>,
    /// Options the SDK can send that siesta does not implement yet.
    #[serde(flatten)]
    #[schema(ignore)]
    other: serde_json::Map<String, Value>,
}

impl NetworkBody {
    /// E2B's `allowPublicTraffic: false`: the sandbox's ports need its
    /// traffic access token.
    pub fn private_traffic(&self) -> bool {
        self.allow_public_traffic == Some(false)
    }

    /// Refuses `allowPublicTraffic`, which only a create may set.
    pub fn without_public_traffic(&self) -> Result<&Self, ApiError> {
        match self.allow_public_traffic {
            None => Ok(self),
            Some(_) => Err(unsupported(
                "network.allowPublicTraffic is set when the sandbox is created, not updated",
            )),
        }
    }
}

/// The policy a create asks for; `None` when it sets neither
/// `allow_internet_access` nor address or domain rules (a sandbox made from
/// a snapshot then keeps its source's rules).
pub fn given_egress(
    allow_internet: Option<bool>,
    network: Option<&NetworkBody>,
) -> Result<Option<EgressPolicy>, ApiError> {
    let rules = network.is_some_and(|n| !n.allow_out.is_empty() || !n.deny_out.is_empty());
    let policy = egress_policy(allow_internet, network)?;
    Ok((allow_internet.is_some() || rules).then_some(policy))
}

/// The policy for `allow_internet_access` (default on) and `network`.
pub fn egress_policy(
    allow_internet: Option<bool>,
    network: Option<&NetworkBody>,
) -> Result<EgressPolicy, ApiError> {
    let mut policy = EgressPolicy::internet(allow_internet.unwrap_or(true));
    let Some(net) = network else {
        return Ok(policy);
    };
    if let Some((key, _)) = net.other.iter().find(|(_, v)| !is_empty(v)) {
        return Err(unsupported(&format!(
            "network.{key} is not supported yet: leave it unset \
             (supported: allowOut, denyOut, allowPublicTraffic)"
        )));
    }
    for entry in &net.allow_out {
        match rule("allowOut", entry)? {
            Rule::Address(c) => policy.allow_out.push(c),
            Rule::Domain(d) => policy.allow_domains.push(d),
        }
    }
    for entry in &net.deny_out {
        match rule("denyOut", entry)? {
            Rule::Address(c) => policy.deny_out.push(c),
            Rule::Domain(d) => {
                return Err(bad(format!(
                    "network.denyOut: domain names ({d}) are only allowed in allowOut, \
                     as in E2B; deny everything (\"0.0.0.0/0\") and allow the names you need"
                )))
            }
        }
    }
    Ok(policy)
}

enum Rule {
    Address(Cidr),
    Domain(DomainPattern),
}

/// An entry of `allowOut`/`denyOut`: an IPv4 address or CIDR, or a domain
/// name (`example.com`, `*.example.com`).
fn rule(field: &str, entry: &str) -> Result<Rule, ApiError> {
    let entry = entry.trim();
    let looks_like_address = entry
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'/' || b == b':');
    if looks_like_address {
        return entry
            .parse()
            .map(Rule::Address)
            .map_err(|why| bad(format!("network.{field}: {why}")));
    }
    entry
        .parse()
        .map(Rule::Domain)
        .map_err(|why| bad(format!("network.{field}: {why}")))
}

fn bad(msg: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, msg)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn unsupported(msg: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> NetworkBody {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rules_become_the_policy() {
        let net = body(serde_json::json!({"allowOut": ["10.1.0.5"], "denyOut": ["0.0.0.0/0"]}));
        let p = egress_policy(Some(true), Some(&net)).unwrap();
        assert!(p.allow_internet);
        assert_eq!(p.allow_out[0].to_string(), "10.1.0.5/32");
        assert_eq!(p.deny_out[0].to_string(), "0.0.0.0/0");
        assert_eq!(egress_policy(None, None).unwrap(), EgressPolicy::default());
        assert!(!egress_policy(Some(false), None).unwrap().allow_internet);
        // Nothing given is None (a snapshot's sandbox keeps its source's
        // rules); what cannot be enforced is refused all the same.
        let public = body(serde_json::json!({"allowPublicTraffic": true}));
        assert_eq!(given_egress(None, Some(&public)).unwrap(), None);
        assert_eq!(given_egress(None, None).unwrap(), None);
        assert!(given_egress(Some(true), None).unwrap().is_some());
        assert!(given_egress(None, Some(&net)).unwrap().is_some());
        let bad = body(serde_json::json!({"maskRequestHost": "x"}));
        assert!(given_egress(None, Some(&bad)).is_err());
    }

    #[test]
    fn domains_are_allow_rules() {
        let net = body(serde_json::json!({
            "allowOut": ["API.example.com", "*.pkg.dev", "10.0.0.0/8"],
            "denyOut": ["0.0.0.0/0"],
        }));
        let p = egress_policy(None, Some(&net)).unwrap();
        let domains: Vec<String> = p.allow_domains.iter().map(ToString::to_string).collect();
        assert_eq!(domains, ["api.example.com", "*.pkg.dev"]);
        assert_eq!(p.allow_out[0].to_string(), "10.0.0.0/8");
    }

    #[test]
    fn what_cannot_be_enforced_is_refused() {
        for (v, says) in [
            (
                serde_json::json!({"denyOut": ["example.com"]}),
                "only allowed in allowOut",
            ),
            (
                serde_json::json!({"allowOut": ["exa mple.com"]}),
                "is not a domain name",
            ),
            (
                serde_json::json!({"allowOut": ["*.com"]}),
                "a wildcard needs",
            ),
            (
                serde_json::json!({"denyOut": ["10.0.0.0/40"]}),
                "longer than 32",
            ),
            (
                serde_json::json!({"maskRequestHost": "x"}),
                "network.maskRequestHost",
            ),
        ] {
            let err = egress_policy(None, Some(&body(v))).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert!(err.message.contains(says), "{}", err.message);
        }
        // Empty or default options are fine.
        let ok = body(serde_json::json!({"allowPublicTraffic": true, "dnsServers": []}));
        assert!(egress_policy(None, Some(&ok)).is_ok());
        assert!(!ok.private_traffic());
        let private = body(serde_json::json!({"allowPublicTraffic": false}));
        assert!(private.private_traffic());
        assert!(egress_policy(None, Some(&private)).is_ok());
        assert!(private.without_public_traffic().is_err());
    }
}
