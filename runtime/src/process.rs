//! This process's pid, cached; and what it removes when it exits.
//!
//! Every device call and every tensor access checks that it runs in the process that
//! initialised the runtime (a forked child must call `nrt_init` itself), so reading the pid
//! must cost a load, not a `getpid(2)` system call per check (five per execution). The cache
//! is cleared in the child of every `fork(2)` by a `pthread_atfork` child handler registered
//! before the first pid is cached, so a forked child always reads its own pid. (A child made
//! by a raw `clone(2)` that skips the handlers and then calls the runtime is not detected;
//! libc's `fork`, `posix_spawn` and `std::process::Command` all run them or exec at once.)

use std::os::fd::RawFd;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// The cached pid; 0 = not cached (no process has pid 0).
static PID: AtomicU32 = AtomicU32::new(0);

/// The child handler is registered: only then may a pid be cached.
static REGISTERED: AtomicBool = AtomicBool::new(false);

static REGISTER: Once = Once::new();

/// The descriptors of the [`ForkPrivate`] values alive in this process (-1: a free slot),
/// closed in every forked child.
static CLOSE_IN_CHILD: [AtomicI32; 16] = [const { AtomicI32::new(-1) }; 16];

/// The `pthread_atfork` child handler: atomic stores and `close(2)`, async-signal-safe.
extern "C" fn forked_child() {
    PID.store(0, Ordering::Relaxed);
    for slot in &CLOSE_IN_CHILD {
        let fd = slot.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: `fd` is the child's copy of a descriptor a `ForkPrivate` of the parent
            // owns; the child's copy of that `ForkPrivate` never closes or uses it (its drop
            // checks the process), so nothing else in the child refers to this number.
            unsafe { libc::close(fd) };
        }
    }
}

/// A value holding a descriptor that this process keeps and its forked children do not: the
/// descriptor is closed in each child as it is forked, and the child's copy of the value
/// neither uses it nor closes it again (dropped in another process, it is forgotten).
///
/// For what an open file description holds on behalf of its process: a datastore's `flock`,
/// which a child made by `fork` without `exec` would otherwise hold on, so that the file of a
/// parent killed since read as live for as long as the child ran. (A fork racing this value's
/// drop in another thread may still leave the child one copy.)
#[derive(Debug)]
pub struct ForkPrivate<T> {
    value: Option<T>,
    owner: u32,
    slot: usize,
}

