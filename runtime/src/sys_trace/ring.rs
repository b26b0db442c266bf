//! A bounded event ring: preallocated once, never grows; when full the oldest event is
//! overwritten and counted as dropped.

use std::collections::VecDeque;

use shared::NrtStatus;

use crate::error::NrtError;

/// A bounded ring of `T`.
///
/// Invariants: `events.len() <= capacity`, and `events` never reallocates after
/// [`EventRing::with_capacity`] (its allocation holds at least `capacity` elements, and a push
/// into a full ring pops the front first), so [`EventRing::push`] never allocates.
#[derive(Debug)]
pub struct EventRing<T> {
    events: VecDeque<T>,
    capacity: usize,
    /// Events pushed since the ring was made (the next event's index).
    recorded: u64,
    /// Events overwritten before they were fetched.
    dropped: u64,
}

impl<T> EventRing<T> {
    /// A ring of `capacity` events, allocated now.
    ///
    /// # Errors
    /// NRT_INVALID for a capacity of 0; NRT_RESOURCE when the memory cannot be had (naming the
    /// size).
    pub fn with_capacity(capacity: u64) -> Result<Self, NrtError> {
        if capacity == 0 {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                "max_events_per_nc is 0: a trace ring holds at least one event",
            ));
        }
        let too_big = || {
            NrtError::new(
                NrtStatus::Resource,
                format!(
                    "a trace ring of {capacity} events ({} bytes each) cannot be allocated",
                    std::mem::size_of::<T>()
                ),
            )
        };
        let n = usize::try_from(capacity).map_err(|_| too_big())?;
        let mut events = VecDeque::new();
        events.try_reserve_exact(n).map_err(|_| too_big())?;
        Ok(Self {
            events,
            capacity: n,
            recorded: 0,
            dropped: 0,
        })
    }

    /// Appends `event`, overwriting (dropping) the oldest when full. Never allocates.
    pub fn push(&mut self, event: T) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
        self.recorded += 1;
    }

    /// Removes and returns up to `max` of the oldest events, oldest first, with the index
    /// (0-based, counted since the ring was made) of the first one.
    pub fn take_oldest(&mut self, max: usize) -> (u64, Vec<T>) {
        let first = self.recorded - self.events.len() as u64;
        let n = max.min(self.events.len());
        (first, self.events.drain(..n).collect())
    }

    /// Copies of the held events, oldest first (the ring keeps them).
    pub fn snapshot(&self) -> Vec<T>
    where
        T: Clone,
    {
        self.events.iter().cloned().collect()
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event is held.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The most events held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Events pushed since the ring was made.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// Events overwritten before they were fetched.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_overwrites_the_oldest_and_counts_the_drops() {
        let mut r = EventRing::with_capacity(3).unwrap();
        for i in 0..5u32 {
            r.push(i);
        }
        assert_eq!((r.len(), r.recorded(), r.dropped()), (3, 5, 2));
        assert_eq!(r.snapshot(), vec![2, 3, 4]);
        let (first, got) = r.take_oldest(2);
        assert_eq!((first, got), (2, vec![2, 3]));
        r.push(5);
        let (first, got) = r.take_oldest(usize::MAX);
        assert_eq!((first, got), (4, vec![4, 5]));
        assert!(r.is_empty());
        assert_eq!(r.dropped(), 2, "fetching is not dropping");
    }

    #[test]
    fn pushing_never_grows_the_allocation() {
        let mut r = EventRing::with_capacity(5).unwrap();
        let cap = r.events.capacity();
        for i in 0..1000u64 {
            r.push(i);
            if i % 7 == 0 {
                let _ = r.take_oldest(3);
            }
        }
        assert_eq!(r.events.capacity(), cap);
    }

    #[test]
    fn impossible_capacities_are_typed_errors() {
        let e = EventRing::<u64>::with_capacity(0).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        let e = EventRing::<[u64; 16]>::with_capacity(u64::MAX / 4).unwrap_err();
        assert_eq!(e.status, NrtStatus::Resource, "{e}");
        assert!(e.message.contains("cannot be allocated"), "{e}");
    }
}
