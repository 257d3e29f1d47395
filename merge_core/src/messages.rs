//! What the merge's feeder sends its hasher (`Msg`), in chunk order.
//!
//! In a file of its own because both ends use it: the feeder
//! (`merge_feeder.rs`) sends, the hasher (`merge.rs`) receives.

use crate::errors::MergeError;
use crate::window::Bytes;

/// One message from the feeder to the hasher; they arrive in chunk order.
pub(crate) enum Msg {
    /// Bytes of the current chunk, already written to the output, and
    /// whether the feeder already hashed them into the chunk's checksum.
    Data(Bytes, bool),
    /// All bytes of the chunk at this position (in index order) were sent,
    /// with the chunk's checksum if the feeder computed it.
    ChunkEnd(usize, Option<String>),
    /// The chunk at this position failed (or the output write failed while
    /// copying it); nothing follows.
    Fail(usize, MergeError),
}