impl<T> ForkPrivate<T> {
    /// `value`, whose descriptor is `fd`, closed in forked children from now on.
    ///
    /// # Errors
    /// `value` back when every slot is taken (more than 16 such values alive at once).
    pub fn new(value: T, fd: RawFd) -> Result<Self, T> {
        let owner = id(); // registers the fork handler first
        let slot = CLOSE_IN_CHILD.iter().position(|s| {
            s.compare_exchange(-1, fd, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        match slot {
            Some(slot) => Ok(Self {
                value: Some(value),
                owner,
                slot,
            }),
            None => Err(value),
        }
    }
}

impl<T> Drop for ForkPrivate<T> {
    fn drop(&mut self) {
        let value = self.value.take();
        if id() == self.owner {
            // Out of the table before the descriptor closes, so a fork in between never
            // closes a number that means something else by then.
            CLOSE_IN_CHILD[self.slot].store(-1, Ordering::Relaxed);
            drop(value);
        } else {
            std::mem::forget(value);
        }
    }
}

/// This process's pid (`getpid(2)`), from the cache when it holds it.
pub fn id() -> u32 {
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    REGISTER.call_once(|| {
        // SAFETY: `pthread_atfork` only records the handler pointers; `forked_child` is an
        // `extern "C" fn` that lives as long as the program and is async-signal-safe (it
        // stores one atomic), as a handler run in a forked child must be.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
        if rc == 0 {
            REGISTERED.store(true, Ordering::Relaxed);
        } else {
            tracing::warn!("pthread_atfork failed ({rc}); the pid is read at every check");
        }
    });
    let pid = std::process::id();
    if REGISTERED.load(Ordering::Relaxed) {
        PID.store(pid, Ordering::Relaxed);
    }
    pid
}

/// Has `hook` run when this process exits through `exit(3)` (returning from `main`
/// included; not on a signal or `_exit`); whether it was registered.
pub fn on_exit(hook: extern "C" fn()) -> bool {
    // SAFETY: `atexit` only records the pointer; `hook` is an `extern "C" fn`, which lives as
    // long as the program.
    unsafe { libc::atexit(hook) == 0 }
}

/// What this process leaves behind if it exits before cleaning up after itself (a C program
/// returning from `main` without `nrt_close`), undone at `exit` by [`undo_at_exit`]'s hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leftover {
    /// Its datastore file, which at exit is marked closed and left to linger
    /// ([`crate::datastore::close_file`]).
    Datastore(std::path::PathBuf),
    /// A child it started (a private simdev, which `PR_SET_PDEATHSIG` kills but which removes
    /// nothing then) and the directory the child works in: the child is killed and reaped,
    /// the directory removed.
    Child {
        /// The child's pid.
        pid: u32,
        /// Its directory.
        dir: std::path::PathBuf,
    },
}

impl Leftover {
    /// Undoes it (best effort: nothing is reported at exit).
    fn undo(&self) {
        match self {
            Self::Datastore(path) => crate::datastore::close_file(path),
            Self::Child { pid, dir } => {
                if let Ok(pid) = i32::try_from(*pid) {
                    let pid = nix::unistd::Pid::from_raw(pid);
                    // Only a child still there (not already reaped by the kernel, as it is
                    // when the program ignores SIGCHLD: its pid may name another process).
                    let flags = nix::sys::wait::WaitPidFlag::WNOHANG;
                    if let Ok(nix::sys::wait::WaitStatus::StillAlive) =
                        nix::sys::wait::waitpid(pid, Some(flags))
                    {
                        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                        let _ = nix::sys::wait::waitpid(pid, None);
                    }
                }
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// What the exit hook undoes: (the process that left it, what).
static LEFTOVERS: std::sync::Mutex<Vec<(u32, Leftover)>> = std::sync::Mutex::new(Vec::new());

/// Registers [`undo_leftovers_at_exit`] once.
static LEFTOVERS_HOOK: Once = Once::new();

/// Has `leftover` undone at `exit`, should this process exit before it cleans up after itself;
/// [`forget_at_exit`] takes it back once it has.
pub fn undo_at_exit(leftover: Leftover) {
    leftovers().push((id(), leftover));
    LEFTOVERS_HOOK.call_once(|| {
        if !on_exit(undo_leftovers_at_exit) {
            tracing::warn!(
                "atexit failed: an exit without nrt_close leaves the datastore file and a \
                 private simdev's directory"
            );
        }
    });
}

/// `leftover` is cleaned up (or handed on): the exit hook no longer undoes it.
pub fn forget_at_exit(leftover: &Leftover) {
    let me = id();
    leftovers().retain(|(pid, l)| *pid != me || l != leftover);
}

fn leftovers() -> std::sync::MutexGuard<'static, Vec<(u32, Leftover)>> {
    LEFTOVERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The exit hook of [`undo_at_exit`]: undoes what this process left. Never unwinds into
/// `exit`; does nothing while another thread holds the list (it is starting or stopping
/// something), and leaves what another process left alone (the parent of a forked child).
extern "C" fn undo_leftovers_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let mut list = match LEFTOVERS.try_lock() {
            Ok(list) => list,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let me = id();
        for (_, leftover) in list.extract_if(.., |(pid, _)| *pid == me) {
            leftover.undo();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_pid_is_this_process_and_a_forked_child_reads_its_own() {
        assert_eq!(id(), std::process::id());
        assert_eq!(id(), std::process::id(), "from the cache");
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only calls `id()` (an atomic load, then at most getpid and an
        // atomic store: the Once already ran in the parent), writes 4 bytes to a pipe and
        // exits with `_exit`; it touches no lock another thread of the test binary may hold.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let pid = id();
                let _ = nix::unistd::write(&write, &pid.to_ne_bytes());
                // SAFETY: `_exit` ends the child without running the parent's destructors.
                unsafe { libc::_exit(0) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(write);
                let mut buf = [0u8; 4];
                let n = nix::unistd::read(&read, &mut buf).unwrap();
                nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(n, 4);
                let seen = u32::from_ne_bytes(buf);
                assert_eq!(
                    i32::try_from(seen).unwrap(),
                    child.as_raw(),
                    "the child read its own pid, not the parent's cached one"
                );
                assert_eq!(id(), std::process::id(), "the parent's cache is intact");
            }
        }
    }
}
