//! `save_changed_pages` for QEMU: device state from `xen-save-devices-state`,
//! the guest's changed pages from `/proc`, framed by the template's stream
//! (see [`super::ram_frame`] for the layout and why).
//!
//! The QMP part runs on the caller's task; scanning pagemap and writing the
//! pages (tens to hundreds of MiB, then fsync) runs on a blocking thread,
//! which starts as soon as the vCPUs stop, while QEMU saves the device
//! state, and takes the device sections last.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::time::{Duration, Instant};

use super::changed_pages::{RamMapping, Run};
use super::cmdline::MEMORY_BACKEND_ID;
use super::fdset::Access;
use super::hashing_writer::HashingWriter;
use super::ram_frame::{RamFrame, PAGE_SIZE};
use super::write_behind::WriteBehind;
use super::QemuInstance;
use crate::{SaveInfo, StateWrite, VmmError};

/// Pages read from the VMM per `process_vm_readv` (1 MiB, in at most as
/// many pieces as the kernel takes in one call).
const PAGES_PER_READ: u64 = 256;

impl QemuInstance {
    pub(super) async fn save_changed_inner(
        &mut self,
        state: &Path,
        base: &Path,
        write: StateWrite,
    ) -> Result<SaveInfo, VmmError> {
        let t0 = Instant::now();
        if self.spec.memory.shared {
            return Err(self.invalid(
                "save_changed_pages",
                "RAM is a shared mapping: its pages are in the backing file; use MemorySave::InBackingFile".into(),
            ));
        }
        let frame = self.read_frame(base)?;
        let st = qmp!(self, "query-status", self.qmp.query_status());
        if st.running {
            qmp!(self, "stop", self.qmp.stop());
        }
        // The pages are read and written while QEMU saves the device state:
        // with the vCPUs stopped neither changes the other, and the device
        // sections only end the stream.
        let (deliver, devices) = sync_channel(1);
        let job = WriteJob {
            pid: self.process.pid(),
            memory: self.spec.memory.path.clone(),
            state: state.to_path_buf(),
            frame,
            devices,
            write,
        };
        let writer = tokio::task::spawn_blocking(move || job.run());
        let saved = self.save_devices(state).await.map(|bytes| {
            // A writer that failed has stopped listening: its error is
            // the one reported.
            let _ = deliver.send(bytes);
        });
        drop(deliver);
        let written = writer
            .await
            .map_err(|e| self.invalid("save_changed_pages", format!("writer thread: {e}")));
        let id = self.spec.id.clone();
        let written = written.and_then(|w| {
            saved?;
            w.map_err(|(op, path, source)| VmmError::Io {
                id,
                op,
                path,
                source,
            })
        });
        let (write, sync, sha256) = written.inspect_err(|_| {
            // Half a state file is of no use to anyone.
            let _ = std::fs::remove_file(state);
        })?;
        let state_bytes = std::fs::metadata(state)
            .map_err(|e| self.io("stat state file", state, e))?
            .len();
        Ok(SaveInfo {
            state_bytes,
            write,
            sync,
            total: t0.elapsed(),
            sha256: Some(sha256),
        })
    }

