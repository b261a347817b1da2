//! Writing a migration stream that carries only the RAM pages a VM changed.
//!
//! A sandbox's RAM is a private copy-on-write mapping of its template's
//! memory file, so the pages it changed since the template are exactly the
//! private pages of that mapping (see [`super::changed_pages`]). QEMU 7.2
//! cannot save only those: `migrate` sends every page of a private RAM
//! block, 512 MiB for a 512 MiB guest whatever it wrote. So siesta writes
//! the stream itself, laid out as QEMU would have written it with only those
//! pages, and QEMU loads it with an ordinary `migrate-incoming` over the same
//! template file (measured in `shared/reference/qemu-pause.md`, method B):
//!
//! ```text
//! header, configuration, RAM START (block list)   <- the template's state file
//! RAM PART: the changed pages of the guest's RAM   <- read from the VMM process
//!           the small blocks' pages (ROMs, ACPI)   <- the template's state file
//! RAM END (empty)
//! device sections, EOF                            <- QMP xen-save-devices-state
//! VMDESCRIPTION "{}"
//! ```
//!
//! A page that is not in the stream keeps the template's content on load,
//! which is what the guest had there: it never wrote it. The template's
//! stream must have been saved with `x-ignore-shared` (its RAM in the shared
//! file), so its RAM sections hold the small blocks only; their pages do not
//! change while a guest runs, which the spike checked block by block.
//!
//! Record layout (QEMU 7.2 `migration/ram.c`): a big-endian u64 of the
//! page's offset in its block with flags in the low 12 bits; unless the
//! CONTINUE flag is set the block's name follows (u8 length, bytes); then
//! one fill byte (ZERO) or the 4096-byte page (PAGE). Sections end with a
//! footer (0x7e, section id).

use std::io::{self, IoSliceMut, Write};

use super::stream::{parse_header_len, Reader};
use super::X_IGNORE_SHARED;

/// Guest page size (x86 `TARGET_PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;

const SECTION_START: u8 = 0x01;
const SECTION_PART: u8 = 0x02;
const SECTION_END: u8 = 0x03;
const SECTION_FOOTER: u8 = 0x7e;
const VM_DESCRIPTION: u8 = 0x06;
const VM_EOF: u8 = 0x00;

const FLAG_ZERO: u64 = 0x02;
const FLAG_MEM_SIZE: u64 = 0x04;
const FLAG_PAGE: u64 = 0x08;
const FLAG_EOS: u64 = 0x10;
const FLAG_CONTINUE: u64 = 0x20;
const FLAGS_MASK: u64 = (PAGE_SIZE as u64) - 1;

/// The RAM section's version in QEMU 7.2.
const RAM_VERSION: u32 = 4;
/// Magic and version that open a stream, as xen-save-devices-state writes it.
const STREAM_OPENING: [u8; 8] = *b"QEVM\0\0\0\x03";

