//! Clients and NC ownership: connecting and disconnecting clients, claiming an NC (reclaiming a
//! gone owner first, [`crate::client`]), and an NC's reset, release and reclaim
//! (`reference/driver-abi.md` §1.2; the locks are described in [`crate::device`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use shared::protocol::{ErrorKind, RemoteError, Reply};

use crate::registers::Registers;

use super::dispatch::{Handled, refuse, registers_refusal};
use super::{Claim, ClientInfo, Core, Nc, lock, write};
use crate::client::{ClientId, Peer};
use crate::counters::bump;

impl Core {
    pub(super) fn connect(&self, peer: Peer) -> ClientId {
        let client = ClientId(self.next_client.fetch_add(1, Ordering::Relaxed));
        lock(&self.clients).insert(
            client,
            ClientInfo {
                peer,
                runtime_version: None,
            },
        );
        client
    }

    pub(super) fn disconnect(&self, client: ClientId) {
        self.reclaim(client, "its connection ended");
    }

    /// Takes back everything `client` holds: each of its NCs is reset and released, its
    /// memory chunks are freed, and it is forgotten. `why` is logged. Idempotent: a client
    /// reclaimed at a claim conflict is reclaimed again (finding nothing, or what requests
    /// already in flight took since) when its connection ends.
    fn reclaim(&self, client: ClientId, why: &str) {
        let _reclaim = lock(&self.reclaim_lock);
        self.reclaim_locked(client, why);
    }

    /// [`Self::reclaim`], with `reclaim_lock` already held by the caller.
    fn reclaim_locked(&self, client: ClientId, why: &str) {
        let mut ncs = 0;
        for nc in &self.ncs {
            if self.owned_by(nc, client) {
                self.reset_nc(nc, client, true);
                ncs += 1;
            }
        }
        let chunks = write(&self.memory).free_all(client);
        let pid = lock(&self.clients)
            .remove(&client)
            .map_or(0, |c| c.peer.pid());
        tracing::info!(
            "client {} (pid {pid}) gone ({why}): reclaimed {ncs} NCs and {chunks} chunks",
            client.0
        );
    }

