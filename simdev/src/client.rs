//! Clients of the device: one [`ClientId`] per control connection. NCs, memory chunks and
//! notification queues belong to a client, and are reclaimed when its connection ends.

/// One client of the device: one control connection. Unique for the simdev run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);
