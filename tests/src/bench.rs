//! Helpers shared by the benchmarks: a counting global allocator, percentiles, and starting a
//! private simdev by re-executing the benchmark binary itself as simdev.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use runtime::backend::sim::{SimDevice, SimdevCommand};

/// A global allocator that counts allocations (all threads) and delegates to the system's.
/// Install it with `#[global_allocator] static A: CountingAlloc = CountingAlloc::new();`.
#[derive(Debug)]
pub struct CountingAlloc {
    allocations: AtomicU64,
}

impl CountingAlloc {
    /// A counter at zero.
    pub const fn new() -> Self {
        Self {
            allocations: AtomicU64::new(0),
        }
    }

    /// Allocations (and reallocations) so far.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }
}

impl Default for CountingAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every call is delegated unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above, for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above, for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Pins this thread — and every thread and process it starts afterwards, which inherit the mask —
/// to one CPU: the first CPU of the mask it was started with (CPU 0 unless started under, say,
/// `taskset -c 1`), so a floor and the code beside it hand off between threads the same way (on
/// a small VM, a wake-up across CPUs costs an order of magnitude more than one on the same CPU,
/// and the scheduler's choice between the two otherwise decides the ratio).
///
/// # Panics
/// If the affinity cannot be read or set.
pub fn pin_to_one_cpu() {
    let me = nix::unistd::Pid::from_raw(0);
    let allowed = nix::sched::sched_getaffinity(me).expect("sched_getaffinity");
    let first = (0..nix::sched::CpuSet::count())
        .find(|&c| allowed.is_set(c).unwrap_or(false))
        .expect("a thread runs on at least one CPU");
    let mut set = nix::sched::CpuSet::new();
    set.set(first).expect("a CPU of the mask");
    nix::sched::sched_setaffinity(me, &set).expect("sched_setaffinity");
}

/// The `per_mille`/1000 quantile of sorted samples (nearest rank).
///
/// # Panics
/// On an empty slice.
pub fn percentile(sorted: &[Duration], per_mille: usize) -> Duration {
    // Nearest rank, as `nrt bench` reports: the smallest sample with at least `per_mille` of
    // them at or below it.
    sorted[(sorted.len() * per_mille).div_ceil(1000).max(1) - 1]
}

/// CPU time a process has spent so far, all its threads, as the kernel accounts it
/// (`/proc/<pid>/stat`'s `utime` and `stime`: sampled at the scheduler tick, so meaningful
/// summed over runs of many ticks, not per call).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    /// In user space.
    pub user: Duration,
    /// In the kernel (system calls, the wake-ups and context switches they cause).
    pub system: Duration,
}

impl CpuTime {
    /// `pid`'s CPU time so far (`None` for this process); `None` where `/proc` cannot say.
    pub fn of(pid: Option<u32>) -> Option<Self> {
        let path = pid.map_or("/proc/self/stat".into(), |p| format!("/proc/{p}/stat"));
        let stat = std::fs::read_to_string(path).ok()?;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
        Self::from_stat(&stat, u64::try_from(hz).ok()?)
    }

    /// Parses a `/proc/<pid>/stat` line whose clock ticks are `1/hz` s.
    fn from_stat(stat: &str, hz: u64) -> Option<Self> {
        // The fields after the command name, which is in parentheses and may itself hold
        // spaces and parentheses: state is field 3, utime 14 and stime 15.
        let mut after = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
        let user: u64 = after.nth(11)?.parse().ok()?;
        let system: u64 = after.next()?.parse().ok()?;
        let hz = (hz > 0).then_some(hz)?;
        let ticks = |t: u64| Duration::from_nanos(t.saturating_mul(1_000_000_000) / hz);
        Some(Self {
            user: ticks(user),
            system: ticks(system),
        })
    }

