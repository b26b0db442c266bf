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

/// The `per_mille`/1000 quantile of sorted samples (nearest rank, rounding down).
///
/// # Panics
/// On an empty slice.
pub fn percentile(sorted: &[Duration], per_mille: usize) -> Duration {
    sorted[(sorted.len() - 1) * per_mille / 1000]
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
