//! merge_core: ordered chunk merge with streaming checksum checks.
//!
//! The Rust core (`merge`, `checksum`, ...) has no Python in it; the PyO3
//! bindings live in `bindings/` behind the `python` feature. This file only
//! declares modules and registers the Python ones.

pub mod aligned;
pub mod checksum;
pub mod chunk;
pub mod chunk_file;
pub mod errors;
mod failure;
pub mod handover;
pub mod merge;
mod merge_feeder;
mod messages;
pub mod options;
pub mod output;
mod pair_hasher;
pub mod pool;
pub mod put_file;
pub mod sha256x2;
pub mod stream;
mod window;
mod writer;

#[cfg(feature = "python")]
mod bindings;

#[cfg(feature = "python")]
#[pyo3::pymodule]
fn _merge_core(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    use pyo3::prelude::*;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    bindings::errors::register(m)?;
    m.add_class::<bindings::checksum::PyHasher>()?;
    m.add_function(wrap_pyfunction!(bindings::checksum::checksum_file, m)?)?;
    m.add_function(wrap_pyfunction!(bindings::chunk_file::write_chunk, m)?)?;
    m.add_function(wrap_pyfunction!(bindings::put_file::put_file, m)?)?;
    m.add("ALGORITHMS", ("sha256", "blake3", "crc32c"))?;
    m.add_function(wrap_pyfunction!(bindings::merge::merge, m)?)?;
    m.add_class::<bindings::stream::PyStreamingMerge>()?;
    m.add("BUFFER_BUDGET", options::MergeOptions::default().buffer_budget())?;
    m.add("DROP_BEHIND_FROM", options::DROP_BEHIND_FROM)?;
    Ok(())
}
