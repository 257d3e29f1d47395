//! `MergeError` as Python exceptions, all under one `MergeError` root.
//!
//! Each instance carries attributes so callers can act without parsing the
//! message: `index` (chunk index or None) on all of them, plus `expected`,
//! `actual` and `path` where they apply; `MergeIOError` has `errno`, `path`
//! and `operation`. Bad arguments (unknown algorithm, malformed hex) are plain
//! `ValueError`s: they are a caller's bug, not a merge outcome.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyModule;

use crate::errors::MergeError as RustError;

create_exception!(merge_core, MergeError, PyException, "Root of every merge_core error.");
create_exception!(
    merge_core,
    ChunkChecksumMismatch,
    MergeError,
    "A chunk's bytes do not hash to its expected checksum (`index`, `expected`, `actual`, `path`)."
);
create_exception!(
    merge_core,
    ChunkSizeMismatch,
    MergeError,
    "A chunk file does not hold its expected number of bytes (`index`, `expected`, `actual`, `path`)."
);
create_exception!(
    merge_core,
    MissingChunk,
    MergeError,
    "The chunk indexes are not exactly 0..N-1: `index` is the lowest one absent."
);
create_exception!(merge_core, DuplicateChunk, MergeError, "`index` is given by more than one chunk.");
create_exception!(
    merge_core,
    FileChecksumMismatch,
    MergeError,
    "The merged file does not hash to `expected_checksum` (`expected`, `actual`)."
);
create_exception!(
    merge_core,
    MergeIOError,
    MergeError,
    "An operating-system error (`errno`, `path`, `operation`; `index` when it is a chunk's)."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MergeError", py.get_type::<MergeError>())?;
    m.add("ChunkChecksumMismatch", py.get_type::<ChunkChecksumMismatch>())?;
    m.add("ChunkSizeMismatch", py.get_type::<ChunkSizeMismatch>())?;
    m.add("MissingChunk", py.get_type::<MissingChunk>())?;
    m.add("DuplicateChunk", py.get_type::<DuplicateChunk>())?;
    m.add("FileChecksumMismatch", py.get_type::<FileChecksumMismatch>())?;
    m.add("MergeIOError", py.get_type::<MergeIOError>())?;
    Ok(())
}

/// Converts a core error into its Python exception, attributes set.
/// `Interrupted` has no Python form: the caller re-raises the stored error.
pub fn to_py(py: Python<'_>, err: RustError) -> PyErr {
    let message = err.to_string();
    let index = err.index();
    let (pyerr, attrs): (PyErr, Vec<(&str, Py<PyAny>)>) = match err {
        RustError::ChunkChecksumMismatch { path, expected, actual, .. } => (
            ChunkChecksumMismatch::new_err(message),
            vec![
                ("expected", expected.into_pyobject(py).unwrap().into_any().unbind()),
                ("actual", actual.into_pyobject(py).unwrap().into_any().unbind()),
                ("path", path_obj(py, &path)),
            ],
        ),
        RustError::ChunkSizeMismatch { path, expected, actual, .. } => (
            ChunkSizeMismatch::new_err(message),
            vec![
                ("expected", expected.into_pyobject(py).unwrap().into_any().unbind()),
                ("actual", actual.into_pyobject(py).unwrap().into_any().unbind()),
                ("path", path_obj(py, &path)),
            ],
        ),
        RustError::MissingChunk { .. } => (MissingChunk::new_err(message), vec![]),
        RustError::DuplicateChunk { .. } => (DuplicateChunk::new_err(message), vec![]),
        RustError::FileChecksumMismatch { expected, actual } => (
            FileChecksumMismatch::new_err(message),
            vec![
                ("expected", expected.into_pyobject(py).unwrap().into_any().unbind()),
                ("actual", actual.into_pyobject(py).unwrap().into_any().unbind()),
            ],
        ),
        RustError::Io { path, op, source, .. } => (
            MergeIOError::new_err(message),
            vec![
                ("errno", source.raw_os_error().into_pyobject(py).unwrap().into_any().unbind()),
                ("path", path_obj(py, &path)),
                ("operation", op.into_pyobject(py).unwrap().into_any().unbind()),
            ],
        ),
        RustError::InvalidArgument(_) => return PyValueError::new_err(message),
        RustError::Interrupted => return MergeError::new_err(message),
    };
    let value = pyerr.value(py);
    let _ = value.setattr("index", index);
    for (name, obj) in attrs {
        let _ = value.setattr(name, obj);
    }
    pyerr
}

fn path_obj(py: Python<'_>, path: &std::path::Path) -> Py<PyAny> {
    path.to_string_lossy().into_owned().into_pyobject(py).unwrap().into_any().unbind()
}
