//! How much of its size limit a volume uses.
//!
//! Every entry costs at least one block of [`ENTRY_COST`] bytes: a file
//! its apparent size but no less, a directory, a symbolic link or anything
//! else exactly that. Otherwise empty files, directories and links (each
//! an inode and, for directories and long links, a block on the host)
//! would be free, and `mkdir` in a loop would fill the host's disk and
//! inode table past any limit. A volume of N MiB so holds at most 256·N
//! entries.

use std::io::ErrorKind;

use cap_std::fs::{Dir, ReadDir};

/// The least an entry costs: one 4 KiB block.
pub const ENTRY_COST: u64 = 4096;

/// What a file of `len` bytes costs.
pub fn file_cost(len: u64) -> u64 {
    len.max(ENTRY_COST)
}

/// What an entry costs: a regular file of `len` bytes, or anything else.
pub fn entry_cost(is_file: bool, len: u64) -> u64 {
    if is_file {
        file_cost(len)
    } else {
        ENTRY_COST
    }
}

/// What everything under `dir` costs (links not followed; `dir` itself
/// is free).
///
/// The walk keeps its own stack rather than recursing: a guest can nest
/// directories deeper than any thread's stack would allow. It holds one
/// descriptor per level of the current path. An entry that disappears
/// while it is counted is not counted.
pub(crate) fn usage_of(dir: &Dir) -> std::io::Result<u64> {
    let mut total = 0;
    let mut stack: Vec<ReadDir> = vec![dir.entries()?];
    while let Some(top) = stack.last_mut() {
        let Some(entry) = top.next() else {
            stack.pop();
            continue;
        };
        let counted = entry.and_then(|entry| {
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                // A directory that cannot be opened is counted alone.
                if let Ok(listing) = entry.open_dir().and_then(|sub| sub.entries()) {
                    stack.push(listing);
                }
                Ok(ENTRY_COST)
            } else if file_type.is_file() {
                Ok(file_cost(entry.metadata()?.len()))
            } else {
                Ok(ENTRY_COST)
            }
        });
        match counted {
            Ok(cost) => total += cost,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}
