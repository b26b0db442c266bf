//! The per-vNC worker threads (`kmgr_xu_worker_do_work`, seed 004 §4).
//!
//! One joinable thread per vNC. Each has its own epoll instance over its stop eventfd
//! (`eventfd(0, 0)`, a latch, registered `EPOLLIN | EPOLLEXCLUSIVE`) and the `has_work_efd` of
//! each XU it owns (`EPOLLIN`, level-triggered). Events carry a typed [`Token`]: `Stop` exits the
//! thread, `Step(i)` runs [`Xu::step`] on owned XU `i`. Because `has_work_efd` is an
//! `EFD_SEMAPHORE` eventfd whose count is consumed one per completed request, epoll keeps waking
//! the worker exactly once per queued request — and again while a request is in flight.
//! [`XuWorkers::destroy`] writes every stop fd first, then joins each thread and closes its fd.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use shared::NrtStatus;

use super::unit::{CompletionEngine, Xu};

/// What an epoll event means to a worker (the seed's 16-byte `{tag, xu}` record, typed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// The worker's stop eventfd (tag 0): exit the thread.
    Stop,
    /// Owned XU `i` has work (tag 1): step it.
    Step(usize),
}

impl From<Token> for u64 {
    fn from(t: Token) -> u64 {
        match t {
            Token::Stop => 0,
            Token::Step(i) => i as u64 + 1,
        }
    }
}

impl From<u64> for Token {
    fn from(v: u64) -> Token {
        match v {
            0 => Token::Stop,
            n => Token::Step(usize::try_from(n - 1).unwrap_or(usize::MAX)),
        }
    }
}

/// Events one `epoll_wait` returns at most (the seed waits for 9).
const MAX_EVENTS: usize = 9;

static WORKER_SET_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
struct Worker {
    stop_efd: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

/// The running workers, one per vNC.
#[derive(Debug)]
pub struct XuWorkers {
    workers: Vec<Worker>,
    name_prefix: String,
}

fn worker_loop<E: CompletionEngine>(epoll: Epoll, owned: Vec<Arc<Xu<E>>>) {
    let mut events = [EpollEvent::empty(); MAX_EVENTS];
    loop {
        let n = match epoll.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            // EINTR (a signal) and other transient failures: wait again, as the seed does.
            Err(Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(errno = %e, "Epoll returned invalid status");
                continue;
            }
        };
        for ev in &events[..n] {
            match Token::from(ev.data()) {
                Token::Stop => return,
                Token::Step(i) => match owned.get(i) {
                    Some(xu) => xu.step(),
                    None => {
                        tracing::error!(index = i, "epoll event for an XU this worker does not own")
                    }
                },
            }
        }
    }
}

impl XuWorkers {
    /// `kmgr_xu_workers_init`: one joinable worker per XU in `xus`.
    ///
    /// # Errors
    /// `NRT_FAILURE` when an eventfd, epoll instance or thread cannot be created (the workers
    /// already started are stopped).
    pub fn start<E: CompletionEngine>(xus: &[Arc<Xu<E>>]) -> Result<Self, NrtStatus> {
        let set = WORKER_SET_ID.fetch_add(1, Ordering::Relaxed);
        let mut this = Self {
            workers: Vec::new(),
            name_prefix: format!("xuw{set}-"),
        };
        for xu in xus {
            match this.spawn_one(xu.clone()) {
                Ok(w) => this.workers.push(w),
                Err(e) => {
                    tracing::error!(vnc = xu.vnc(), error = %e, "failed to start the XU worker");
                    this.destroy();
                    return Err(NrtStatus::Failure);
                }
            }
        }
        Ok(this)
    }

    fn spawn_one<E: CompletionEngine>(&self, xu: Arc<Xu<E>>) -> std::io::Result<Worker> {
        let stop_efd = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?);
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            stop_efd.as_fd(),
            EpollEvent::new(
                EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE,
                Token::Stop.into(),
            ),
        )?;
        epoll.add(
            xu.has_work_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, Token::Step(0).into()),
        )?;
        let name = format!("{}{}", self.name_prefix, xu.vnc());
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || worker_loop(epoll, vec![xu]))?;
        Ok(Worker {
            stop_efd,
            thread: Some(thread),
        })
    }

    /// The thread-name prefix of this set's workers (`<prefix><vnc>`), unique per set.
    pub fn thread_name_prefix(&self) -> &str {
        &self.name_prefix
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there are no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// `kmgr_xu_workers_destroy`: writes every stop fd, then joins every thread and closes its
    /// stop fd.
    ///
    /// # Panics
    /// If a stop fd cannot be written (the seed aborts: the worker could never be joined).
    pub fn destroy(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for (i, w) in self.workers.iter().enumerate() {
            if let Err(e) = w.stop_efd.write(1) {
                tracing::error!(worker = i, errno = %e, "Failed to post stop to XU worker");
                panic!("failed to post stop to XU worker {i}: {e}");
            }
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take()
                && t.join().is_err()
            {
                tracing::error!("an XU worker panicked");
            }
        }
        self.workers.clear();
    }
}

impl Drop for XuWorkers {
    fn drop(&mut self) {
        if !self.workers.is_empty() {
            self.stop_all();
        }
    }
}
