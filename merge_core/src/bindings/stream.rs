//! `StreamingMerge` for Python: the streaming merge (`crate::stream`) with
//! the same exceptions as `merge()`. Large updates release the GIL.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::chunk::Chunk;
use crate::stream::StreamingMerge;

use super::checksum::parse_algorithm;
use super::errors::to_py;
use super::merge::PyChunk;

/// Below this many bytes an `update` keeps the GIL: releasing costs more.
const RELEASE_GIL_FROM: usize = 64 << 10;

/// An ordered, verified merge fed block by block: `update(data)` with the
/// bytes of chunk `next_index` (in index order), `end_chunk()` after each
/// chunk, `finish()` at the end. Raises the `merge()` exceptions.
#[pyclass(name = "StreamingMerge", module = "merge_core")]
pub struct PyStreamingMerge {
    inner: StreamingMerge,
}

#[pymethods]
impl PyStreamingMerge {
    #[new]
    #[pyo3(signature = (chunks, algorithm = "sha256", expected_checksum = None))]
    fn new(
        py: Python<'_>,
        chunks: Vec<PyChunk>,
        algorithm: &str,
        expected_checksum: Option<String>,
    ) -> PyResult<Self> {
        let algorithm = parse_algorithm(py, algorithm)?;
        let chunks: Vec<Chunk> = chunks.into_iter().map(PyChunk::into_chunk).collect();
        let inner = StreamingMerge::new(chunks, algorithm, expected_checksum).map_err(|e| to_py(py, e))?;
        Ok(PyStreamingMerge { inner })
    }

    /// The index of the chunk the next bytes belong to; None once all ended.
    #[getter]
    fn next_index(&self) -> Option<u64> {
        self.inner.next_index()
    }

    /// Bytes accepted so far.
    #[getter]
    fn bytes_done(&self) -> u64 {
        self.inner.bytes_done()
    }

    /// The sum of the chunks' sizes.
    #[getter]
    fn total_size(&self) -> u64 {
        self.inner.total_size()
    }

    /// The algorithm's name.
    #[getter]
    fn algorithm(&self) -> &'static str {
        self.inner.algorithm().name()
    }

    /// Hashes the next bytes of chunk `next_index` (any buffer-protocol object).
    fn update(&mut self, py: Python<'_>, data: PyBuffer<u8>) -> PyResult<()> {
        let inner = &mut self.inner;
        if !data.is_c_contiguous() {
            let copy = data.to_vec(py)?;
            return inner.update(&copy).map_err(|e| to_py(py, e));
        }
        // SAFETY: the buffer is C-contiguous and `data` keeps the exporter's
        // buffer alive (and unresizable) until it is dropped after this call.
        let bytes = unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes()) };
        let outcome = if bytes.len() < RELEASE_GIL_FROM {
            inner.update(bytes)
        } else {
            // Hashing is pure Rust over memory we hold: let Python run meanwhile.
            py.detach(|| inner.update(bytes))
        };
        outcome.map_err(|e| to_py(py, e))
    }

    /// Ends chunk `next_index` (size and checksum checked); returns its index.
    fn end_chunk(&mut self, py: Python<'_>) -> PyResult<u64> {
        self.inner.end_chunk().map_err(|e| to_py(py, e))
    }

    /// Checks every chunk ended and the whole file's checksum. Returns
    /// `(size, checksum, algorithm, chunk_count)`.
    fn finish(&mut self, py: Python<'_>) -> PyResult<(u64, String, &'static str, u64)> {
        let out = self.inner.finish().map_err(|e| to_py(py, e))?;
        Ok((out.size, out.checksum, out.algorithm.name(), out.chunk_count))
    }

    fn __repr__(&self) -> String {
        format!(
            "StreamingMerge({:?}, next_index={:?}, bytes_done={})",
            self.inner.algorithm().name(),
            self.inner.next_index(),
            self.inner.bytes_done()
        )
    }
}
