//! The hardware backend (placeholder until filled in).

/// `/dev/neuronN` through the aws-neuronx-dkms ioctls.
#[derive(Debug)]
pub struct NeuronDevice;
