//! Dispatches and reports waiting for the next flush tick.
//!
//! Bounded: while the predictor is unreachable the oldest items are dropped
//! (and counted) rather than growing a VM's memory without limit.

use std::collections::VecDeque;

/// A bounded FIFO that counts what it had to drop.
#[derive(Debug)]
pub struct BoundedQueue<T> {
    items: VecDeque<T>,
    capacity: usize,
    dropped: u64,
}

impl<T> BoundedQueue<T> {
    /// A queue holding at most `capacity` items (at least one).
    pub fn new(capacity: usize) -> Self {
        BoundedQueue { items: VecDeque::new(), capacity: capacity.max(1), dropped: 0 }
    }

    /// Appends `item`, dropping the oldest when full.
    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
            self.dropped += 1;
        }
        self.items.push_back(item);
    }

    /// Removes and returns up to `max` of the oldest items.
    pub fn take(&mut self, max: usize) -> Vec<T> {
        let n = max.min(self.items.len());
        self.items.drain(..n).collect()
    }

    /// Puts a batch that could not be sent back at the front, oldest first,
    /// dropping whatever no longer fits.
    pub fn requeue(&mut self, batch: Vec<T>) {
        for item in batch.into_iter().rev() {
            if self.items.len() == self.capacity {
                self.dropped += 1;
                continue;
            }
            self.items.push_front(item);
        }
    }

    /// The oldest item, if any.
    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Items dropped so far; reading resets the count.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn drops_oldest_and_counts() {
        let mut q = BoundedQueue::new(3);
        for i in 0..5 {
            q.push(i);
        }
        assert_eq!(q.take_dropped(), 2);
        assert_eq!(q.take(2), vec![2, 3]);
        assert_eq!(q.take(10), vec![4]);
        assert!(q.is_empty());
    }

    #[test]
    fn requeue_keeps_order_within_capacity() {
        let mut q = BoundedQueue::new(4);
        q.push(1);
        q.push(2);
        q.push(3);
        let batch = q.take(2);
        q.push(4);
        q.requeue(batch);
        assert_eq!(q.take(10), vec![1, 2, 3, 4]);
        let mut q = BoundedQueue::new(2);
        q.push(9);
        q.push(8);
        q.requeue(vec![1, 2]);
        assert_eq!(q.take_dropped(), 2);
        assert_eq!(q.len(), 2);
    }
}