    /// The device sections, from `xen-save-devices-state` into a scratch
    /// file beside `state` (removed again), handed to QEMU as a descriptor.
    async fn save_devices(&mut self, state: &Path) -> Result<Vec<u8>, VmmError> {
        let path = devices_path(state);
        let passed = self
            .pass_file("create the device state file", &path, Access::CreateWrite)
            .await;
        let set = match passed {
            Ok(set) => set,
            Err(e) => {
                // Created before QEMU refused the descriptor.
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let saved = self.qmp.xen_save_devices_state(&set.path()).await;
        self.drop_fdsets(&[set]).await;
        if let Err(e) = saved {
            let _ = std::fs::remove_file(&path);
            return Err(self.qmp_error("xen-save-devices-state", e).await);
        }
        let bytes = std::fs::read(&path);
        let _ = std::fs::remove_file(&path);
        bytes.map_err(|e| self.io("read device state", &path, e))
    }

    fn read_frame(&self, base: &Path) -> Result<RamFrame, VmmError> {
        let bytes = std::fs::read(base).map_err(|e| self.io("read base state file", base, e))?;
        let bad = |detail: String| VmmError::StateFile {
            id: self.spec.id.clone(),
            path: base.to_path_buf(),
            detail,
        };
        let frame = RamFrame::parse(&bytes, MEMORY_BACKEND_ID).map_err(bad)?;
        let want = self.spec.memory_mib << 20;
        if frame.memory_len() != want {
            return Err(bad(format!(
                "its guest RAM is {} bytes, this VM has {want}",
                frame.memory_len()
            )));
        }
        Ok(frame)
    }
}

/// Where QEMU writes the device state: beside the state file, so one
/// directory holds all of a save's scratch.
fn devices_path(state: &Path) -> PathBuf {
    let mut name = state.file_name().unwrap_or_default().to_os_string();
    name.push(".devices");
    state.with_file_name(name)
}

type JobError = (&'static str, PathBuf, std::io::Error);

/// The blocking half: scan, read, write, fsync.
struct WriteJob {
    pid: u32,
    memory: PathBuf,
    state: PathBuf,
    frame: RamFrame,
    /// The device state, delivered once QEMU has saved it; a closed
    /// channel means it was not.
    devices: Receiver<Vec<u8>>,
    write: StateWrite,
}

impl WriteJob {
    /// Returns the write and fsync times and the file's SHA-256.
    fn run(self) -> Result<(Duration, Duration, String), JobError> {
        let t_write = Instant::now();
        let proc_err = |op| {
            let path = PathBuf::from(format!("/proc/{}", self.pid));
            move |e| (op, path, e)
        };
        let mapping = RamMapping::find(self.pid, &self.memory, self.frame.memory_len())
            .map_err(proc_err("find the guest RAM mapping in"))?;
        let runs = mapping
            .changed()
            .map_err(proc_err("read the page map of"))?;
        let state_path = self.state.clone();
        let state_err = |op| {
            let path = state_path.clone();
            move |e| (op, path, e)
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.state)
            .map_err(state_err("create state file"))?;
        let mut out = self
            .frame
            .begin(HashingWriter::new(WriteBehind::new(&file, self.write)))
            .map_err(state_err("write state file"))?;
        for batch in batches(&runs) {
            let offsets: Vec<u64> = batch
                .iter()
                .flat_map(|r| (0..r.pages).map(|p| r.offset + p * PAGE_SIZE as u64))
                .collect();
            let mut read_failed = false;
            out.append_pages(&offsets, |slots| {
                mapping
                    .read_runs(&batch, slots)
                    .inspect_err(|_| read_failed = true)
            })
            .map_err(|e| match read_failed {
                true => proc_err("read guest RAM of")(e),
                false => state_err("write state file")(e),
            })?;
        }
        let devices = self.devices.recv().map_err(|_| {
            let e = std::io::Error::other("QEMU did not save the device state");
            state_err("end state file")(e)
        })?;
        let mut hashing = out
            .finish(&devices)
            .map_err(state_err("write state file"))?;
        hashing.flush().map_err(state_err("write state file"))?;
        let write = t_write.elapsed();
        let t_sync = Instant::now();
        // The hashing thread drains its queue while the file syncs.
        file.sync_all().map_err(state_err("fsync state file"))?;
        let (sha256, _) = hashing.finish().map_err(state_err("hash state file"))?;
        if let Some(dir) = self.state.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|f| f.sync_all())
                .map_err(|e| ("fsync directory of state file", dir.to_path_buf(), e))?;
        }
        Ok((write, t_sync.elapsed(), sha256))
    }
}

/// The changed runs cut into batches of at most [`PAGES_PER_READ`] pages,
/// a run split where a batch fills up.
fn batches(runs: &[Run]) -> Vec<Vec<Run>> {
    let mut all = Vec::new();
    let mut batch: Vec<Run> = Vec::new();
    let mut room = PAGES_PER_READ;
    for run in runs {
        let mut done = 0;
        while done < run.pages {
            let n = (run.pages - done).min(room);
            let skip = done * PAGE_SIZE as u64;
            batch.push(Run {
                offset: run.offset + skip,
                addr: run.addr + skip,
                pages: n,
            });
            done += n;
            room -= n;
            if room == 0 {
                all.push(std::mem::take(&mut batch));
                room = PAGES_PER_READ;
            }
        }
    }
    if !batch.is_empty() {
        all.push(batch);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_hold_at_most_a_read_and_keep_every_page_in_order() {
        let run = |page: u64, pages: u64| Run {
            offset: page * PAGE_SIZE as u64,
            addr: 0x1000_0000 + page * PAGE_SIZE as u64,
            pages,
        };
        let runs = [run(0, 10), run(20, 600), run(700, 1)];
        let got = batches(&runs);
        let sizes: Vec<u64> = got
            .iter()
            .map(|b| b.iter().map(|r| r.pages).sum())
            .collect();
        assert_eq!(sizes, [256, 256, 99]);
        let pages: Vec<u64> = got
            .iter()
            .flatten()
            .flat_map(|r| (0..r.pages).map(move |p| r.offset / PAGE_SIZE as u64 + p))
            .collect();
        let want: Vec<u64> = (0..10).chain(20..620).chain(700..701).collect();
        assert_eq!(pages, want);
        assert!(got
            .iter()
            .flatten()
            .all(|r| r.addr - 0x1000_0000 == r.offset));
        assert!(batches(&[]).is_empty());
    }
}