/// What a changed-pages stream borrows from a template's state file.
#[derive(Debug, Clone)]
pub struct RamFrame {
    /// Header, configuration and RAM START section, verbatim.
    prefix: Vec<u8>,
    section_id: u32,
    /// The guest RAM block's name and length.
    memory_block: String,
    memory_len: u64,
    /// Every page record of the other blocks.
    small_pages: Vec<PageRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PageRecord {
    block: String,
    offset: u64,
    data: PageData,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PageData {
    Fill(u8),
    Bytes(Vec<u8>),
}

impl RamFrame {
    /// Reads the frame from a template's state file (`stream`), whose guest
    /// RAM block is called `memory_block`.
    pub fn parse(stream: &[u8], memory_block: &str) -> Result<Self, String> {
        let (header, start) = parse_header_len(stream)?;
        if !header.has_capability(X_IGNORE_SHARED) {
            return Err(
                "saved without x-ignore-shared: its guest RAM is in the stream, so it is not a template's state"
                    .into(),
            );
        }
        let mut r = Reader::new(stream);
        r.pos = start;
        let mut ram = RamBody::default();
        let section_id = read_start(&mut r, &mut ram)?;
        let prefix = stream[..r.pos].to_vec();
        loop {
            let at = r.pos;
            match r.u8()? {
                kind @ (SECTION_PART | SECTION_END) => {
                    let id = r.be32()?;
                    if id != section_id {
                        return Err(format!(
                            "section {id} at byte {at} is not the RAM section ({section_id}): only RAM may be iterable"
                        ));
                    }
                    ram.read(&mut r)?;
                    read_footer(&mut r, section_id)?;
                    if kind == SECTION_END {
                        break;
                    }
                }
                other => {
                    return Err(format!(
                        "section type {other:#04x} at byte {at} before the RAM section ended"
                    ))
                }
            }
        }
        ram.into_frame(prefix, section_id, memory_block)
    }

    /// Length of the guest RAM block, in bytes.
    pub fn memory_len(&self) -> u64 {
        self.memory_len
    }

    /// Starts a stream on `out`: the frame's prefix and an open RAM PART.
    pub fn begin<W: Write>(&self, mut out: W) -> io::Result<ChangedStream<'_, W>> {
        out.write_all(&self.prefix)?;
        out.write_all(&[SECTION_PART])?;
        out.write_all(&self.section_id.to_be_bytes())?;
        Ok(ChangedStream {
            frame: self,
            out,
            named: false,
            pages: 0,
        })
    }
}

/// A changed-pages stream being written: pages, then [`ChangedStream::finish`].
pub struct ChangedStream<'f, W: Write> {
    frame: &'f RamFrame,
    out: W,
    /// Whether the guest RAM block was named already (later records CONTINUE).
    named: bool,
    pages: u64,
}

impl<W: Write> ChangedStream<'_, W> {
    /// Adds the guest RAM pages at byte offsets `offsets` of the block.
    /// Their records are laid out in the writer's own buffer and `read`
    /// gets one 4096-byte slot per offset, in order, to read the pages into
    /// straight from the VMM; all-zero pages are then shrunk to 9-byte ZERO
    /// records in place. So no copy stands between reading a page out of
    /// the VMM and writing it to the file.
    pub fn append_pages(
        &mut self,
        offsets: &[u64],
        read: impl FnOnce(&mut [IoSliceMut<'_>]) -> io::Result<()>,
    ) -> io::Result<()>
    where
        W: ReserveWrite,
    {
        let len = self.frame.memory_len;
        if let Some(bad) = offsets
            .iter()
            .find(|&&o| !o.is_multiple_of(PAGE_SIZE as u64) || o >= len)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a page at {bad:#x} does not fit a {len}-byte RAM block"),
            ));
        }
        let block = self.frame.memory_block.as_str();
        let named = self.named;
        let most = (0..offsets.len())
            .map(|i| header_len(i, named, block) + PAGE_SIZE)
            .sum();
        self.out.with_reserved(most, |buf| {
            read(&mut page_slots(buf, offsets.len(), named, block))?;
            Ok(encode_in_place(buf, offsets, named, block))
        })?;
        self.named |= !offsets.is_empty();
        self.pages += offsets.len() as u64;
        Ok(())
    }

    /// How many guest RAM pages were added.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Ends the stream with the small blocks' pages, an empty RAM END, the
    /// device sections of `devices` (a file written by QMP
    /// `xen-save-devices-state`) and a description. Returns the writer.
    pub fn finish(mut self, devices: &[u8]) -> io::Result<W> {
        let sections = device_sections(devices)
            .map_err(|detail| io::Error::new(io::ErrorKind::InvalidData, detail))?;
        for p in &self.frame.small_pages {
            let flags = match p.data {
                PageData::Fill(_) => FLAG_ZERO,
                PageData::Bytes(_) => FLAG_PAGE,
            };
            self.out.write_all(&(p.offset | flags).to_be_bytes())?;
            write_name(&mut self.out, &p.block)?;
            match &p.data {
                PageData::Fill(b) => self.out.write_all(&[*b])?,
                PageData::Bytes(b) => self.out.write_all(b)?,
            }
        }
        let id = self.frame.section_id.to_be_bytes();
        let eos = FLAG_EOS.to_be_bytes();
        for part in [&eos[..], &[SECTION_FOOTER], &id, &[SECTION_END], &id, &eos] {
            self.out.write_all(part)?;
        }
        self.out.write_all(&[SECTION_FOOTER])?;
        self.out.write_all(&id)?;
        self.out.write_all(sections)?;
        // QEMU reads a description after EOF and only logs when it is
        // missing; an empty one keeps its log clean.
        self.out.write_all(&[VM_DESCRIPTION])?;
        self.out.write_all(&2u32.to_be_bytes())?;
        self.out.write_all(b"{}")?;
        Ok(self.out)
    }
}

