//! The destination name a connection's first bytes carry: the server name
//! (SNI) of a TLS ClientHello, or the `Host` header of a plain HTTP request.
//! Pure functions over a buffer, so the proxy can call them again as more
//! bytes arrive.

use super::domain::normalise_host;

/// Most bytes read before giving up on finding a name: one TLS record
/// (16 KiB of payload plus its header) or an HTTP request head.
pub const MAX_HEAD: usize = 16 * 1024 + 5;

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Sniff {
    /// Not enough bytes yet to decide.
    NeedMore,
    /// The name the client asked for.
    Name(String),
    /// The head is complete (or cannot be parsed) and names no host.
    NoName,
}

/// Looks at the first bytes of a connection.
pub fn sniff(head: &[u8]) -> Sniff {
    match head.first() {
        None => Sniff::NeedMore,
        Some(&TLS_HANDSHAKE) => tls_server_name(head),
        Some(_) => http_host(head),
    }
}

const TLS_HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 0x01;
const EXT_SERVER_NAME: u16 = 0x0000;
const HOST_NAME_TYPE: u8 = 0x00;

/// SNI of a ClientHello that fits in its first record (as every client
/// sends it; one split over records is treated as naming no host).
fn tls_server_name(head: &[u8]) -> Sniff {
    let Some(record_len) = be16(head, 3) else {
        return Sniff::NeedMore;
    };
    let end = 5 + usize::from(record_len);
    if head.len() < end {
        return if end > MAX_HEAD {
            Sniff::NoName
        } else {
            Sniff::NeedMore
        };
    }
    parse_client_hello(&head[5..end]).map_or(Sniff::NoName, Sniff::Name)
}

fn parse_client_hello(msg: &[u8]) -> Option<String> {
    let mut r = Reader(msg);
    if r.u8()? != CLIENT_HELLO {
        return None;
    }
    let len = r.u24()?;
    let mut r = Reader(r.take(len)?);
    r.take(2 + 32)?; // version, random
    let session = usize::from(r.u8()?);
    r.take(session)?;
    let suites = usize::from(r.u16()?);
    r.take(suites)?;
    let compression = usize::from(r.u8()?);
    r.take(compression)?;
    let ext_len = usize::from(r.u16()?);
    let mut exts = Reader(r.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let body = exts.take(len)?;
        if kind == EXT_SERVER_NAME {
            return server_name(body);
        }
    }
    None
}

fn server_name(body: &[u8]) -> Option<String> {
    let mut r = Reader(body);
    let list_len = usize::from(r.u16()?);
    let mut list = Reader(r.take(list_len)?);
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let len = usize::from(list.u16()?);
        let name = list.take(len)?;
        if kind == HOST_NAME_TYPE {
            return normalise_host(std::str::from_utf8(name).ok()?);
        }
    }
    None
}

/// `Host` of an HTTP/1 request head (its port removed).
fn http_host(head: &[u8]) -> Sniff {
    let Some(end) = find(head, b"\r\n\r\n") else {
        return if head.len() >= MAX_HEAD {
            Sniff::NoName
        } else {
            Sniff::NeedMore
        };
    };
    let Ok(text) = std::str::from_utf8(&head[..end]) else {
        return Sniff::NoName;
    };
    let host = text.split("\r\n").skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim())
    });
    host.and_then(strip_port)
        .and_then(normalise_host)
        .map_or(Sniff::NoName, Sniff::Name)
}

