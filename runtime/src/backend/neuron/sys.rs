//! The system-call layer of the hardware backend: the opened `/dev/neuronN` and its `ioctl` and
//! `mmap`. This is the only module of the backend with `unsafe`.
//!
//! [`DeviceFile::ioctl`] is a safe function, which is only sound if the kernel never touches
//! memory outside what it is given. Two rules make that so:
//!
//! - Every request is looked up in [`arg_shape`], the table of requests this backend sends. An
//!   unknown request is refused with `ENOTTY` and an argument of the wrong size with `EINVAL`,
//!   both before the system call, so the driver's `copy_from_user`/`copy_to_user` of
//!   `sizeof(struct)` bytes always stays inside the slice.
//! - Arguments carrying a user pointer (only MEM_ALLOC_V2's `mem_handle` out-pointer here) cannot
//!   go through [`DeviceFile::ioctl`]: they use [`DeviceFile::ioctl_out_u64`], which writes the
//!   address of its own `u64` into the pointer field itself, so a caller can never make the
//!   driver write to an arbitrary address.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use shared::ioctl;
use shared::memory::{MemError, SharedChunk};

/// How the driver reads one request's argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArgShape {
    /// Bytes the driver copies in and out (`sizeof` the real C struct, not the `_IOC` size
    /// field, which is 8 for pointer-declared requests: driver-abi §1.1).
    pub(crate) len: usize,
    /// Byte offset of a `u64 *` out-pointer field, if the struct has one.
    pub(crate) out_ptr: Option<usize>,
}

/// The argument shape of every request this backend sends (driver-abi §1.3–§1.4), or `None`
/// for a request it does not know.
pub(crate) fn arg_shape(request: u32) -> Option<ArgShape> {
    let plain = |len| Some(ArgShape { len, out_ptr: None });
    match request {
        ioctl::DEVICE_INFO => plain(size_of::<ioctl::DeviceInfoArg>()),
        ioctl::DEVICE_BASIC_INFO => plain(size_of::<ioctl::DeviceBasicInfo>()),
        ioctl::COMPATIBLE_VERSION => plain(size_of::<ioctl::CompatibleVersion>()),
        ioctl::NC_RESET => plain(size_of::<ioctl::DeviceReset>()),
        ioctl::NC_RESET_READY => plain(size_of::<ioctl::DeviceReady>()),
        ioctl::MEM_ALLOC_V2 => Some(ArgShape {
            len: size_of::<ioctl::MemAllocV2>(),
            out_ptr: Some(std::mem::offset_of!(ioctl::MemAllocV2, mem_handle)),
        }),
        ioctl::MEM_FREE => plain(size_of::<ioctl::MemFree>()),
        ioctl::MEM_GET_EXTENDED_INFO => plain(size_of::<ioctl::MemGetExtendedInfo>()),
        ioctl::DMA_QUEUE_INIT => plain(size_of::<ioctl::DmaQueueInit>()),
        ioctl::DMA_QUEUE_RELEASE => plain(size_of::<ioctl::DmaQueueRelease>()),
        ioctl::DMA_QUEUE_COPY_START => plain(size_of::<ioctl::DmaQueueCopyStart>()),
        ioctl::SEMAPHORE_INCREMENT
        | ioctl::SEMAPHORE_DECREMENT
        | ioctl::SEMAPHORE_READ
        | ioctl::SEMAPHORE_WRITE => plain(size_of::<ioctl::Semaphore>()),
        ioctl::EVENT_SET | ioctl::EVENT_GET => plain(size_of::<ioctl::Event>()),
        ioctl::NOTIFICATIONS_INIT_V2 => plain(size_of::<ioctl::NotificationsInitV2>()),
        ioctl::CRWL_WRITER_ENTER | ioctl::CRWL_WRITER_DOWNGRADE | ioctl::CRWL_READER_EXIT => {
            plain(size_of::<ioctl::Crwl>())
        }
        ioctl::RESOURCE_MMAP_INFO => plain(size_of::<ioctl::ResourceMmapInfo>()),
        _ => None,
    }
}

