//! The list query string as the SDK sends it.

use std::collections::HashMap;

use axum::http::StatusCode;
use siesta_sandbox::sandbox::SandboxState;
use siesta_sandbox::store::{ListQuery, SortOrder};

use crate::error::ApiError;

/// Builds a [`ListQuery`] from the raw query string. `default_states`
/// applies when no `state` is given.
pub fn parse(raw: Option<&str>, default_states: &[SandboxState]) -> Result<ListQuery, ApiError> {
    let bad = |msg: String| ApiError::new(StatusCode::BAD_REQUEST, msg);
    let params: HashMap<String, String> = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let states = match params.get("state").filter(|s| !s.is_empty()) {
        Some(states) => states
            .split(',')
            .map(|s| s.trim().parse::<SandboxState>().map_err(bad))
            .collect::<Result<_, _>>()?,
        None => default_states.to_vec(),
    };
    let mut q = ListQuery {
        states,
        ..ListQuery::default()
    };
    if let Some(m) = params.get("metadata").filter(|s| !s.is_empty()) {
        // The SDK quotes each key and value, joins them as `k=v&k2=v2`, and
        // the whole is encoded again as the parameter: after the query is
        // decoded once, parse the pairs, then decode each key and value.
        q.metadata = parse_metadata(m).map_err(bad)?;
    }
    q.template = params.get("template").filter(|s| !s.is_empty()).cloned();
    if let Some(t) = params.get("startedAfter").filter(|s| !s.is_empty()) {
        let at = chrono::DateTime::parse_from_rfc3339(t)
            .map_err(|e| bad(format!("startedAfter {t:?} is not an RFC 3339 time: {e}")))?;
        q.started_after = Some(at.with_timezone(&chrono::Utc));
    }
    q.order = match params.get("order").map(String::as_str) {
        // E2B lists the newest first unless asked otherwise.
        None | Some("") | Some("desc") => SortOrder::Desc,
        Some("asc") => SortOrder::Asc,
        Some(o) => return Err(bad(format!("order {o:?}: use asc or desc"))),
    };
    if let Some(l) = params.get("limit").filter(|s| !s.is_empty()) {
        let limit: u32 = l
            .parse()
            .map_err(|_| bad(format!("limit {l:?} is not a positive integer")))?;
        if limit == 0 {
            return Err(bad("limit must be at least 1".into()));
        }
        q.limit = Some(limit);
    }
    q.next_token = params.get("nextToken").filter(|s| !s.is_empty()).cloned();
    Ok(q)
}

/// `k=v&k2=v2` with each key and value percent-encoded once more.
fn parse_metadata(m: &str) -> Result<Vec<(String, String)>, String> {
    m.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("metadata filter {pair:?} is not key=value"))?;
            let k = percent_decode(&percent_decode(k)?)?;
            let v = percent_decode(&percent_decode(v)?)?;
            if k.is_empty() {
                return Err(format!("metadata filter {pair:?} has an empty key"));
            }
            Ok((k, v))
        })
        .collect()
}

/// Decodes `%XX` escapes; a malformed escape or non-UTF-8 result is an error.
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        if bytes[i] == b'%' {
            return Err(format!("malformed percent escape in {s:?}"));
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: &[SandboxState] = &[SandboxState::Running, SandboxState::Paused];

    #[test]
    fn sdk_query_strings() {
        // `{"paginate": "y z"}` as the SDK sends it.
        let q = parse(
            Some("metadata=paginate%3Dy%252520z&state=running%2Cpaused&limit=1&order=desc"),
            &[],
        )
        .unwrap();
        assert_eq!(
            q.metadata,
            vec![("paginate".to_string(), "y z".to_string())]
        );
        assert_eq!(q.states, LIVE.to_vec());
        assert_eq!(q.limit, Some(1));
        assert_eq!(q.order, SortOrder::Desc);
        let q = parse(None, LIVE).unwrap();
        assert_eq!(q.states, LIVE.to_vec());
        assert_eq!(q.order, SortOrder::Desc, "newest first by default");
        assert_eq!(
            parse(Some("order=asc"), LIVE).unwrap().order,
            SortOrder::Asc
        );
        let q = parse(Some("startedAfter=2026-12-02T10%3A00%3A00%2B01%3A00"), LIVE).unwrap();
        assert_eq!(
            q.started_after.unwrap().to_rfc3339(),
            "2026-12-02T09:00:00+00:00"
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("y%20z").unwrap(), "y z");
        assert_eq!(percent_decode("%e2%82%ac").unwrap(), "\u{20ac}");
        assert!(percent_decode("y%2").is_err());
        assert!(percent_decode("%ff").is_err());
    }

    #[test]
    fn bad_values_are_400s() {
        for raw in [
            "state=sleeping",
            "order=up",
            "limit=-1",
            "limit=0",
            "startedAfter=yesterday",
        ] {
            let err = parse(Some(raw), LIVE).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{raw}");
        }
    }
}
