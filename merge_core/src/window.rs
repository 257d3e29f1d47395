//! A window of a chunk file, the unit the merge's feeder hands its hasher:
//! its size (`window_size`) and its bytes (`Bytes`), either a mapping of the
//! file (`Mapping`) or a pool buffer they were read() into.
//!
//! In a file of its own because the feeder (`merge_feeder.rs`) makes
//! windows, the hasher (`merge.rs`) consumes them and the messages between
//! the two (`messages.rs`) carry them.

use std::sync::Arc;

use crate::aligned::PAGE;
use crate::options::MergeOptions;
use crate::pool::Block;

/// The window (mapping or buffer) size: `block_size` rounded up to a page.
pub(crate) fn window_size(options: &MergeOptions) -> usize {
    options.block_size.max(PAGE).div_ceil(PAGE) * PAGE
}

/// Bytes on their way from the feeder to the hasher.
pub(crate) enum Bytes {
    Mapped(Mapping),
    Buffer(Arc<Block>),
}

impl Bytes {
    pub(crate) fn data(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.data(),
            Bytes::Buffer(b) => b.data(),
        }
    }
}

/// A read-only shared mapping of part of a chunk file, unmapped on drop (so
/// its pages stop counting toward RSS). Only sound while nobody truncates
/// the file: Serentak chunk files are immutable once written (temp + rename).
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone.
unsafe impl Send for Mapping {}

impl Mapping {
    pub(crate) fn new(fd: libc::c_int, offset: u64, len: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh read-only mapping; offset is page-aligned (windows
        // are whole pages) and len > 0.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }

    fn data(&self) -> &[u8] {
        // SAFETY: ptr maps len readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
