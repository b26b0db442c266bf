//! simdev's per-NC counters (`system_data.neuron_hw_counters`), read as a plain client of the
//! simdev that `NEURON_SIMDEV_SOCKET` names. A monitor never starts a simdev of its own: with
//! no socket, or none listening, the counters are absent and `error` says why.

use std::path::PathBuf;

use runtime::backend::Device;
use runtime::backend::sim::SimDevice;
use shared::protocol::NcCounters;

/// What is known of the device, for `neuron_hardware_info`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSummary {
    /// The architecture's name (`trn1`, `inf2`, `trn2`).
    pub arch: &'static str,
    /// Physical NCs.
    pub nc_count: u32,
    /// HBM bytes per NC.
    pub hbm_bytes_per_nc: u64,
    /// NCs per logical core for a runtime started now: `NEURON_LOGICAL_NC_CONFIG`, else the
    /// arch's default (2 on trn2), as `nrt ls` says.
    pub lnc: u32,
}

/// One reading of simdev's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HwSample {
    /// Why there are no counters ("" when there are).
    pub error: String,
    /// The device, when reachable.
    pub device: Option<DeviceSummary>,
    /// Each NC's counters since simdev started, by physical NC index.
    pub ncs: Vec<(u32, NcCounters)>,
}

/// A connection to the simdev at `NEURON_SIMDEV_SOCKET`, opened on first use and reopened
/// after a failure.
#[derive(Debug)]
pub struct HwReader {
    socket: Option<PathBuf>,
    dev: Option<SimDevice>,
}

impl HwReader {
    /// The simdev named by `NEURON_SIMDEV_SOCKET` (none when unset or empty).
    pub fn from_env() -> Self {
        let socket = std::env::var_os("NEURON_SIMDEV_SOCKET")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        Self { socket, dev: None }
    }

    /// Reads every NC's counters; on failure the sample's `error` names the socket and cause.
    pub fn read(&mut self) -> HwSample {
        let Some(socket) = &self.socket else {
            return HwSample {
                error: "NEURON_SIMDEV_SOCKET is not set: no simdev to read hardware counters from \
                        (nrt monitor and nrt top never start one)"
                    .into(),
                ..HwSample::default()
            };
        };
        if self.dev.is_none() {
            match SimDevice::connect_with_timeout(socket, crate::TOOL_CONTROL_TIMEOUT) {
                Ok(d) => self.dev = Some(d),
                Err(e) => {
                    return HwSample {
                        error: format!(
                            "no simdev reachable at {}: {}",
                            socket.display(),
                            crate::error_chain(&e)
                        ),
                        ..HwSample::default()
                    };
                }
            }
        }
        let Some(dev) = &self.dev else {
            return HwSample::default();
        };
        let info = dev.info();
        let config = runtime::config::RuntimeConfig {
            lnc: runtime::config::RuntimeConfig::lnc_from_lookup(|k| std::env::var(k).ok())
                .ok()
                .flatten(),
            ..runtime::config::RuntimeConfig::default()
        };
        let device = DeviceSummary {
            arch: info.arch.name(),
            nc_count: info.nc_count,
            hbm_bytes_per_nc: info.hbm_bytes_per_nc,
            lnc: config
                .lnc_on(info.arch)
                .unwrap_or_else(|_| runtime::config::default_lnc(info.arch)),
        };
        let mut ncs = Vec::new();
        for nc in 0..info.nc_count {
            match dev.nc_counters(nc) {
                Ok(c) => ncs.push((nc, c)),
                Err(e) => {
                    let error = format!(
                        "reading NC {nc}'s counters from simdev at {}: {}",
                        socket.display(),
                        crate::error_chain(&e)
                    );
                    self.dev = None;
                    return HwSample {
                        error,
                        device: Some(device),
                        ncs: Vec::new(),
                    };
                }
            }
        }
        HwSample {
            error: String::new(),
            device: Some(device),
            ncs,
        }
    }
}
