//! `put_file` for Python: the local blob store writes a whole object into place
//! in one worker-thread call, the GIL released throughout.

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::put_file as core;

use super::buffer::contiguous;
use super::errors::to_py;

/// Writes `data` to the new file `staged` beside `path` (its folder made 0700),
/// fsyncs it when `fsync` is set, renames it over `path`, then fsyncs `path`'s
/// folder and each of `folders`. Any OS error raises `MergeIOError`; one before
/// the rename leaves no staged file and `path` untouched.
#[pyfunction]
#[pyo3(signature = (path, staged, data, fsync = true, folders = None))]
pub fn put_file(
    py: Python<'_>,
    path: PathBuf,
    staged: PathBuf,
    data: PyBuffer<u8>,
    fsync: bool,
    folders: Option<Vec<PathBuf>>,
) -> PyResult<()> {
    let folders = folders.unwrap_or_default();
    let mut copy = Vec::new();
    let bytes = contiguous(py, &data, &mut copy)?;
    py.detach(|| core::put_file(&path, &staged, bytes, fsync, &folders)).map_err(|e| to_py(py, e))
}