/// A writer that lends the free space at its end, so records are built
/// (and pages read into them) where they will be written from.
pub trait ReserveWrite: Write {
    /// Calls `fill` with `n` bytes after what was written so far; `fill`
    /// returns how many of them it used, and only those are written.
    fn with_reserved(
        &mut self,
        n: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<()>;
}

impl ReserveWrite for Vec<u8> {
    fn with_reserved(
        &mut self,
        n: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<()> {
        let at = self.len();
        self.resize(at + n, 0);
        let used = fill(&mut self[at..]);
        self.truncate(at + used.as_ref().map_or(0, |&u| u.min(n)));
        used.map(|_| ())
    }
}

/// Length of record `i`'s header: the offset word, and on the stream's
/// first record of the guest RAM block its name.
fn header_len(i: usize, named: bool, block: &str) -> usize {
    if i == 0 && !named {
        8 + 1 + block.len()
    } else {
        8
    }
}

/// The page slots of `count` records laid out from the start of `buf`.
fn page_slots<'b>(
    buf: &'b mut [u8],
    count: usize,
    named: bool,
    block: &str,
) -> Vec<IoSliceMut<'b>> {
    let mut slots = Vec::with_capacity(count);
    let mut rest = buf;
    for i in 0..count {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(header_len(i, named, block));
        let (page, tail) = tail.split_at_mut(PAGE_SIZE);
        slots.push(IoSliceMut::new(page));
        rest = tail;
    }
    slots
}

/// Writes the records' headers over the layout of [`page_slots`], moving
/// pages down where a zero page before them became a ZERO record; returns
/// the bytes the records take. Records only ever move towards the start,
/// and each header lands before its own page's slot, so nothing unread is
/// overwritten.
fn encode_in_place(buf: &mut [u8], offsets: &[u64], named: bool, block: &str) -> usize {
    let (mut from, mut to) = (0usize, 0usize);
    for (i, &offset) in offsets.iter().enumerate() {
        let header = header_len(i, named, block);
        let page = from + header;
        let zero = is_zero(&buf[page..page + PAGE_SIZE]);
        let mut flags = if zero { FLAG_ZERO } else { FLAG_PAGE };
        if header == 8 {
            flags |= FLAG_CONTINUE;
        }
        buf[to..to + 8].copy_from_slice(&(offset | flags).to_be_bytes());
        if header > 8 {
            buf[to + 8] = block.len() as u8;
            buf[to + 9..to + header].copy_from_slice(block.as_bytes());
        }
        if zero {
            buf[to + header] = 0;
            to += header + 1;
        } else {
            if to != from {
                buf.copy_within(page..page + PAGE_SIZE, to + header);
            }
            to += header + PAGE_SIZE;
        }
        from = page + PAGE_SIZE;
    }
    to
}

