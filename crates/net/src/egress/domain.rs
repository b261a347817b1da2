//! Domain names in egress rules: `example.com` (that name only) and
//! `*.example.com` (any name below it, not `example.com` itself).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest DNS name (RFC 1035, without the trailing dot).
const MAX_NAME: usize = 253;
/// Longest DNS label.
const MAX_LABEL: usize = 63;

/// An allowed destination name, normalised to lowercase ASCII without a
/// trailing dot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DomainPattern {
    /// The name, or the suffix after `*.` for a wildcard.
    name: String,
    wildcard: bool,
}

impl DomainPattern {
    /// Whether `host` (already normalised by [`normalise_host`]) matches.
    pub fn matches(&self, host: &str) -> bool {
        if !self.wildcard {
            return host == self.name;
        }
        host.len() > self.name.len() + 1
            && host.ends_with(&self.name)
            && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
    }
}

impl FromStr for DomainPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (wildcard, rest) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let name = normalise_host(rest).ok_or_else(|| {
            format!("{s:?} is not a domain name (letters, digits, '-' and '.'; '*.' only in front)")
        })?;
        if wildcard && !name.contains('.') {
            return Err(format!(
                "{s:?}: a wildcard needs at least two labels after '*.' (say \"*.example.com\")"
            ));
        }
        Ok(Self { name, wildcard })
    }
}

impl TryFrom<String> for DomainPattern {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<DomainPattern> for String {
    fn from(d: DomainPattern) -> String {
        d.to_string()
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.name)
    }
}

/// A host name as a guest sent it (SNI or `Host`), lowercased and without a
/// trailing dot; `None` unless it is a plausible DNS name. IP literals are
/// not names: they are never matched by a domain rule.
pub fn normalise_host(raw: &str) -> Option<String> {
    let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= MAX_LABEL
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        // The last label of a name is never all digits: that is an address.
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()));
    valid.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DomainPattern {
        s.parse().unwrap()
    }

    #[test]
    fn exact_names_match_only_themselves() {
        let d = p("Example.COM.");
        assert_eq!(d.to_string(), "example.com");
        assert!(d.matches("example.com"));
        assert!(!d.matches("a.example.com"));
        assert!(!d.matches("badexample.com"));
    }

    #[test]
    fn wildcards_match_names_below_not_the_apex() {
        let d = p("*.example.com");
        assert_eq!(d.to_string(), "*.example.com");
        assert!(d.matches("a.example.com"));
        assert!(d.matches("a.b.example.com"));
        assert!(!d.matches("example.com"));
        assert!(!d.matches("badexample.com"));
        assert!(!d.matches("xexample.com"));
    }

    #[test]
    fn what_is_not_a_name_is_refused() {
        for bad in [
            "", "*", "*.com", "a..b", "-a.com", "a b.com", "a.*.com", "1.2.3.4", "a/b", "ex*.com",
        ] {
            assert!(bad.parse::<DomainPattern>().is_err(), "{bad:?}");
        }
        assert_eq!(normalise_host("10.0.0.1"), None);
        assert_eq!(
            normalise_host("API.Example.com."),
            Some("api.example.com".into())
        );
    }
}
