//! PyO3 bindings: thin wrappers that convert arguments, release the GIL
//! around the Rust core, and turn `MergeError` into named Python exceptions.

pub mod buffer;
pub mod checksum;
pub mod chunk_file;
pub mod errors;
pub mod merge;
pub mod put_file;
pub mod stream;
