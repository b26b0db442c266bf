//! Issue 11 item 1: a child forked after `nrt_init` cannot use, and cannot disturb, its parent's
//! runtime; `nrt_init` in the child gives it a runtime of its own.
//!
//! **Why a binary of its own (`harness = false`).** libtest runs tests on worker threads and
//! keeps other threads alive; forking from one of them would leave the child holding whatever
//! locks those threads held. Here `main` forks from the main thread, once, and the only other
//! threads at the fork are the runtime's own (XU workers, the completion engine, the stdout
//! drain of the private simdev): exactly the situation of a user who forks after `nrt_init`,
//! which is what is under test. So the child does not limit itself to async-signal-safe calls:
//! it calls the code under test right after the fork, as such a user would. It relies on glibc's
//! fork making malloc usable in the child (glibc resets its arena locks), and on the code under
//! test taking no lock a runtime thread could hold at the fork before it has checked the pid.
//! The child reports through its exit status and stderr and leaves with `_exit`, running no
//! destructor or atexit handler; the parent kills it if it has not exited within
//! [`CHILD_DEADLINE`] (a hang is a failure, not a stuck test).
//!
//! Layout: simdev with 4 NCs. The parent's facade runtime holds NC 0
//! (`NEURON_RT_VISIBLE_CORES=0`) and a separate `Runtime` object of the parent holds NC 2. The
//! child tries every facade call and every `Runtime` method on the inherited runtimes (each
//! must answer NRT_UNINITIALIZED naming the parent's pid, promptly), drops the inherited
//! tensors, closes the inherited facade and `Runtime`, then `nrt_init`s with
//! `NEURON_RT_VISIBLE_CORES=1` on the same simdev and runs a model there. The parent then
//! checks that simdev's memory, chunk, client and NC counts are what they were before the
//! fork, that its tensors still hold their bytes, and that both its runtimes keep executing
//! with correct outputs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};
use runtime::backend::sim::SimDevice;
use runtime::backend::{BackendKind, OpenOptions};
use runtime::builder::identity;
use runtime::config::RuntimeConfig;
use runtime::{ModelHandle, NrtResult, Placement, Runtime, Tensor, TensorSet, nrt};
use shared::NrtStatus;
use shared::model::Target;
use tests::{connect, start_simdev};

/// Bytes of the identity model's tensors.
const BYTES: u32 = 4096;
/// How long the child may take for everything it does.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);
/// Executions the parent runs on each runtime after the child exited.
const AFTER: u8 = 20;

/// One model on one runtime with its I/O tensors.
struct Rig {
    model: ModelHandle,
    input: Tensor,
    output: Tensor,
    ins: TensorSet,
    outs: TensorSet,
}

impl Rig {
    fn new(
        load: impl Fn(&[u8]) -> NrtResult<ModelHandle>,
        alloc: impl Fn(&str) -> NrtResult<Tensor>,
    ) -> NrtResult<Self> {
        let container = identity(BYTES).to_container(Target::Simdev).unwrap();
        let model = load(&container)?;
        let input = alloc("input")?;
        let output = alloc("output")?;
        let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
        ins.add("input", &input);
        outs.add("output", &output);
        Ok(Self {
            model,
            input,
            output,
            ins,
            outs,
        })
    }

    /// Writes a pattern derived from `seed`, executes with `exec`, checks the output.
    fn run(
        &self,
        seed: u8,
        exec: impl Fn(ModelHandle, &TensorSet, &TensorSet) -> NrtResult<()>,
    ) -> Result<(), String> {
        let pattern: Vec<u8> = (0..BYTES)
            .map(|i| (i.to_le_bytes()[0] ^ seed).wrapping_mul(31))
            .collect();
        self.input.write(&pattern, 0).map_err(|e| e.to_string())?;
        self.output
            .write(&vec![!seed; BYTES as usize], 0)
            .map_err(|e| e.to_string())?;
        exec(self.model, &self.ins, &self.outs).map_err(|e| format!("execute: {e}"))?;
        let mut out = vec![0u8; BYTES as usize];
        self.output.read(&mut out, 0).map_err(|e| e.to_string())?;
        if out != pattern {
            return Err(format!("seed {seed}: the output is not the input"));
        }
        Ok(())
    }
}

/// Checks that `r` is the fork refusal naming `parent`.
fn refused<T: std::fmt::Debug>(what: &str, parent: u32, r: NrtResult<T>) -> Result<(), String> {
    match r {
        Ok(v) => Err(format!("{what} succeeded in the forked child: {v:?}")),
        Err(e)
            if e.status == NrtStatus::Uninitialized
                && e.message
                    .contains(&format!("the runtime was initialised in process {parent}"))
                && e.message.contains("call nrt_init in this process") =>
        {
            Ok(())
        }
        Err(e) => Err(format!("{what}: not the fork refusal: {e}")),
    }
}

