//! A fixed pool of aligned buffers shared by the merge pipeline's threads.
//! A filled buffer travels as `Arc<Block>` to every consumer; when the last
//! consumer drops it, the buffer goes back to the pool. The reader waits for a
//! free buffer, so memory is bounded by `blocks * block_size` whatever the
//! file size.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use crate::aligned::AlignedBuf;

pub struct Pool {
    free: Receiver<AlignedBuf>,
    give_back: SyncSender<AlignedBuf>,
}

pub struct Block {
    buf: Option<AlignedBuf>,
    len: usize,
    give_back: SyncSender<AlignedBuf>,
}

impl Pool {
    pub fn new(blocks: usize, block_size: usize) -> Self {
        let (give_back, free) = sync_channel(blocks);
        for _ in 0..blocks {
            give_back.send(AlignedBuf::new(block_size)).expect("pool has room");
        }
        Pool { free, give_back }
    }

    /// Waits for a free buffer.
    pub fn take(&self) -> AlignedBuf {
        // The pool holds a sender itself, so this only waits for consumers.
        self.free.recv().expect("pool sender alive")
    }

    /// Shares `len` filled bytes of `buf` with the consumers.
    pub fn share(&self, buf: AlignedBuf, len: usize) -> Arc<Block> {
        Arc::new(Block { buf: Some(buf), len, give_back: self.give_back.clone() })
    }
}

impl Block {
    pub fn data(&self) -> &[u8] {
        &self.buf.as_ref().expect("block owns its buffer").as_slice()[..self.len]
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // The pool has room for every buffer it made, so this never blocks.
            let _ = self.give_back.send(buf);
        }
    }
}
