//! Reading the header of a QEMU migration stream (a state file).
//!
//! A restore must enable exactly the migration capabilities the stream was
//! saved with: QEMU 7.2 rejects a stream whose `x-ignore-shared` differs from
//! its own setting, and the RAM section's layout depends on it. Rather than
//! trusting a side file, the state file says itself: its configuration
//! section lists the capabilities and names the machine type. Layout (QEMU
//! 7.2 `migration/savevm.c`):
//!
//! ```text
//! be32 0x5145564d "QEVM", be32 3,
//! 0x07 QEMU_VM_CONFIGURATION, be32 len, machine type,
//!   subsections: 0x05, u8 len, name, be32 version, body ...
//!     "configuration/target-page-bits": be32
//!     "configuration/capabilities": be32 count, count x (u8 len, name)
//!     "configuration/uuid": 16 bytes
//! then sections (0x01 SECTION_START, 0x04 SECTION_FULL, ...).
//! ```

const MAGIC: u32 = 0x5145_564d;
const VERSION: u32 = 3;
const SECTION_CONFIGURATION: u8 = 0x07;
const SUBSECTION: u8 = 0x05;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHeader {
    pub machine: String,
    pub capabilities: Vec<String>,
}

impl StreamHeader {
    pub fn has_capability(&self, name: &str) -> bool {
        self.capabilities.iter().any(|c| c == name)
    }
}

/// How many bytes [`parse_header`] may need; the header is far smaller.
pub const HEADER_PROBE: usize = 4096;

/// Parses the header from the first bytes of a state file.
pub fn parse_header(buf: &[u8]) -> Result<StreamHeader, String> {
    parse_header_len(buf).map(|(header, _)| header)
}

/// Parses the header and says where it ends: the first section's byte.
pub(crate) fn parse_header_len(buf: &[u8]) -> Result<(StreamHeader, usize), String> {
    let mut r = Reader::new(buf);
    let magic = r.be32()?;
    if magic != MAGIC {
        return Err(format!(
            "not a QEMU migration stream (magic {magic:#010x}, expected QEVM)"
        ));
    }
    let version = r.be32()?;
    if version != VERSION {
        return Err(format!(
            "migration stream version {version}, expected {VERSION}"
        ));
    }
    if r.u8()? != SECTION_CONFIGURATION {
        return Err("no configuration section after the stream header".into());
    }
    let len = r.be32()? as usize;
    let machine = r.string(len)?;
    let mut capabilities = Vec::new();
    while r.peek() == Some(SUBSECTION) {
        r.u8()?;
        let len = r.u8()? as usize;
        let name = r.string(len)?;
        let _version = r.be32()?;
        match name.as_str() {
            "configuration/capabilities" => {
                let n = r.be32()?;
                for _ in 0..n {
                    let len = r.u8()? as usize;
                    capabilities.push(r.string(len)?);
                }
            }
            "configuration/target-page-bits" => {
                r.be32()?;
            }
            "configuration/uuid" => {
                r.take(16)?;
            }
            // Its length is unknown, so nothing after it can be read.
            other => return Err(format!("unknown configuration subsection {other:?}")),
        }
    }
    let header = StreamHeader {
        machine,
        capabilities,
    };
    Ok((header, r.pos))
}

/// A cursor over stream bytes whose errors name the byte offset.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(format!("stream truncated at byte {}", self.pos));
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn be32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn be64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    /// A name preceded by its one-byte length.
    pub(crate) fn name(&mut self) -> Result<String, String> {
        let len = self.u8()? as usize;
        self.string(len)
    }
    pub(crate) fn string(&mut self, n: usize) -> Result<String, String> {
        let at = self.pos;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("non-UTF-8 name at byte {at}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(caps: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(b"QEVM");
        v.extend_from_slice(&3u32.to_be_bytes());
        v.push(0x07);
        v.extend_from_slice(&10u32.to_be_bytes());
        v.extend_from_slice(b"pc-q35-7.2");
        if !caps.is_empty() {
            let name = b"configuration/capabilities";
            v.push(0x05);
            v.push(name.len() as u8);
            v.extend_from_slice(name);
            v.extend_from_slice(&1u32.to_be_bytes());
            v.extend_from_slice(&(caps.len() as u32).to_be_bytes());
            for c in caps {
                v.push(c.len() as u8);
                v.extend_from_slice(c.as_bytes());
            }
        }
        // The first real section follows.
        v.extend_from_slice(&[0x01, 0, 0, 0, 2, 3, b'r', b'a', b'm']);
        v
    }

    #[test]
    fn reads_machine_and_capabilities() {
        let h = parse_header(&header(&["x-ignore-shared"])).unwrap();
        assert_eq!(h.machine, "pc-q35-7.2");
        assert!(h.has_capability("x-ignore-shared"));
        let h = parse_header(&header(&[])).unwrap();
        assert!(h.capabilities.is_empty());
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(parse_header(b"garbage!garbage!")
            .unwrap_err()
            .contains("not a QEMU migration stream"));
        assert!(parse_header(b"QE").unwrap_err().contains("truncated"));
        let h = header(&["x-ignore-shared"]);
        assert!(parse_header(&h[..30]).unwrap_err().contains("truncated"));
        let mut v = header(&[]);
        v[7] = 2;
        assert!(parse_header(&v).unwrap_err().contains("version 2"));
    }
}

/// Hostile input (issue 12): a migration stream's header from any bytes is
/// parsed or refused, never a panic.
#[cfg(test)]
mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        #[test]
        fn any_header_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_header(&bytes);
        }

        #[test]
        fn a_qemu_magic_with_any_tail_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = b"QEVM\0\0\0\x03".to_vec();
            bytes.extend(tail);
            let _ = parse_header(&bytes);
        }
    }
}
