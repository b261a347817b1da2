//! A stand-in for the guest kernel on incoming launches.
//!
//! QEMU reads the whole `-kernel` file, and the `-initrd`, into its own heap
//! when it starts, also under `-incoming`, where the guest's kernel is
//! already in the memory the snapshot restores. For a 14 MiB bzImage and a
//! 2 MiB initramfs that is about 14 MiB of private memory in every waiting
//! and running VMM, and page faults and a copy in every VMM start.
//!
//! What a restored machine needs from `-kernel` is only what shapes its
//! device set: for any bzImage QEMU adds the `linuxboot_dma.bin` option ROM,
//! a RAM block that every state file carries and a restore must find. The
//! kernel's and the initrd's bytes become fw_cfg data items, which a
//! migration stream does not carry and a booted guest never reads again (a
//! reboot ends the VMM: `-no-reboot`). So an incoming launch is given the
//! bzImage's setup code and header with one page of its payload, and no
//! initrd (`siesta bench density --compare kernel-stub` measures both).

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Offset of the setup header's `setup_sects` byte in a bzImage.
const SETUP_SECTS_AT: usize = 0x1f1;
/// Offset of the setup header's magic, `HdrS`.
const MAGIC_AT: usize = 0x202;
const MAGIC: &[u8; 4] = b"HdrS";
/// Bytes of the protected-mode payload kept after the setup code: QEMU
/// copies the payload into fw_cfg without looking inside it.
pub const PAYLOAD_KEPT: usize = 4096;
/// The longest setup code a bzImage can declare: `setup_sects` is one byte,
/// plus the boot sector.
const MAX_SETUP: usize = (u8::MAX as usize + 1) * 512;

#[derive(Debug, thiserror::Error)]
pub enum KernelStubError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a bzImage (no `HdrS` at offset 0x202)", path.display())]
    NotBzImage { path: PathBuf },
    #[error("{} ends inside its setup code ({len} bytes, {setup} declared)", path.display())]
    Truncated {
        path: PathBuf,
        len: usize,
        setup: usize,
    },
}

/// The first bytes of bzImage `kernel` that a stand-in keeps: the boot
/// sector and setup code (with the header QEMU parses) and
/// [`PAYLOAD_KEPT`] bytes of payload, or the whole file if it is shorter.
pub fn stub_bytes<'a>(path: &Path, kernel: &'a [u8]) -> Result<&'a [u8], KernelStubError> {
    if kernel.get(MAGIC_AT..MAGIC_AT + MAGIC.len()) != Some(MAGIC.as_slice()) {
        return Err(KernelStubError::NotBzImage {
            path: path.to_path_buf(),
        });
    }
    // The boot protocol: 0 setup sectors means 4.
    let sects = match kernel[SETUP_SECTS_AT] {
        0 => 4,
        n => usize::from(n),
    };
    let setup = (sects + 1) * 512;
    if kernel.len() < setup {
        return Err(KernelStubError::Truncated {
            path: path.to_path_buf(),
            len: kernel.len(),
            setup,
        });
    }
    Ok(&kernel[..kernel.len().min(setup + PAYLOAD_KEPT)])
}

/// Stand-ins for guest kernels, kept in one directory by the digest of
/// their bytes: processes sharing the directory (a server and a bench)
/// write the same file for the same kernel, and a replaced kernel gets a
/// new one.
#[derive(Debug, Clone)]
pub struct KernelStubs {
    dir: PathBuf,
}

impl KernelStubs {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The stand-in for `kernel`, written when it is not there yet. Reads
    /// the kernel's first pages on every call, so a kernel replaced in
    /// place is never stood in for by its predecessor.
    pub fn for_kernel(&self, kernel: &Path) -> Result<PathBuf, KernelStubError> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| KernelStubError::Io { op, path, source }
        };
        let mut head = Vec::with_capacity(MAX_SETUP + PAYLOAD_KEPT);
        std::fs::File::open(kernel)
            .map_err(io("opening guest kernel", kernel))?
            .take((MAX_SETUP + PAYLOAD_KEPT) as u64)
            .read_to_end(&mut head)
            .map_err(io("reading guest kernel", kernel))?;
        let bytes = stub_bytes(kernel, &head)?;
        let digest = hex::encode(Sha256::digest(bytes));
        let stub = self.dir.join(format!("vmlinuz-{}", &digest[..16]));
        if std::fs::metadata(&stub).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(stub);
        }
        std::fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        // Written aside and renamed: a VMM starting meanwhile in another
        // process never reads half a file.
        let partial = self
            .dir
            .join(format!(".vmlinuz-{}.{}", &digest[..16], std::process::id()));
        std::fs::write(&partial, bytes).map_err(io("writing", &partial))?;
        std::fs::rename(&partial, &stub).map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            io("renaming into place", &stub)(e)
        })?;
        Ok(stub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bzImage-shaped buffer: `sects` setup sectors, then `payload` bytes.
    fn bzimage(sects: u8, payload: usize) -> Vec<u8> {
        let setup = (usize::from(if sects == 0 { 4 } else { sects }) + 1) * 512;
        let mut k: Vec<u8> = (0..setup + payload).map(|i| (i % 251) as u8).collect();
        k[SETUP_SECTS_AT] = sects;
        k[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(MAGIC);
        k
    }

    #[test]
    fn keeps_the_setup_code_and_one_page_of_payload() {
        let k = bzimage(39, 1 << 20);
        let stub = stub_bytes(Path::new("k"), &k).unwrap();
        assert_eq!(stub.len(), 40 * 512 + PAYLOAD_KEPT);
        assert_eq!(stub, &k[..stub.len()]);
        // Zero setup sectors stand for four.
        let k = bzimage(0, 10);
        assert_eq!(stub_bytes(Path::new("k"), &k).unwrap().len(), 5 * 512 + 10);
    }

    #[test]
    fn refuses_what_is_not_a_bzimage() {
        let elf = b"\x7fELF".repeat(4096);
        let err = stub_bytes(Path::new("/k/vmlinux"), &elf).unwrap_err();
        assert!(
            err.to_string().contains("/k/vmlinux is not a bzImage"),
            "{err}"
        );
        let mut short = bzimage(39, 0);
        short.truncate(4096);
        let err = stub_bytes(Path::new("k"), &short).unwrap_err();
        assert!(
            err.to_string().contains("ends inside its setup code"),
            "{err}"
        );
    }

    #[test]
    fn one_file_per_kernel_and_a_new_one_when_it_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let kernel = tmp.path().join("vmlinuz");
        std::fs::write(&kernel, bzimage(39, 100_000)).unwrap();
        let stubs = KernelStubs::new(tmp.path().join("stubs"));
        let first = stubs.for_kernel(&kernel).unwrap();
        assert_eq!(
            std::fs::read(&first).unwrap(),
            std::fs::read(&kernel).unwrap()[..40 * 512 + PAYLOAD_KEPT]
        );
        assert_eq!(stubs.for_kernel(&kernel).unwrap(), first);
        std::fs::write(&kernel, bzimage(30, 100_000)).unwrap();
        let second = stubs.for_kernel(&kernel).unwrap();
        assert_ne!(second, first);
        assert_eq!(std::fs::metadata(&second).unwrap().len(), 31 * 512 + 4096);
        let err = stubs.for_kernel(&tmp.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("opening guest kernel"), "{err}");
    }
}
