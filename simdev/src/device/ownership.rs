//! Clients and NC ownership: connecting and disconnecting clients, claiming an NC, and an NC's
//! reset, release and reclaim (`reference/driver-abi.md` §1.2; the locks are described in
//! [`crate::device`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use shared::protocol::{ErrorKind, RemoteError, Reply};

use crate::registers::Registers;

use super::dispatch::{Handled, os_refusal, refuse};
use super::{Claim, ClientInfo, Core, Nc, lock, write};
use crate::client::ClientId;

impl Core {
    pub(super) fn connect(&self, pid: u32) -> ClientId {
        let client = ClientId(self.next_client.fetch_add(1, Ordering::Relaxed));
        lock(&self.clients).insert(client, ClientInfo { pid });
        client
    }

    pub(super) fn disconnect(&self, client: ClientId) {
        let mut ncs = 0;
        for nc in &self.ncs {
            if self.owned_by(nc, client) {
                self.reset_nc(nc, client, true);
                ncs += 1;
            }
        }
        let chunks = write(&self.memory).free_all(client);
        let pid = lock(&self.clients).remove(&client).map_or(0, |c| c.pid);
        tracing::info!(
            "client {} (pid {pid}) gone: reclaimed {ncs} NCs and {chunks} chunks",
            client.0
        );
    }

    pub(super) fn nc_ref(&self, nc: u32) -> Option<&Nc> {
        usize::try_from(nc).ok().and_then(|i| self.ncs.get(i))
    }

    pub(super) fn nc(&self, nc: u32) -> Result<&Nc, RemoteError> {
        self.nc_ref(nc).ok_or_else(|| {
            refuse(
                ErrorKind::OutOfRange,
                format!(
                    "NC {nc} does not exist (the device has {} NCs)",
                    self.ncs.len()
                ),
            )
        })
    }

    pub(super) fn owner(&self, nc: &Nc) -> Option<Arc<Claim>> {
        lock(&nc.claim).clone()
    }

    pub(super) fn owned_by(&self, nc: &Nc, client: ClientId) -> bool {
        self.owner(nc).is_some_and(|c| c.client == client)
    }

    /// NC `nc` and its claim, if `client` owns it.
    pub(super) fn owned(
        &self,
        client: ClientId,
        nc: u32,
    ) -> Result<(&Nc, Arc<Claim>), RemoteError> {
        let n = self.nc(nc)?;
        match self.owner(n) {
            Some(claim) if claim.client == client => Ok((n, claim)),
            Some(claim) => Err(refuse(
                ErrorKind::NotOwner,
                format!("NC {nc} is owned by pid {}, not by this client", claim.pid),
            )),
            None => Err(refuse(
                ErrorKind::NotOwner,
                format!("NC {nc} is not claimed by this client (ClaimNc first)"),
            )),
        }
    }

    fn pid_of(&self, client: ClientId) -> u32 {
        lock(&self.clients).get(&client).map_or(0, |c| c.pid)
    }

    pub(super) fn claim_nc(&self, client: ClientId, nc: u32) -> Handled {
        let n = self.nc(nc)?;
        let pid = self.pid_of(client);
        let mut slot = lock(&n.claim);
        if let Some(claim) = slot.as_ref() {
            if claim.client != client {
                return Err(refuse(
                    ErrorKind::NcBusy,
                    format!("NC {nc} is owned by another client (pid {})", claim.pid),
                ));
            }
            let fds = claim
                .registers
                .client_fds()
                .map_err(|e| os_refusal("claiming the NC", &e))?;
            return Ok((Reply::NcClaimed { nc }, fds));
        }
        let registers =
            Registers::new(&self.map, nc).map_err(|e| os_refusal("claiming the NC", &e))?;
        lock(&n.compute).clear();
        let fds = registers
            .client_fds()
            .map_err(|e| os_refusal("claiming the NC", &e))?;
        *slot = Some(Arc::new(Claim {
            client,
            pid,
            registers,
        }));
        tracing::info!("NC {nc} claimed by client {} (pid {pid})", client.0);
        Ok((Reply::NcClaimed { nc }, fds))
    }

    /// Stops and forgets `nc`'s queues, drops its notification queue (freeing its chunk),
    /// abandons its execution (parked or running) and restarts its `compute_idx` count, zeroes
    /// its registers, DMEM, SBUF and PSUM, forgets its activation tables and, when `release`,
    /// clears its owner.
    pub(super) fn reset_nc(&self, nc: &Nc, owner: ClientId, release: bool) {
        let nq = {
            let mut state = lock(&nc.state);
            // The epoch moves before the compute state is cleared: an engine checks it under
            // the `compute` lock, so nothing an abandoned execution computes survives.
            nc.epoch.fetch_add(1, Ordering::AcqRel);
            state.queues.clear();
            state.exec_batches = 0;
            lock(&nc.dmem).fill(0);
            lock(&nc.compute).clear();
            state.nq.take()
        };
        nc.seq.changed();
        if let Some(nq) = nq {
            // The client may have freed the chunk itself; then there is nothing left to free.
            let _ = write(&self.memory).free(owner, nq.chunk().handle());
        }
        let mut slot = lock(&nc.claim);
        if let Some(claim) = slot.as_ref() {
            claim.registers.zero();
        }
        if release {
            *slot = None;
            tracing::info!("NC {} released", nc.index);
        }
    }
}

#[cfg(test)]
mod tests;