fn strip_port(host: &str) -> Option<&str> {
    if host.starts_with('[') {
        return None; // an IPv6 literal is not a name
    }
    Some(host.split_once(':').map_or(host, |(h, _)| h))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// A cursor that fails (`None`) instead of reading past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        let b = self.take(3)?;
        Some(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record naming `name` (the shape every TLS
    /// client sends; the fields this parser skips are zero-filled).
    pub(crate) fn client_hello(name: &str) -> Vec<u8> {
        let mut sni = vec![HOST_NAME_TYPE];
        sni.extend((name.len() as u16).to_be_bytes());
        sni.extend(name.as_bytes());
        let mut ext_body = (sni.len() as u16).to_be_bytes().to_vec();
        ext_body.extend(sni);
        // One unrelated extension first (supported_versions), then SNI.
        let mut exts = vec![0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04];
        exts.extend(EXT_SERVER_NAME.to_be_bytes());
        exts.extend((ext_body.len() as u16).to_be_bytes());
        exts.extend(ext_body);
        let mut hello = vec![0x03, 0x03];
        hello.extend([0u8; 32]);
        hello.extend([0]); // session id
        hello.extend([0, 2, 0x13, 0x01]); // one cipher suite
        hello.extend([1, 0]); // null compression
        hello.extend((exts.len() as u16).to_be_bytes());
        hello.extend(exts);
        let mut msg = vec![CLIENT_HELLO];
        msg.extend(&(hello.len() as u32).to_be_bytes()[1..]);
        msg.extend(hello);
        let mut record = vec![TLS_HANDSHAKE, 0x03, 0x01];
        record.extend((msg.len() as u16).to_be_bytes());
        record.extend(msg);
        record
    }

    #[test]
    fn tls_server_name_is_found_once_the_record_is_complete() {
        let hello = client_hello("API.example.com");
        for cut in [0, 1, 4, 5, hello.len() - 1] {
            assert_eq!(sniff(&hello[..cut]), Sniff::NeedMore, "cut at {cut}");
        }
        assert_eq!(sniff(&hello), Sniff::Name("api.example.com".into()));
    }

    #[test]
    fn tls_without_a_usable_name_names_nothing() {
        assert_eq!(sniff(&client_hello("10.0.0.1")), Sniff::NoName);
        let mut truncated = client_hello("a.example.com");
        truncated[4] -= 3; // record shorter than the message it carries
        let len = truncated.len();
        assert_eq!(sniff(&truncated[..len - 3]), Sniff::NoName);
        // A record longer than one TLS record may be is never waited for.
        assert_eq!(sniff(&[0x16, 3, 1, 0xff, 0xff]), Sniff::NoName);
    }

    #[test]
    fn http_host_header_is_found_without_its_port() {
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhOsT: Allowed.Test:8080\r\n\r\n";
        assert_eq!(sniff(&req[..20]), Sniff::NeedMore);
        assert_eq!(sniff(req), Sniff::Name("allowed.test".into()));
        assert_eq!(
            sniff(b"GET / HTTP/1.0\r\nAccept: */*\r\n\r\n"),
            Sniff::NoName
        );
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Sniff::NoName
        );
        assert_eq!(sniff(&vec![b'a'; MAX_HEAD]), Sniff::NoName);
    }

    // Hostile input (issue 12): a guest controls every byte the proxy
    // parses; whatever it sends, sniffing returns, never panics, and a name
    // it returns is a valid one.
    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1024, ..Default::default() })]

        #[test]
        fn any_bytes_are_sniffed_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            check(&bytes)?;
            let mut tls = vec![TLS_HANDSHAKE];
            tls.extend(&bytes);
            check(&tls)?;
        }

        #[test]
        fn a_changed_client_hello_never_panics(at in 0usize..128, byte in proptest::prelude::any::<u8>(), cut in 0usize..128) {
            let mut hello = client_hello("api.example.com");
            let i = at % hello.len();
            hello[i] = byte;
            let keep = hello.len() - cut % hello.len();
            check(&hello[..keep])?;
        }
    }

    fn check(bytes: &[u8]) -> Result<(), proptest::test_runner::TestCaseError> {
        if let Sniff::Name(n) = sniff(bytes) {
            proptest::prop_assert_eq!(normalise_host(&n), Some(n.clone()));
        }
        Ok(())
    }
}
