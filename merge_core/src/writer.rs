//! The merge's writing end: writes the temporary output in pieces, starts
//! writeback as it goes when the merge is durable, and drops the output from
//! the page cache a fixed distance behind the writer ("drop-behind").
//!
//! Why drop-behind: on this kind of VM every fresh page-cache page is faulted
//! in from the host (free page reporting hands freed guest memory back), so
//! writing gigabytes into new page-cache pages is several times slower than
//! rewriting the same few hot pages. Dropping written-back output 64 MiB
//! behind keeps the set of pages small and hot. The cost: the output is not
//! cached after the merge, and its writeback starts during the merge rather
//! than up to 30 s later (for `fsync: false` nothing waits for durability at
//! the end, so what the merge promises is unchanged).

use std::fs::File;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::errors::MergeError;
use crate::options::MergeOptions;
use crate::output::TempOutput;

pub(crate) struct Writer<'a> {
    file: &'a File,
    path: &'a Path,
    options: &'a MergeOptions,
    /// Drop the output behind the writer (see the module comment).
    dropping: bool,
    written: u64,
    flushed: u64,
    dropped: u64,
}

impl<'a> Writer<'a> {
    /// The writing end of `output`, for a merge of `total` bytes.
    pub(crate) fn new(output: &'a TempOutput, options: &'a MergeOptions, total: u64) -> Self {
        Writer {
            file: output.file(),
            path: output.temp_path(),
            options,
            dropping: drops_behind(options, total),
            written: 0,
            flushed: 0,
            dropped: 0,
        }
    }

    /// Writes `data` in pieces of at most `write_size`.
    pub(crate) fn write(&mut self, data: &[u8]) -> Result<(), MergeError> {
        let mut file = self.file;
        for piece in data.chunks(self.options.write_size.max(1)) {
            file.write_all(piece).map_err(|e| MergeError::io(None, self.path, "write", e))?;
            self.wrote(piece.len());
        }
        Ok(())
    }

    fn wrote(&mut self, n: usize) {
        self.written += n as u64;
        if (self.options.fsync || self.dropping)
            && self.written - self.flushed >= self.options.writeback_every
        {
            let fd = self.file.as_raw_fd();
            start_writeback(fd, self.flushed, self.written - self.flushed);
            self.flushed = self.written;
            let lag = self.options.drop_behind;
            if self.dropping && self.flushed >= self.dropped + lag + self.options.writeback_every {
                let end = self.flushed - lag;
                drop_written(
                    fd,
                    self.dropped,
                    end - self.dropped,
                    self.options.fsync || self.options.drop_waits,
                );
                self.dropped = end;
            }
        }
    }

    /// Starts writeback of the rest when the merge is durable (the final
    /// fsync then waits for less).
    pub(crate) fn finish(&mut self) {
        if self.options.fsync && self.written > self.flushed {
            start_writeback(self.file.as_raw_fd(), self.flushed, self.written - self.flushed);
            self.flushed = self.written;
        }
    }
}

/// Whether a merge of `total` bytes with `options` drops its output behind
/// the writer: always when durable, else from `drop_behind_from` bytes on.
pub(crate) fn drops_behind(options: &MergeOptions, total: u64) -> bool {
    options.drop_behind > 0 && (options.fsync || total >= options.drop_behind_from)
}

/// Drops `offset..offset+len` from the page cache, after waiting for its
/// writeback if `wait` (else only pages already clean go). Only a hint too:
/// errors surface at the final fsync.
fn drop_written(fd: libc::c_int, offset: u64, len: u64, wait: bool) {
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    // SAFETY: plain syscalls on an open fd.
    unsafe {
        libc::sync_file_range(fd, offset as libc::off64_t, len as libc::off64_t, flags);
        libc::posix_fadvise(fd, offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED);
    }
}

fn start_writeback(fd: libc::c_int, offset: u64, len: u64) {
    // Only a hint: the final fsync is what makes the data durable.
    // SAFETY: plain syscall on an open fd.
    unsafe {
        libc::sync_file_range(fd, offset as libc::off64_t, len as libc::off64_t, libc::SYNC_FILE_RANGE_WRITE);
    }
}