    /// The time spent between `earlier` and `self`.
    #[must_use]
    pub fn since(self, earlier: Self) -> Self {
        Self {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

impl std::ops::Add for CpuTime {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }
}

/// Microseconds of a duration.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// When the benchmark binary was started as `<bench> simdev ...`, runs simdev and exits;
/// otherwise returns. Call it first in `main`.
pub fn run_as_simdev_if_asked() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "simdev") {
        let code = simdev::cli::main_with_args(args.into_iter().skip(1));
        std::process::exit(if code == std::process::ExitCode::SUCCESS {
            0
        } else {
            1
        });
    }
}

/// Starts a private simdev (this binary re-executed as simdev) with `extra_args` and connects.
///
/// # Panics
/// If simdev does not start.
pub fn private_simdev(extra_args: &[&str]) -> SimDevice {
    let cmd = SimdevCommand {
        program: std::env::current_exe().expect("current_exe"),
        args_prefix: vec!["simdev".into()],
        extra_args: extra_args.iter().map(Into::into).collect(),
    };
    SimDevice::spawn_private(&cmd).expect("simdev starts")
}

/// The identity model of `bytes` bytes loaded on logical core 0, with device tensors `in` and
/// `out` and the sets that name them (`input`, `output`): the execution every round-trip
/// figure and allocation count is taken on.
#[derive(Debug)]
pub struct IdentityIo {
    /// The loaded model.
    pub model: runtime::ModelHandle,
    /// Its input tensor.
    pub input: runtime::Tensor,
    /// Its output tensor.
    pub output: runtime::Tensor,
    /// `{input: in}`.
    pub inputs: runtime::TensorSet,
    /// `{output: out}`.
    pub outputs: runtime::TensorSet,
}

impl IdentityIo {
    /// Loads the model and allocates its tensors on `rt`.
    ///
    /// # Panics
    /// When the runtime refuses any of it (a benchmark or test setup failure).
    pub fn load(rt: &runtime::Runtime, bytes: u32) -> Self {
        let container = runtime::builder::identity(bytes)
            .to_container(shared::model::Target::Simdev)
            .unwrap();
        let model = rt.load(&container, 0).unwrap();
        let on_core_0 = runtime::Placement::Device { vnc: 0 };
        let input = rt
            .tensor_allocate(on_core_0, u64::from(bytes), "in")
            .unwrap();
        let output = rt
            .tensor_allocate(on_core_0, u64::from(bytes), "out")
            .unwrap();
        let (mut inputs, mut outputs) = (runtime::TensorSet::new(), runtime::TensorSet::new());
        inputs.add("input", &input);
        outputs.add("output", &output);
        Self {
            model,
            input,
            output,
            inputs,
            outputs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_reads_utime_and_stime_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 3 0";
        let t = CpuTime::from_stat(stat, 100).expect("a well-formed line");
        assert_eq!(t.user, Duration::from_millis(2_500));
        assert_eq!(t.system, Duration::from_millis(370));
        assert_eq!(
            CpuTime::from_stat("4242 (x) S 1 2", 100),
            None,
            "too few fields"
        );
        assert_eq!(CpuTime::from_stat(stat, 0), None, "no tick rate");
        let later = CpuTime {
            user: Duration::from_secs(3),
            system: Duration::from_millis(300),
        };
        let spent = later.since(t);
        assert_eq!(spent.user, Duration::from_millis(500));
        assert_eq!(spent.system, Duration::ZERO, "saturates, never wraps");
    }

    #[test]
    fn cpu_time_of_this_process_grows_while_it_computes() {
        let start = CpuTime::of(None).expect("/proc/self/stat");
        let mut x = 0u64;
        // Tick-sampled: spin until the kernel has charged at least one tick (a bound far
        // beyond any tick, only so that a broken reader fails instead of hanging).
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while CpuTime::of(None).expect("/proc/self/stat").since(start) == CpuTime::default() {
            assert!(
                std::time::Instant::now() < give_up,
                "no CPU time charged in 60 s"
            );
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
        }
        assert!(CpuTime::of(Some(std::process::id())).is_some());
    }
}