/// Interprets the value `ioctl(2)` returned.
///
/// The driver's return convention is inconsistent (driver-abi §1.1): a handler returns a
/// negative errno (user space sees `-1` and `errno`), a bare `-1` (user space sees `-1` and
/// `EPERM`), or a **positive** count of bytes `copy_to_user` failed to copy —
/// MEM_GET_EXTENDED_INFO even returns a positive `EINVAL` (22) for a bad handle. So any non-zero
/// value is a failure: `-1` reports `errno()` (called only then), and anything else, which
/// carries no errno, reports `EIO`.
///
/// # Errors
/// The errno as above.
pub(crate) fn ioctl_result(ret: libc::c_int, errno: impl FnOnce() -> Errno) -> Result<(), Errno> {
    match ret {
        0 => Ok(()),
        -1 => Err(errno()),
        _ => Err(Errno::EIO),
    }
}

/// Checks `arg` against the table: the request must be known, `arg` must be exactly its
/// struct's size, and its out-pointer field must be `out_ptr` (`None`: it has none).
fn check_arg(request: u32, arg: &[u8], out_ptr: Option<usize>) -> Result<(), Errno> {
    let shape = arg_shape(request).ok_or(Errno::ENOTTY)?;
    if shape.len != arg.len() || shape.out_ptr != out_ptr {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// An opened `/dev/neuronN` (`O_RDWR | O_CLOEXEC`: read-write attaches this process to the
/// device, which the memory, DMA and notification ioctls require; driver-abi §1.2). Closing it
/// (drop) makes the driver reset the DMA queues this process owned, release its NC locks and
/// free its memory (§1.2).
pub struct DeviceFile {
    file: File,
    path: PathBuf,
}

impl fmt::Debug for DeviceFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceFile")
            .field("path", &self.path)
            .field("fd", &self.file.as_raw_fd())
            .finish()
    }
}

impl DeviceFile {
    /// Opens `path` read-write and close-on-exec.
    ///
    /// # Errors
    /// The `open(2)` error: `ENOENT` without the driver, `EACCES` without permission, `EBUSY`
    /// when 16 processes are already attached, `EINVAL` for a device in an invalid state.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    /// The device node this file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Issues `request` with `arg` as its in-place argument (the driver reads and may write
    /// `arg.len()` bytes).
    ///
    /// # Errors
    /// `ENOTTY` for a request this backend does not send and `EINVAL` for an argument of the
    /// wrong size or one carrying a user pointer (both before the system call); otherwise the
    /// driver's errno, or `EIO` for a positive return (the driver's return convention is
    /// inconsistent, so any non-zero value is a failure; driver-abi §1.1).
    pub fn ioctl(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        check_arg(request, arg, None)?;
        self.raw_ioctl(request, arg)
    }

    /// Issues `request` whose argument has a `u64 *` out-pointer at byte `ptr_offset`: the
    /// pointer field is set to the address of a local `u64`, and the value the driver wrote
    /// there is returned. Whatever `arg` held in the pointer field is overwritten.
    ///
    /// # Errors
    /// As [`DeviceFile::ioctl`]; `EINVAL` also when the request has no out-pointer at
    /// `ptr_offset`.
    pub fn ioctl_out_u64(
        &self,
        request: u32,
        arg: &mut [u8],
        ptr_offset: usize,
    ) -> Result<u64, Errno> {
        check_arg(request, arg, Some(ptr_offset))?;
        let mut out: u64 = 0;
        // Exposing the provenance tells the compiler that foreign code (the kernel, through the
        // address in `arg`) may write `out` during the ioctl.
        let addr = (&raw mut out).expose_provenance() as u64;
        arg[ptr_offset..ptr_offset + 8].copy_from_slice(&addr.to_ne_bytes());
        self.raw_ioctl(request, arg)?;
        Ok(out)
    }

