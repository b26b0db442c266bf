//! The simdev backend (placeholder until filled in).

/// A connection to simdev.
#[derive(Debug)]
pub struct SimDevice;
