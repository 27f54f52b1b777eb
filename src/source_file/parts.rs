//! Parts of a large remote file read ahead of the copy: the one copied
//! from now, and the reads in flight after it (the S3 and HDFS readers).

use std::collections::VecDeque;

use tokio::task::JoinHandle;

/// The part being copied (`P`) and the reads of the parts after it (each
/// ending in `T`), in order. Reads still in flight are aborted when the
/// file is dropped.
pub struct PartsAhead<P, T> {
    pub current: Option<(u64, P)>,
    ahead: VecDeque<(u64, JoinHandle<T>)>,
}

impl<P, T> Default for PartsAhead<P, T> {
    fn default() -> Self {
        PartsAhead {
            current: None,
            ahead: VecDeque::new(),
        }
    }
}

impl<P, T> PartsAhead<P, T> {
    /// Starting from part `index` already in hand.
    pub fn holding(index: u64, part: P) -> Self {
        PartsAhead {
            current: Some((index, part)),
            ahead: VecDeque::new(),
        }
    }

    fn abort_ahead(&mut self) {
        for (_, task) in self.ahead.drain(..) {
            task.abort();
        }
    }

    /// The read of part `index`, with up to `limit` parts after it (below
    /// `count`) set going by `spawn`; `None` past the end. A part asked
    /// for out of order drops the reads ahead and starts again from it.
    pub fn take<E>(
        &mut self,
        index: u64,
        count: u64,
        limit: usize,
        mut spawn: impl FnMut(u64) -> Result<JoinHandle<T>, E>,
    ) -> Result<Option<JoinHandle<T>>, E> {
        if self.ahead.front().is_some_and(|(i, _)| *i != index) {
            self.abort_ahead();
        }
        let mut next = self.ahead.back().map_or(index, |(i, _)| i + 1);
        while next < count && self.ahead.len() <= limit {
            self.ahead.push_back((next, spawn(next)?));
            next += 1;
        }
        Ok(self.ahead.pop_front().map(|(_, task)| task))
    }
}

impl<P, T> Drop for PartsAhead<P, T> {
    fn drop(&mut self) {
        self.abort_ahead();
    }
}
