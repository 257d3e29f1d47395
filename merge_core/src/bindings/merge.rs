//! `merge()` for Python: converts chunks, runs the Rust merge with the GIL
//! released, and reports progress by briefly re-attaching to Python.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::chunk::Chunk;
use crate::errors::MergeError;
use crate::merge::{merge as merge_chunks, MergeOptions};

use super::checksum::parse_algorithm;
use super::errors::to_py;

/// A chunk as Python gives it: any object with these attributes (the
/// `merge_core.Chunk` dataclass mirrors this struct field for field).
#[derive(FromPyObject)]
pub struct PyChunk {
    index: u64,
    path: PathBuf,
    size: u64,
    checksum: String,
}

impl PyChunk {
    pub fn into_chunk(self) -> Chunk {
        Chunk { index: self.index, path: self.path, size: self.size, checksum: self.checksum }
    }
}

/// Low-level merge; `merge_core.merge` is the public wrapper. Returns
/// `(output_path, size, checksum, algorithm, chunk_count)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // the Python signature's keywords
#[pyo3(signature = (chunks, output_path, algorithm = "sha256", expected_checksum = None, fsync = true, progress = None, mmap = false, drop_behind = None))]
pub fn merge(
    py: Python<'_>,
    chunks: Vec<PyChunk>,
    output_path: PathBuf,
    algorithm: &str,
    expected_checksum: Option<String>,
    fsync: bool,
    progress: Option<Py<PyAny>>,
    mmap: bool,
    drop_behind: Option<bool>,
) -> PyResult<(String, u64, String, &'static str, u64)> {
    let mut options = MergeOptions {
        algorithm: parse_algorithm(py, algorithm)?,
        expected_checksum,
        fsync,
        mmap,
        ..MergeOptions::default()
    };
    match drop_behind {
        None => {} // durable: always; page cache: from DROP_BEHIND_FROM bytes
        Some(true) => options.drop_behind_from = 0,
        Some(false) => options.drop_behind = 0,
    }
    let chunks: Vec<Chunk> = chunks.into_iter().map(PyChunk::into_chunk).collect();

    let mut raised: Option<PyErr> = None;
    // The whole merge runs detached: it only does file I/O and hashing on
    // Rust-owned memory, and can take seconds. Progress re-attaches briefly,
    // at most once per `progress_interval`, to call back and check signals
    // (so Ctrl-C stops a long merge, removing the temporary file).
    let outcome = py.detach(|| {
        let mut report = |done: u64, total: u64| -> bool {
            let Some(callback) = &progress else { return true };
            Python::attach(|py| match callback.call1(py, (done, total)).and_then(|_| py.check_signals()) {
                Ok(()) => true,
                Err(err) => {
                    raised = Some(err);
                    false
                }
            })
        };
        merge_chunks(chunks, &output_path, &options, &mut report)
    });
    match outcome {
        Ok(o) => Ok((
            o.output_path.to_string_lossy().into_owned(),
            o.size,
            o.checksum,
            o.algorithm.name(),
            o.chunk_count,
        )),
        Err(MergeError::Interrupted) if raised.is_some() => Err(raised.take().expect("checked")),
        Err(err) => Err(to_py(py, err)),
    }
}