/// Everything the forked child does. Takes the parent's objects by value: what it drops is
/// dropped in the child only.
fn child(
    parent: u32,
    opts: &OpenOptions,
    facade: Rig,
    rt: Arc<Runtime>,
    own: Runtime,
    own_rig: Rig,
) -> Result<(), String> {
    let started = Instant::now();
    let dev = Placement::Device { vnc: 0 };
    let container = identity(BYTES).to_container(Target::Simdev).unwrap();
    // The facade.
    refused(
        "nrt::tensor_allocate(device)",
        parent,
        nrt::tensor_allocate(dev, 64, "x"),
    )?;
    refused(
        "nrt::tensor_allocate(host)",
        parent,
        nrt::tensor_allocate(Placement::Host, 64, "x"),
    )?;
    refused("nrt::load", parent, nrt::load(&container, 0))?;
    refused(
        "nrt::execute",
        parent,
        nrt::execute(facade.model, &facade.ins, &facade.outs),
    )?;
    refused(
        "nrt::execute_repeat",
        parent,
        nrt::execute_repeat(facade.model, &facade.ins, &facade.outs, 1),
    )?;
    refused("nrt::unload", parent, nrt::unload(facade.model))?;
    refused("nrt::current", parent, nrt::current())?;
    // The same runtime as an object.
    refused(
        "Runtime::tensor_allocate",
        parent,
        rt.tensor_allocate(dev, 64, "x"),
    )?;
    refused("Runtime::load", parent, rt.load(&container, 0))?;
    refused("Runtime::model", parent, rt.model(facade.model))?;
    refused(
        "Runtime::execute",
        parent,
        rt.execute(facade.model, &facade.ins, &facade.outs),
    )?;
    refused(
        "Runtime::execute_schedule",
        parent,
        rt.execute_schedule(facade.model, &facade.ins, &facade.outs),
    )?;
    refused("Runtime::unload", parent, rt.unload(facade.model))?;
    // The parent's own Runtime object, then closing it here.
    refused(
        "Runtime::execute (second runtime)",
        parent,
        own.execute(own_rig.model, &own_rig.ins, &own_rig.outs),
    )?;
    // The parent's device tensors are mapped shared: reading or writing them is refused.
    refused(
        "Tensor::write (inherited)",
        parent,
        facade.input.write(&[0xEE; 16], 0),
    )?;
    let mut buf = [0u8; 16];
    refused(
        "Tensor::read (inherited)",
        parent,
        own_rig.output.read(&mut buf, 0),
    )?;
    // Dropping inherited tensors must not free the parent's memory.
    drop(facade);
    drop(own_rig);
    own.close();
    drop(rt);
    // nrt_close of the inherited runtime changes nothing; the gate still answers.
    nrt::close();
    refused(
        "nrt::load after nrt::close",
        parent,
        nrt::load(&container, 0),
    )?;
    if started.elapsed() > Duration::from_secs(5) {
        return Err(format!("the refusals took {:?}", started.elapsed()));
    }
    // A runtime of the child's own, on a core the parent does not hold.
    // SAFETY: a forked child has one thread (this one): nothing reads the environment
    // concurrently.
    unsafe { std::env::set_var("NEURON_RT_VISIBLE_CORES", "1") };
    nrt::init_with(opts).map_err(|e| format!("nrt::init in the child: {e}"))?;
    let mine = nrt::current().map_err(|e| e.to_string())?;
    if mine.pid() != std::process::id() || mine.vnc_ncs(0) != Some(&[1][..]) {
        return Err(format!(
            "the child's runtime: pid {} (child {}), NCs {:?}",
            mine.pid(),
            std::process::id(),
            mine.vnc_ncs(0)
        ));
    }
    drop(mine);
    let rig = Rig::new(
        |c| nrt::load(c, 0),
        |n| nrt::tensor_allocate(dev, u64::from(BYTES), n),
    )
    .map_err(|e| format!("the child's model: {e}"))?;
    for seed in 0..5 {
        rig.run(seed, nrt::execute)?;
    }
    drop(rig);
    nrt::close();
    Ok(())
}

fn wait_child(pid: nix::unistd::Pid) -> WaitStatus {
    let deadline = Instant::now() + CHILD_DEADLINE;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)).expect("waitpid") {
            WaitStatus::StillAlive if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            WaitStatus::StillAlive => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(pid, None);
                panic!("the forked child did not finish within {CHILD_DEADLINE:?} (a hang)");
            }
            s => return s,
        }
    }
}