    /// Maps `len` bytes at mmap offset `offset` (the chunk's physical address from the driver,
    /// including the host-base bit for host memory; driver-abi §1.6) and places them at device
    /// `pa`. The driver refuses any `len` other than the whole chunk's size.
    ///
    /// # Errors
    /// [`MemError::Map`].
    pub fn map(
        &self,
        offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<SharedChunk, MemError> {
        SharedChunk::map_fd_at(&self.file, offset, pa, len, writable)
    }

    fn raw_ioctl(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        // glibc declares the request `c_ulong` (a widening of the u32 value), musl `c_int` (the
        // same 32 bits reinterpreted), so the driver sees the exact value either way.
        let request = request as nix::sys::ioctl::ioctl_num_type;
        // SAFETY: the fd is open for the lifetime of `self`. `check_arg` has confirmed that
        // `request` is one the driver handles by copying exactly `arg.len()` bytes from and to
        // the pointer we pass (the table in `arg_shape`, from the driver's struct sizes), so
        // the kernel stays inside the exclusively borrowed `arg`. A pointer field inside `arg`
        // exists only for requests sent through `ioctl_out_u64`, which sets it to a live local
        // `u64` itself.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), request, arg.as_mut_ptr()) };
        ioctl_result(ret, Errno::last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_success() {
        assert_eq!(
            ioctl_result(0, || unreachable!("errno read on success")),
            Ok(())
        );
    }

    #[test]
    fn minus_one_reports_errno() {
        assert_eq!(ioctl_result(-1, || Errno::EBUSY), Err(Errno::EBUSY));
    }

    #[test]
    fn a_positive_return_is_an_error_without_errno() {
        // MEM_GET_EXTENDED_INFO returns +22 for a bad handle; copy_to_user failures return the
        // uncopied byte count.
        let no_errno = || unreachable!("errno read for a positive return");
        assert_eq!(ioctl_result(22, no_errno), Err(Errno::EIO));
        assert_eq!(ioctl_result(1, no_errno), Err(Errno::EIO));
    }

    #[test]
    fn other_negative_values_are_errors() {
        let no_errno = || unreachable!("errno read for a value other than -1");
        assert_eq!(ioctl_result(-22, no_errno), Err(Errno::EIO));
    }

    #[test]
    fn unknown_requests_and_wrong_sizes_are_refused() {
        assert_eq!(check_arg(0x8008_4E99, &[0; 8], None), Err(Errno::ENOTTY));
        assert_eq!(
            check_arg(ioctl::SEMAPHORE_INCREMENT, &[0; 8], None),
            Err(Errno::EINVAL),
            "the _IOC size field says 8 but the driver copies 12 bytes"
        );
        assert_eq!(
            check_arg(ioctl::SEMAPHORE_INCREMENT, &[0; 12], None),
            Ok(())
        );
    }

    #[test]
    fn pointer_arguments_only_go_through_the_out_pointer_path() {
        assert_eq!(
            check_arg(ioctl::MEM_ALLOC_V2, &[0; 40], None),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            check_arg(ioctl::MEM_ALLOC_V2, &[0; 40], Some(24)),
            Err(Errno::EINVAL)
        );
        assert_eq!(check_arg(ioctl::MEM_ALLOC_V2, &[0; 40], Some(32)), Ok(()));
        assert_eq!(
            check_arg(ioctl::MEM_FREE, &[0; 8], Some(0)),
            Err(Errno::EINVAL)
        );
    }

    #[test]
    fn every_shape_matches_the_driver_struct_sizes() {
        // driver-abi §1.3 "argument (bytes)" column.
        let table = [
            (ioctl::DEVICE_INFO, 80),
            (ioctl::DEVICE_BASIC_INFO, 8),
            (ioctl::COMPATIBLE_VERSION, 8),
            (ioctl::NC_RESET, 8),
            (ioctl::NC_RESET_READY, 8),
            (ioctl::MEM_ALLOC_V2, 40),
            (ioctl::MEM_FREE, 8),
            (ioctl::MEM_GET_EXTENDED_INFO, 48),
            (ioctl::DMA_QUEUE_INIT, 48),
            (ioctl::DMA_QUEUE_RELEASE, 8),
            (ioctl::DMA_QUEUE_COPY_START, 16),
            (ioctl::SEMAPHORE_INCREMENT, 12),
            (ioctl::SEMAPHORE_DECREMENT, 12),
            (ioctl::SEMAPHORE_READ, 12),
            (ioctl::SEMAPHORE_WRITE, 12),
            (ioctl::EVENT_SET, 12),
            (ioctl::EVENT_GET, 12),
            (ioctl::NOTIFICATIONS_INIT_V2, 48),
            (ioctl::CRWL_WRITER_ENTER, 36),
            (ioctl::CRWL_WRITER_DOWNGRADE, 36),
            (ioctl::CRWL_READER_EXIT, 36),
            (ioctl::RESOURCE_MMAP_INFO, 32),
        ];
        for (request, len) in table {
            assert_eq!(
                arg_shape(request).map(|s| s.len),
                Some(len),
                "{request:#010x}"
            );
        }
    }
}
