//! The merge's output: a temporary file beside `output_path`, renamed into
//! place only once complete and verified. Dropping an uncommitted `TempOutput`
//! removes the temporary file, so a failed merge leaves nothing behind (a
//! SIGKILL can leave the temporary file, never a partial `output_path`).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::errors::MergeError;

/// Marks temporary files; operators may delete `*.merge-tmp` files that no
/// running merge owns (e.g. after a crash).
pub const TEMP_SUFFIX: &str = ".merge-tmp";

pub struct TempOutput {
    file: Option<File>,
    temp_path: PathBuf,
    final_path: PathBuf,
    committed: bool,
}

impl TempOutput {
    /// Creates a new, empty temporary file in `final_path`'s directory.
    pub fn create_beside(final_path: &Path) -> Result<Self, MergeError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = final_path.file_name().ok_or_else(|| {
            MergeError::InvalidArgument(format!("output path {} names no file", final_path.display()))
        })?;
        let dir = parent_dir(final_path);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let mut tries = 0;
        loop {
            let mut temp_name = OsString::from(".");
            temp_name.push(name);
            temp_name.push(format!(
                ".{}-{:x}-{}{TEMP_SUFFIX}",
                std::process::id(),
                nanos,
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            let temp_path = dir.join(temp_name);
            match OpenOptions::new().write(true).create_new(true).open(&temp_path) {
                Ok(file) => {
                    return Ok(TempOutput {
                        file: Some(file),
                        temp_path,
                        final_path: final_path.to_path_buf(),
                        committed: false,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 100 => tries += 1,
                Err(e) => return Err(MergeError::io(None, temp_path, "create", e)),
            }
        }
    }

    pub fn file(&self) -> &File {
        self.file.as_ref().expect("temporary output is open until commit")
    }

    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    /// Reserves `len` bytes so a full disk fails fast, before any reading.
    /// Filesystems without `fallocate` are fine: the writes will tell.
    pub fn preallocate(&self, len: u64) -> Result<(), MergeError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::fallocate(self.file().as_raw_fd(), 0, 0, len as libc::off_t) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOSPC) || err.raw_os_error() == Some(libc::EFBIG) {
                return Err(MergeError::io(None, &self.temp_path, "allocate", err));
            }
        }
        Ok(())
    }

    /// Makes the temporary file the output: fsync it (if `durable`), rename it
    /// over `final_path` (atomic), then fsync the directory (if `durable`) so
    /// the rename itself survives a crash.
    pub fn commit(mut self, durable: bool) -> Result<(), MergeError> {
        let file = self.file.take().expect("commit once");
        if durable {
            file.sync_all().map_err(|e| MergeError::io(None, &self.temp_path, "fsync", e))?;
        }
        drop(file);
        fs::rename(&self.temp_path, &self.final_path)
            .map_err(|e| MergeError::io(None, &self.final_path, "rename into", e))?;
        self.committed = true;
        if durable {
            let dir = parent_dir(&self.final_path);
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| MergeError::io(None, dir, "fsync directory", e))?;
        }
        Ok(())
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if !self.committed {
            self.file.take();
            let _ = fs::remove_file(&self.temp_path);
        }
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}
