//! `write_chunk` for Python: the upload service checks and stages a received
//! chunk in one worker-thread call, the GIL released throughout.

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::chunk_file;

use super::buffer::contiguous;
use super::checksum::parse_algorithm;
use super::errors::to_py;

/// Writes `data` to a new 0600 file at `path` while hashing it; returns the
/// lowercase hex digest. With `expected` and another digest the file is
/// removed (not fsynced); otherwise it is fsynced when `fsync` is set. An
/// existing `path` or any OS error raises `MergeIOError` and leaves no file.
#[pyfunction]
#[pyo3(signature = (path, data, algorithm = "sha256", expected = None, fsync = true))]
pub fn write_chunk(
    py: Python<'_>,
    path: PathBuf,
    data: PyBuffer<u8>,
    algorithm: &str,
    expected: Option<String>,
    fsync: bool,
) -> PyResult<String> {
    let algorithm = parse_algorithm(py, algorithm)?;
    let mut copy = Vec::new();
    let bytes = contiguous(py, &data, &mut copy)?;
    // File I/O and hashing over memory we hold: no Python objects touched.
    py.detach(|| chunk_file::write_chunk(&path, bytes, algorithm, expected.as_deref(), fsync))
        .map(|written| written.digest().to_owned())
        .map_err(|e| to_py(py, e))
}
