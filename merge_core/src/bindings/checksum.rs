//! `Hasher` and `checksum_file` for Python: the same checksum code the merge
//! uses, so the upload service verifies chunks on receipt identically.

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::checksum::{self, Algorithm, Hasher};

use super::errors::to_py;

/// Below this many bytes an `update` keeps the GIL: releasing costs more.
const RELEASE_GIL_FROM: usize = 64 << 10;

pub fn parse_algorithm(py: Python<'_>, name: &str) -> PyResult<Algorithm> {
    Algorithm::parse(name).map_err(|e| to_py(py, e))
}

/// Streaming checksum: `update(data)` any number of times, then `finalize()`
/// for lowercase hex. `finalize` does not reset the state (like hashlib's
/// `hexdigest`). Large updates release the GIL.
#[pyclass(name = "Hasher", module = "merge_core")]
pub struct PyHasher {
    inner: Hasher,
}

#[pymethods]
impl PyHasher {
    #[new]
    #[pyo3(signature = (algorithm = "sha256"))]
    fn new(py: Python<'_>, algorithm: &str) -> PyResult<Self> {
        Ok(PyHasher { inner: Hasher::new(parse_algorithm(py, algorithm)?) })
    }

    /// The algorithm's name: "sha256", "blake3" or "crc32c".
    #[getter]
    fn algorithm(&self) -> &'static str {
        self.inner.algorithm().name()
    }

    /// Adds bytes (any object with the buffer protocol).
    fn update(&mut self, py: Python<'_>, data: PyBuffer<u8>) -> PyResult<()> {
        if !data.is_c_contiguous() {
            let copy = data.to_vec(py)?;
            self.inner.update(&copy);
            return Ok(());
        }
        // SAFETY: the buffer is C-contiguous and `data` keeps the exporter's
        // buffer alive (and unresizable) until it is dropped after this call.
        let bytes = unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes()) };
        if bytes.len() < RELEASE_GIL_FROM {
            self.inner.update(bytes);
        } else {
            // Hashing is pure Rust over memory we hold: let Python run meanwhile.
            let inner = &mut self.inner;
            py.detach(|| inner.update(bytes));
        }
        Ok(())
    }

    /// The checksum of everything so far, as lowercase hex.
    fn finalize(&self) -> String {
        self.inner.hex()
    }

    /// Same as `finalize()`, named as in hashlib.
    fn hexdigest(&self) -> String {
        self.inner.hex()
    }

    /// An independent copy of the current state.
    fn copy(&self) -> Self {
        PyHasher { inner: self.inner.clone() }
    }

    fn __repr__(&self) -> String {
        format!("Hasher({:?})", self.inner.algorithm().name())
    }
}

/// Checksum of a whole file, as lowercase hex. Releases the GIL while reading.
#[pyfunction]
#[pyo3(signature = (path, algorithm = "sha256"))]
pub fn checksum_file(py: Python<'_>, path: PathBuf, algorithm: &str) -> PyResult<String> {
    let algorithm = parse_algorithm(py, algorithm)?;
    // File I/O and hashing only: no Python objects touched while detached.
    py.detach(|| checksum::checksum_file(&path, algorithm)).map(|(hex, _)| hex).map_err(|e| to_py(py, e))
}
