//! Bytes handed in by Python, read without a copy where their layout allows.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// The bytes of `data`: the exporter's own memory when it is C-contiguous, else
/// a copy made into `copy`.
pub fn contiguous<'a>(py: Python<'_>, data: &'a PyBuffer<u8>, copy: &'a mut Vec<u8>) -> PyResult<&'a [u8]> {
    if data.is_c_contiguous() {
        // SAFETY: the buffer is C-contiguous and `data`, borrowed for as long as
        // the slice, keeps the exporter's buffer alive (and unresizable).
        return Ok(unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes()) });
    }
    *copy = data.to_vec(py)?;
    Ok(copy)
}