/// Whether a page is all zero: 64-byte blocks OR-ed together (which the
/// compiler vectorises), stopping at the first block that is not.
fn is_zero(page: &[u8]) -> bool {
    page.chunks(64)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// The device sections and EOF of a xen-save-devices-state file: the file
/// without its 8-byte opening.
fn device_sections(devices: &[u8]) -> Result<&[u8], String> {
    if devices.len() < STREAM_OPENING.len() + 1 || devices[..8] != STREAM_OPENING {
        return Err("the device state QEMU wrote does not open with QEVM version 3".into());
    }
    if devices.last() != Some(&VM_EOF) {
        return Err("the device state QEMU wrote does not end with EOF".into());
    }
    Ok(&devices[STREAM_OPENING.len()..])
}

fn write_name(out: &mut impl Write, name: &str) -> io::Result<()> {
    out.write_all(&[name.len() as u8])?;
    out.write_all(name.as_bytes())
}

/// Reads the RAM START section (header, block list, footer); returns its id.
fn read_start(r: &mut Reader<'_>, ram: &mut RamBody) -> Result<u32, String> {
    let at = r.pos;
    if r.u8()? != SECTION_START {
        return Err(format!(
            "no RAM START section at byte {at}, after the configuration"
        ));
    }
    let id = r.be32()?;
    let name = r.name()?;
    let _instance = r.be32()?;
    let version = r.be32()?;
    if name != "ram" || version != RAM_VERSION {
        return Err(format!(
            "the first section is {name:?} version {version}, expected \"ram\" version {RAM_VERSION}"
        ));
    }
    ram.read(r)?;
    read_footer(r, id)?;
    Ok(id)
}

fn read_footer(r: &mut Reader<'_>, id: u32) -> Result<(), String> {
    let at = r.pos;
    if r.u8()? != SECTION_FOOTER || r.be32()? != id {
        return Err(format!("no footer of section {id} at byte {at}"));
    }
    Ok(())
}

/// What the RAM records of a template's stream say.
#[derive(Default)]
struct RamBody {
    blocks: Vec<(String, u64)>,
    /// The block of the last record (records with CONTINUE use it).
    last_block: Option<String>,
    pages: Vec<PageRecord>,
}

impl RamBody {
    /// Reads records up to and including EOS.
    fn read(&mut self, r: &mut Reader<'_>) -> Result<(), String> {
        loop {
            let at = r.pos;
            let word = r.be64()?;
            let (flags, offset) = (word & FLAGS_MASK, word & !FLAGS_MASK);
            if flags == FLAG_EOS {
                return Ok(());
            }
            match flags & !FLAG_CONTINUE {
                FLAG_MEM_SIZE => self.read_blocks(r, offset)?,
                kind @ (FLAG_ZERO | FLAG_PAGE) => {
                    let block = if flags & FLAG_CONTINUE != 0 {
                        self.last_block
                            .clone()
                            .ok_or_else(|| format!("record at byte {at} continues no block"))?
                    } else {
                        r.name()?
                    };
                    let data = if kind == FLAG_ZERO {
                        PageData::Fill(r.u8()?)
                    } else {
                        PageData::Bytes(r.take(PAGE_SIZE)?.to_vec())
                    };
                    self.last_block = Some(block.clone());
                    self.pages.push(PageRecord {
                        block,
                        offset,
                        data,
                    });
                }
                _ => {
                    return Err(format!(
                    "RAM record with flags {flags:#x} at byte {at}: not from a plain QEMU 7.2 save"
                ))
                }
            }
        }
    }

    /// The block list of MEM_SIZE (with x-ignore-shared: name, length,
    /// guest address), `total` bytes in all.
    fn read_blocks(&mut self, r: &mut Reader<'_>, total: u64) -> Result<(), String> {
        let mut sum = 0u64;
        while sum < total {
            let name = r.name()?;
            let len = r.be64()?;
            let _guest_address = r.be64()?;
            sum = sum.saturating_add(len);
            self.blocks.push((name, len));
        }
        if sum != total {
            return Err(format!(
                "RAM blocks add up to {sum} bytes, the stream says {total}"
            ));
        }
        Ok(())
    }

    fn into_frame(
        self,
        prefix: Vec<u8>,
        section_id: u32,
        memory_block: &str,
    ) -> Result<RamFrame, String> {
        let Some(&(_, memory_len)) = self.blocks.iter().find(|(n, _)| n == memory_block) else {
            let names: Vec<&str> = self.blocks.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "no RAM block {memory_block:?} in the stream (it has {names:?})"
            ));
        };
        if self.pages.iter().any(|p| p.block == memory_block) {
            return Err(format!(
                "the stream carries pages of RAM block {memory_block:?}: it was not saved from a shared mapping"
            ));
        }
        Ok(RamFrame {
            prefix,
            section_id,
            memory_block: memory_block.to_string(),
            memory_len,
            small_pages: self.pages,
        })
    }
}

#[cfg(test)]
#[path = "ram_frame_tests.rs"]
mod tests;
