//! An NC's semaphores and events, and its notification eventfd.
//!
//! On V2/V3 the events and semaphores of an NC sit in one 8 KiB register window that the
//! driver lets a process mmap (RESOURCE_MMAP_INFO SEMAPHORE, `reference/driver-abi.md` §1.6,
//! §4): events at +0, semaphore values at +0x1000, 4 bytes each. simdev keeps that window in a
//! memfd it maps read-write and sends to the NC's owner sealed against writable mappings
//! (`F_SEAL_FUTURE_WRITE`), so the owner can poll values without a syscall but can change them
//! only through requests or DMA register writes. The INCR/DECR windows of silicon are single
//! 32-bit writes that hardware turns into an add/subtract; here they are atomic
//! `fetch_add`/`fetch_sub` on the window (driver-abi.md §7 hazard 8).
//!
//! Each claim gets a fresh window and a fresh eventfd, so nothing of one owner's state reaches
//! the next.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::memfd::{MFdFlags, memfd_create};
use shared::address_map::{AddressMap, Register, SEM_WINDOW_SEMAPHORES, SEM_WINDOW_SIZE};
use shared::memory::{MemError, SharedChunk};
use thiserror::Error;

/// Creating an NC's register file failed (an OS resource problem).
#[derive(Debug, Error)]
pub enum RegistersError {
    /// `memfd_create` of the window failed.
    #[error("creating the semaphore window memfd")]
    CreateWindow(#[source] nix::Error),
    /// `ftruncate` of the window failed.
    #[error("sizing the semaphore window memfd")]
    SizeWindow(#[source] nix::Error),
    /// Mapping the window failed.
    #[error("mapping the semaphore window")]
    MapWindow(#[source] MemError),
    /// Sealing the window against writable mappings failed (needs Linux 5.1+).
    #[error("sealing the semaphore window against writable mappings")]
    SealWindow(#[source] nix::Error),
    /// `eventfd` failed.
    #[error("creating the notification eventfd")]
    CreateEventFd(#[source] nix::Error),
    /// `dup` of a descriptor for the client failed.
    #[error("duplicating a descriptor for the client")]
    Dup(#[source] std::io::Error),
}

impl RegistersError {
    /// The errno of the system call that failed, when it was one.
    pub fn errno(&self) -> Option<nix::Error> {
        match self {
            Self::CreateWindow(e) | Self::SizeWindow(e) | Self::SealWindow(e) => Some(*e),
            Self::CreateEventFd(e) => Some(*e),
            Self::Dup(e) => e.raw_os_error().map(nix::Error::from_raw),
            Self::MapWindow(_) => None,
        }
    }
}

/// A register index outside the arch's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("{what} index {index} is out of range (the NC has {count})")]
pub struct BadIndex {
    /// "semaphore" or "event".
    pub what: &'static str,
    /// The index given.
    pub index: u32,
    /// The arch's count.
    pub count: u32,
}

/// One NC's register file: the semaphore/event window and the notification eventfd.
#[derive(Debug)]
pub struct Registers {
    window: SharedChunk,
    memfd: OwnedFd,
    eventfd: EventFd,
    semaphores: u32,
    events: u32,
}

impl Registers {
    /// A zeroed register file for NC `nc` of `map`. The window is placed at the PA of the NC's
    /// first event register, so window offsets line up with the register PAs (events at +0,
    /// the semaphore READ window at +0x1000).
    ///
    /// # Errors
    /// [`RegistersError`] when a memfd, mapping, seal or eventfd cannot be made.
    pub fn new(map: &AddressMap, nc: u32) -> Result<Self, RegistersError> {
        let memfd = memfd_create(
            "simdev-semaphores",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(RegistersError::CreateWindow)?;
        let len = i64::try_from(SEM_WINDOW_SIZE)
            .map_err(|_| RegistersError::SizeWindow(nix::Error::EFBIG))?;
        nix::unistd::ftruncate(&memfd, len).map_err(RegistersError::SizeWindow)?;
        let pa = map.register_address(Register::Event { nc, index: 0 });
        let window = SharedChunk::map_fd(&memfd, pa, SEM_WINDOW_SIZE, true)
            .map_err(RegistersError::MapWindow)?;
        // Seal after mapping: simdev's own writable mapping stays valid, every later writable
        // mapping (the client's included), write(2) and resizing are refused.
        let seals = SealFlag::F_SEAL_FUTURE_WRITE
            | SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_SEAL;
        fcntl(&memfd, FcntlArg::F_ADD_SEALS(seals)).map_err(RegistersError::SealWindow)?;
        let eventfd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(RegistersError::CreateEventFd)?;
        Ok(Self {
            window,
            memfd,
            eventfd,
            semaphores: map.arch.semaphores_per_nc(),
            events: map.arch.events_per_nc(),
        })
    }

    /// The two descriptors a claiming client receives, in [`shared::protocol::Reply::NcClaimed`]
    /// order: the sealed window memfd and the notification eventfd (both dup'ed).
    ///
    /// # Errors
    /// [`RegistersError::Dup`].
    pub fn client_fds(&self) -> Result<Vec<OwnedFd>, RegistersError> {
        let memfd = self.memfd.try_clone().map_err(RegistersError::Dup)?;
        let eventfd = std::os::fd::AsFd::as_fd(&self.eventfd)
            .try_clone_to_owned()
            .map_err(RegistersError::Dup)?;
        Ok(vec![memfd, eventfd])
    }

    fn semaphore_pa(&self, index: u32) -> Result<u64, BadIndex> {
        if index >= self.semaphores {
            return Err(BadIndex {
                what: "semaphore",
                index,
                count: self.semaphores,
            });
        }
        Ok(self.window.pa() + SEM_WINDOW_SEMAPHORES as u64 + 4 * u64::from(index))
    }

    fn event_pa(&self, index: u32) -> Result<u64, BadIndex> {
        if index >= self.events {
            return Err(BadIndex {
                what: "event",
                index,
                count: self.events,
            });
        }
        Ok(self.window.pa() + 4 * u64::from(index))
    }

    /// Checks a semaphore index without touching it.
    ///
    /// # Errors
    /// [`BadIndex`].
    pub fn check_semaphore(&self, index: u32) -> Result<(), BadIndex> {
        self.semaphore_pa(index).map(drop)
    }

    /// SEMAPHORE_INCREMENT / the INCR window: adds `value` (wrapping, as i32 arithmetic).
    ///
    /// # Errors
    /// [`BadIndex`].
    pub fn semaphore_add(&self, index: u32, value: u32) -> Result<(), BadIndex> {
        let pa = self.semaphore_pa(index)?;
        self.atomic(self.window.fetch_add_u32(pa, value, Ordering::AcqRel));
        Ok(())
    }

    /// SEMAPHORE_DECREMENT / the DECR window: subtracts `value` (wrapping).
    ///
    /// # Errors
    /// [`BadIndex`].
    pub fn semaphore_sub(&self, index: u32, value: u32) -> Result<(), BadIndex> {
        let pa = self.semaphore_pa(index)?;
        self.atomic(self.window.fetch_sub_u32(pa, value, Ordering::AcqRel));
        Ok(())
    }

    /// SEMAPHORE_WRITE / the SET window.
    ///
    /// # Errors
    /// [`BadIndex`].
    pub fn semaphore_set(&self, index: u32, value: u32) -> Result<(), BadIndex> {
        let pa = self.semaphore_pa(index)?;
        self.atomic(self.window.store_u32(pa, value, Ordering::Release));
        Ok(())
    }

    /// SEMAPHORE_READ: the value's 32 bits (an i32 on silicon).
    ///
    /// # Errors
    /// [`BadIndex`].
    pub fn semaphore(&self, index: u32) -> Result<u32, BadIndex> {
        let pa = self.semaphore_pa(index)?;
        Ok(self.atomic(self.window.load_u32(pa, Ordering::Acquire)))
    }

    /// EVENT_SET.
    ///
    /// # Errors
    /// [`BadIndex`] (unlike the driver, index == count is refused).
    pub fn event_set(&self, index: u32, value: u32) -> Result<(), BadIndex> {
        let pa = self.event_pa(index)?;
        self.atomic(self.window.store_u32(pa, value, Ordering::Release));
        Ok(())
    }

    /// EVENT_GET.
    ///
    /// # Errors
    /// [`BadIndex`].
    pub fn event(&self, index: u32) -> Result<u32, BadIndex> {
        let pa = self.event_pa(index)?;
        Ok(self.atomic(self.window.load_u32(pa, Ordering::Acquire)))
    }

    /// Zeroes every semaphore and event.
    pub fn zero(&self) {
        if let Err(e) = self.window.fill(self.window.pa(), SEM_WINDOW_SIZE, 0) {
            tracing::error!("zeroing a semaphore window: {e}");
        }
    }

    /// The notification eventfd, for a write submitted with a connection thread's wait
    /// ([`crate::uring`]).
    pub fn eventfd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.eventfd)
    }

    /// Writes 1 to the notification eventfd (after a notification was posted). A full counter
    /// (`EAGAIN`: the client never reads it) is not an error: the fd is already readable.
    pub fn signal(&self) {
        match self.eventfd.write(1) {
            Ok(_) | Err(nix::Error::EAGAIN) => {}
            Err(e) => tracing::warn!("writing the notification eventfd: {e}"),
        }
    }

    /// The value of an atomic access whose PA was range-checked against the window; a failure
    /// would be a simdev bug, logged and read as 0.
    fn atomic<T: Default>(&self, result: Result<T, MemError>) -> T {
        result.unwrap_or_else(|e| {
            tracing::error!("semaphore window access: {e}");
            T::default()
        })
    }

    /// Applies a DMA write of `value` to `reg` of this NC. Tail-increment registers are not
    /// part of the register file (the caller routes them to the DMA queues).
    ///
    /// # Errors
    /// [`RegisterWriteError`]: the READ window is read-only, a tail-increment register, or an
    /// index out of range.
    pub fn write(&self, reg: Register, value: u32) -> Result<(), RegisterWriteError> {
        match reg {
            Register::Event { index, .. } => self.event_set(index, value)?,
            Register::SemaphoreSet { index, .. } => self.semaphore_set(index, value)?,
            Register::SemaphoreIncrement { index, .. } => self.semaphore_add(index, value)?,
            Register::SemaphoreDecrement { index, .. } => self.semaphore_sub(index, value)?,
            Register::SemaphoreRead { .. } => return Err(RegisterWriteError::ReadOnly),
            Register::TxTailIncrement { .. } | Register::RxTailIncrement { .. } => {
                return Err(RegisterWriteError::NotInRegisterFile);
            }
        }
        Ok(())
    }
}

/// A register write the register file refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum RegisterWriteError {
    /// A write to the semaphore READ window.
    #[error("the semaphore READ window is read-only")]
    ReadOnly,
    /// A DMA tail-increment register (handled by the DMA engine, not here).
    #[error("a DMA tail-increment register is not a semaphore or event")]
    NotInRegisterFile,
    /// Index out of range.
    #[error(transparent)]
    Index(#[from] BadIndex),
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::address_map::Arch;

    fn registers() -> Registers {
        let map = AddressMap {
            arch: Arch::Trn1,
            nc_count: 2,
            hbm_bytes_per_nc: 1 << 20,
        };
        Registers::new(&map, 1).unwrap()
    }

    #[test]
    fn semaphores_are_i32_arithmetic_in_the_window() {
        let regs = registers();
        regs.semaphore_add(5, 3).unwrap();
        regs.semaphore_sub(5, 4).unwrap();
        assert_eq!(regs.semaphore(5).unwrap(), u32::MAX, "3 - 4 = -1");
        regs.semaphore_set(255, 7).unwrap();
        regs.event_set(0, 1).unwrap();
        assert_eq!(regs.event(0).unwrap(), 1);
        assert_eq!(
            regs.semaphore(256),
            Err(BadIndex {
                what: "semaphore",
                index: 256,
                count: 256
            })
        );
        assert!(regs.event_set(256, 1).is_err());
        regs.zero();
        assert_eq!(regs.semaphore(255).unwrap(), 0);
        assert_eq!(regs.event(0).unwrap(), 0);
    }

    #[test]
    fn the_client_sees_values_but_cannot_map_the_window_writable() {
        let regs = registers();
        regs.semaphore_set(3, 42).unwrap();
        let fds = regs.client_fds().unwrap();
        let view = SharedChunk::map_fd(&fds[0], 0, SEM_WINDOW_SIZE, false).unwrap();
        let offset = SEM_WINDOW_SEMAPHORES as u64 + 12;
        assert_eq!(view.load_u32(offset, Ordering::Acquire).unwrap(), 42);
        assert!(
            SharedChunk::map_fd(&fds[0], 0, SEM_WINDOW_SIZE, true).is_err(),
            "F_SEAL_FUTURE_WRITE refuses writable mappings"
        );
        assert!(nix::unistd::write(&fds[0], b"x").is_err());
        regs.signal();
        let mut count = [0u8; 8];
        nix::unistd::read(&fds[1], &mut count).unwrap();
        assert_eq!(u64::from_ne_bytes(count), 1);
    }

    #[test]
    fn dma_writes_follow_the_windows() {
        let regs = registers();
        regs.write(Register::SemaphoreIncrement { nc: 1, index: 2 }, 5)
            .unwrap();
        regs.write(Register::SemaphoreDecrement { nc: 1, index: 2 }, 1)
            .unwrap();
        assert_eq!(regs.semaphore(2).unwrap(), 4);
        assert_eq!(
            regs.write(Register::SemaphoreRead { nc: 1, index: 2 }, 1),
            Err(RegisterWriteError::ReadOnly)
        );
    }
}