    /// Why `client` is gone, or `None` while it may live. A client no longer connected (already
    /// reclaimed) is gone.
    fn gone(&self, client: ClientId) -> Option<String> {
        match lock(&self.clients).get(&client) {
            Some(info) => info.peer.gone(),
            None => Some("it is no longer connected".into()),
        }
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

    /// Whether `client` owns `nc`: one atomic load of [`Nc::owner_id`], which changes with the
    /// claim under its lock (the answer is the claim's at one instant, as reading the claim
    /// itself would be).
    pub(super) fn owned_by(&self, nc: &Nc, client: ClientId) -> bool {
        client.0 != 0 && nc.owner_id.load(Ordering::Acquire) == client.0
    }

    /// NC `nc` and its claim, if `client` owns it.
    pub(super) fn owned(
        &self,
        client: ClientId,
        nc: u32,
    ) -> Result<(&Nc, Arc<Claim>), RemoteError> {
        self.with_owned(client, nc, Arc::clone)
    }

    /// NC `nc` and what `f` made of its claim, if `client` owns it, `f` run under the claim's
    /// lock (it must take no lock): a caller that only uses the claim for a moment takes no
    /// reference to it ([`Core::owned`] clones one).
    pub(super) fn with_owned<R>(
        &self,
        client: ClientId,
        nc: u32,
        f: impl FnOnce(&Arc<Claim>) -> R,
    ) -> Result<(&Nc, R), RemoteError> {
        let n = self.nc(nc)?;
        let owner = lock(&n.claim);
        match owner.as_ref() {
            Some(claim) if claim.client == client => Ok((n, f(claim))),
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
        lock(&self.clients).get(&client).map_or(0, |c| c.peer.pid())
    }

    /// Claims NC `nc` for `client`. When another client owns it, that owner's process is
    /// checked first: a gone owner (`crate::client`) is reclaimed now, as the driver releases
    /// a dead process's NCs before its parent can reap it, and the claim proceeds.
    pub(super) fn claim_nc(&self, client: ClientId, nc: u32) -> Handled {
        let n = self.nc(nc)?;
        // For the whole claim: a reclaim in progress (a disconnect) finishes first.
        let _reclaim = lock(&self.reclaim_lock);
        if let Some(owner) = self.owner(n).filter(|c| c.client != client)
            && let Some(why) = self.gone(owner.client)
        {
            tracing::info!(
                "NC {nc} claimed by client {} while its owner, client {} (pid {}), is gone",
                client.0,
                owner.client.0,
                owner.pid
            );
            self.reclaim_locked(owner.client, &why);
        }
        let pid = self.pid_of(client);
        let _owner_change = lock(&n.ownership);
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
                .map_err(|e| registers_refusal("claiming the NC", &e))?;
            return Ok((Reply::NcClaimed { nc }, fds));
        }
        let registers =
            Registers::new(&self.map, nc).map_err(|e| registers_refusal("claiming the NC", &e))?;
        lock(&n.compute).clear();
        // A new owner: the NC's trace subscription (an earlier owner's) ends.
        self.tracer.forget_nc(nc);
        let fds = registers
            .client_fds()
            .map_err(|e| registers_refusal("claiming the NC", &e))?;
        *slot = Some(Arc::new(Claim {
            client,
            pid,
            registers,
        }));
        nc_owner_store(n, client.0);
        tracing::info!("NC {nc} claimed by client {} (pid {pid})", client.0);
        Ok((Reply::NcClaimed { nc }, fds))
    }

    /// Resets `nc`: stops and forgets its queues, drops its notification queue (freeing its
    /// chunk), abandons its execution (parked or running) and restarts its `compute_idx`
    /// count, zeroes its registers (semaphores and events), DMEM, SBUF and PSUM, forgets its
    /// activation tables and, when `release`, clears its owner. Every reset counts in the
    /// NC's `resets` (an NcReset, a release and a reclaim alike) and takes the latency
    /// model's `per_nc_reset_ns` of device time (slept when pacing).
    ///
    /// Does nothing when `owner` no longer holds the NC (see [`Nc::ownership`]).
    pub(super) fn reset_nc(&self, nc: &Nc, owner: ClientId, release: bool) {
        let _owner_change = lock(&nc.ownership);
        if !self.owned_by(nc, owner) {
            tracing::debug!(
                "NC {}: reset for client {} skipped: it no longer owns the NC",
                nc.index,
                owner.0
            );
            return;
        }
        let (nq, released) = {
            let mut state = lock(&nc.state);
            // The epoch moves, the semaphores and events are zeroed and, on a release, the
            // owner is cleared in one hold of the claim's lock, under which counts are taken
            // (`Core::take_start`): a count taken before is of the old epoch (its execution is
            // abandoned), one taken after is of the new epoch and of the same owner. So an
            // execution that is not abandoned still belongs to the NC's owner when it posts
            // under this `state` lock (`Core::finish_execution`).
            // The epoch moves before the compute state is cleared: an engine checks it under
            // the `compute` lock, so nothing an abandoned execution computes survives.
            let released = {
                let mut slot = lock(&nc.claim);
                nc.epoch.fetch_add(1, Ordering::AcqRel);
                if let Some(claim) = slot.as_ref() {
                    claim.registers.zero();
                }
                if release {
                    nc_owner_store(nc, 0);
                    slot.take()
                } else {
                    None
                }
            };
            state.queues.clear();
            state.exec_batches = 0;
            lock(&nc.dmem).fill(0);
            lock(&nc.compute).clear();
            (state.nq.take(), released)
        };
        nc.seq.changed();
        if let Some(nq) = nq {
            // The client may have freed the chunk itself; then there is nothing left to free.
            let _ = write(&self.memory).free(owner, nq.chunk().handle());
        }
        if release {
            self.tracer.forget_nc(nc.index);
            tracing::info!("NC {} released", nc.index);
        }
        // The claim (its registers' mapping and eventfd) is dropped outside the NC's locks.
        drop(released);
        bump(&nc.counters.resets, 1);
        self.charge_reset(nc);
    }

    /// The reset's modelled duration: `per_nc_reset_ns` on the NC's simulated clock, and in
    /// wall-clock time when pacing.
    fn charge_reset(&self, nc: &Nc) {
        let Some(model) = self.latency_model() else {
            return;
        };
        if model.per_nc_reset_ns == 0 {
            return;
        }
        nc.clock.advance(model.per_nc_reset_ns);
        if model.wall_clock_pacing {
            std::thread::sleep(std::time::Duration::from_nanos(model.per_nc_reset_ns));
        }
    }
}

/// Records `client` (0: none) as `nc`'s owner for [`Core::owned_by`]; called with the `claim`
/// lock held, right after the claim itself changed.
fn nc_owner_store(nc: &Nc, client: u64) {
    nc.owner_id.store(client, Ordering::Release);
}

#[cfg(test)]
mod tests;