fn fork_after_init_leaves_the_parent_alone() {
    // SAFETY: no other thread exists yet (the simdev and the runtime start theirs later).
    unsafe { std::env::set_var("NEURON_RT_VISIBLE_CORES", "0") };
    let sim = start_simdev(&["--ncs", "4", "--hbm", "64M"]);
    let opts = OpenOptions {
        kind: BackendKind::Sim,
        simdev_socket: Some(sim.socket().to_owned()),
        ..OpenOptions::default()
    };
    nrt::init_with(&opts).unwrap();
    let dev = Placement::Device { vnc: 0 };
    let facade = Rig::new(
        |c| nrt::load(c, 0),
        |n| nrt::tensor_allocate(dev, u64::from(BYTES), n),
    )
    .unwrap();
    facade.run(1, nrt::execute).unwrap();
    let rt = nrt::current().unwrap();
    assert_eq!(rt.vnc_ncs(0), Some(&[0][..]));
    // The second runtime's datastore in a directory of its own: the child must neither write
    // nor remove it.
    let datastore_dir = tempfile::tempdir().unwrap();
    let own = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            visible_cores: Some((2, 1)),
            datastore_dir: Some(datastore_dir.path().to_path_buf()),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let own_rig = Rig::new(
        |c| own.load(c, 0),
        |n| own.tensor_allocate(dev, u64::from(BYTES), n),
    )
    .unwrap();
    own_rig.run(2, |m, i, o| own.execute(m, i, o)).unwrap();
    // Leave known bytes in the parent's input tensor: the child must not change them.
    let marker: Vec<u8> = (0..BYTES).map(|i| i.to_le_bytes()[1]).collect();
    facade.input.write(&marker, 0).unwrap();

    let observer = SimDevice::connect(sim.socket()).unwrap();
    // The runtimes' frees are not waited for: simdev has handled them once these return.
    rt.device().flush().unwrap();
    own.device().flush().unwrap();
    let before = observer.device_stats().unwrap();
    let parent = std::process::id();

    // SAFETY: see the module docs: the child runs the code under test and leaves with _exit.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                child(parent, &opts, facade, rt, own, own_rig)
            })) {
                Ok(Ok(())) => 0,
                Ok(Err(msg)) => {
                    eprintln!("forked child: {msg}");
                    1
                }
                Err(_) => 2,
            };
            // SAFETY: _exit ends the child without running destructors or atexit handlers,
            // which belong to the parent's state.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            let status = wait_child(child);
            assert!(
                matches!(status, WaitStatus::Exited(_, 0)),
                "the forked child failed: {status:?} (its message is above)"
            );
        }
    }

    // The device looks as it did before the fork (the child's own runtime closed; give simdev
    // a moment to finish reclaiming its connection).
    let same = tests::wait_for(Duration::from_secs(5), || {
        let now = observer.device_stats().unwrap();
        (now.memory_in_use == before.memory_in_use
            && now.chunks == before.chunks
            && now.clients == before.clients
            && now.claimed_ncs == before.claimed_ncs
            && now.dma_queues == before.dma_queues)
            .then_some(())
    });
    let now = observer.device_stats().unwrap();
    assert!(
        same.is_some(),
        "device stats before the fork {before:?}, after the child {now:?}"
    );
    let mut bytes = vec![0u8; BYTES as usize];
    facade.input.read(&mut bytes, 0).unwrap();
    assert_eq!(bytes, marker, "the parent's input tensor changed");
    for seed in 0..AFTER {
        facade
            .run(seed, nrt::execute)
            .unwrap_or_else(|e| panic!("the parent's facade runtime after the child: {e}"));
        own_rig
            .run(seed, |m, i, o| own.execute(m, i, o))
            .unwrap_or_else(|e| panic!("the parent's second runtime after the child: {e}"));
    }
    let m = rt.metrics().snapshot(0).unwrap();
    assert_eq!(
        m.executions_with(NrtStatus::Success),
        1 + u64::from(AFTER),
        "NC 0 ran only the parent's executions"
    );
    let published = runtime::datastore::scan(datastore_dir.path());
    assert_eq!(
        published.len(),
        1,
        "the parent's datastore file survived the child"
    );
    assert_eq!(published[0].pid, std::process::id());
    assert_eq!(
        published[0].liveness,
        runtime::datastore::snapshot::Liveness::Live
    );
    assert_eq!(
        published[0].cores[0].executions.total(),
        1 + u64::from(AFTER),
        "only the parent's executions are in its datastore"
    );
    drop(facade);
    drop(own_rig);
    own.close();
    let closed = runtime::datastore::scan(datastore_dir.path());
    assert_eq!(
        closed
            .iter()
            .map(|s| (s.pid, s.liveness))
            .collect::<Vec<_>>(),
        [(
            std::process::id(),
            runtime::datastore::snapshot::Liveness::Closed
        )],
        "close marked the parent's file closed (it lingers for monitors)"
    );
    assert_eq!(
        closed[0].cores[0].executions.total(),
        1 + u64::from(AFTER),
        "with its final counts"
    );
    drop(rt);
    nrt::close();
    assert_eq!(observer.device_stats().unwrap().claimed_ncs, 0);
}

fn main() {
    // `--list` (cargo nextest, IDEs): one test.
    if std::env::args().any(|a| a == "--list") {
        println!("fork_after_init_leaves_the_parent_alone: test");
        return;
    }
    fork_after_init_leaves_the_parent_alone();
    println!("test fork_after_init_leaves_the_parent_alone ... ok");
    println!();
    println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}
