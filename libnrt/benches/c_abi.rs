//! Sync `nrt_execute` of the identity model through the C ABI (the exported functions, with
//! handle registries, set resolution and the unwind boundary) against the same execution
//! through the Rust API (`Runtime::execute`), in the same process, on the same runtime, simdev
//! and model, in alternating rounds. The boundary should cost nothing measurable (target: a
//! ratio of at most 1.05).
//!
//! Everything runs on one CPU (`tests::bench::pin_to_one_cpu`), as the other execute benches.
//! Run: `cargo bench -p libnrt --bench c_abi`. Figures are printed, not asserted.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use nrt::model::{nrt_execute, nrt_load};
use nrt::set::{nrt_add_tensor_to_tensor_set, nrt_allocate_tensor_set};
use nrt::tensor::nrt_tensor_allocate;
use runtime::backend::sim::{PrivateSimdev, SimdevCommand};
use runtime::backend::{BackendKind, OpenOptions};
use runtime::{Placement, TensorSet};
use shared::model::Target;
use tests::bench::{percentile, pin_to_one_cpu, run_as_simdev_if_asked, us};

const ROUNDS: usize = 20;
const PER_ROUND: usize = 500;

fn summary(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / u32::try_from(samples.len()).unwrap();
    (
        us(percentile(&samples, 500)),
        us(percentile(&samples, 990)),
        us(mean),
    )
}

fn main() {
    run_as_simdev_if_asked();
    pin_to_one_cpu();
    let sim = PrivateSimdev::spawn(&SimdevCommand {
        program: std::env::current_exe().unwrap(),
        args_prefix: vec!["simdev".into()],
        extra_args: vec!["--hbm".into(), "64M".into()],
    })
    .expect("simdev starts");
    let opts = OpenOptions {
        kind: BackendKind::Sim,
        simdev_socket: Some(sim.socket().to_path_buf()),
        ..OpenOptions::default()
    };
    runtime::nrt::init_with(&opts).expect("nrt_init");
    let rt = runtime::nrt::current().unwrap();
    for bytes in [64u32, 4096] {
        let container = runtime::builder::identity(bytes)
            .to_container(Target::Simdev)
            .unwrap();
        let size = bytes as usize;

        // The C side: handles from the exports.
        let mut model: *mut c_void = std::ptr::null_mut();
        let (mut cin, mut cout): (*mut c_void, *mut c_void) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut ins, mut outs): (*mut c_void, *mut c_void) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: every pointer is ours and valid: the container's bytes, out-parameters on
        // this stack frame, NUL-terminated literals.
        unsafe {
            assert_eq!(
                nrt_load(
                    container.as_ptr().cast(),
                    container.len(),
                    0,
                    -1,
                    &mut model
                ),
                0
            );
            assert_eq!(nrt_tensor_allocate(0, 0, size, c"in".as_ptr(), &mut cin), 0);
            assert_eq!(
                nrt_tensor_allocate(0, 0, size, c"out".as_ptr(), &mut cout),
                0
            );
            assert_eq!(nrt_allocate_tensor_set(&mut ins), 0);
            assert_eq!(nrt_allocate_tensor_set(&mut outs), 0);
            assert_eq!(nrt_add_tensor_to_tensor_set(ins, c"input".as_ptr(), cin), 0);
            assert_eq!(
                nrt_add_tensor_to_tensor_set(outs, c"output".as_ptr(), cout),
                0
            );
        }
        // SAFETY: handles from the exports above.
        let c_execute = || unsafe { nrt_execute(model, ins, outs) };

        // The Rust side: the same runtime, its own model and tensors.
        let handle = rt.load(&container, 0).unwrap();
        let rin = rt
            .tensor_allocate(Placement::Device { vnc: 0 }, u64::from(bytes), "in")
            .unwrap();
        let rout = rt
            .tensor_allocate(Placement::Device { vnc: 0 }, u64::from(bytes), "out")
            .unwrap();
        let (mut rins, mut routs) = (TensorSet::new(), TensorSet::new());
        rins.add("input", &rin);
        routs.add("output", &rout);
        let rust_execute = || rt.execute(handle, &rins, &routs).map(|()| 0u32).unwrap();

        for _ in 0..200 {
            assert_eq!(c_execute(), 0);
            assert_eq!(rust_execute(), 0);
        }
        let (mut c, mut r) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Alternate which goes first so drift hits both alike.
            let order: [bool; 2] = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for is_c in order {
                for _ in 0..PER_ROUND {
                    let t = Instant::now();
                    let s = if is_c { c_execute() } else { rust_execute() };
                    let d = t.elapsed();
                    assert_eq!(s, 0);
                    if is_c { c.push(d) } else { r.push(d) }
                }
            }
        }
        let (c50, c99, cmean) = summary(c);
        let (r50, r99, rmean) = summary(r);
        println!(
            "identity {bytes:>5} B  C ABI p50 {c50:7.2} us p99 {c99:7.2} us mean {cmean:7.2} us | Rust API p50 {r50:7.2} us p99 {r99:7.2} us mean {rmean:7.2} us | ratio p50 {:.3} mean {:.3}",
            c50 / r50,
            cmean / rmean
        );
    }
    drop(rt);
    runtime::nrt::close();
    drop(sim);
}
