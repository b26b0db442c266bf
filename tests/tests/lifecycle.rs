//! The process-global API's lifecycle gates (seed 000 §1): one test in its own process, since
//! the state is process-wide.

use runtime::backend::OpenOptions;
use runtime::backend::select::BackendKind;
use runtime::{Placement, TensorSet, nrt};
use shared::NrtStatus;
use shared::model::Target;

#[test]
fn uninitialized_13_closed_14_and_a_second_close_is_harmless() {
    let model = runtime::builder::identity(16)
        .to_container(Target::Simdev)
        .unwrap();
    let (ins, outs) = (TensorSet::new(), TensorSet::new());
    let handle = runtime::ModelHandle { id: 1, vnc: 0 };
    assert_eq!(
        nrt::execute(handle, &ins, &outs).unwrap_err().status,
        NrtStatus::Uninitialized
    );
    assert_eq!(
        nrt::load(&model, 0).unwrap_err().status,
        NrtStatus::Uninitialized
    );

    let sim = tests::start_simdev(&["--hbm", "16M"]);
    let opts = OpenOptions {
        kind: BackendKind::Sim,
        simdev_socket: Some(sim.socket().to_owned()),
        ..OpenOptions::default()
    };
    nrt::init_with(&opts).unwrap();
    assert_eq!(
        nrt::init_with(&opts).unwrap_err().status,
        NrtStatus::Failure,
        "init twice"
    );
    let m = nrt::load(&model, 0).unwrap();
    let i = nrt::tensor_allocate(Placement::Device { vnc: 0 }, 16, "i").unwrap();
    let o = nrt::tensor_allocate(Placement::Device { vnc: 0 }, 16, "o").unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    i.write(&[7; 16], 0).unwrap();
    nrt::execute(m, &ins, &outs).unwrap();
    let mut out = [0u8; 16];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, [7; 16]);
    drop((i, o, ins, outs));

    nrt::close();
    let (ins, outs) = (TensorSet::new(), TensorSet::new());
    assert_eq!(
        nrt::execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::Closed
    );
    assert_eq!(nrt::load(&model, 0).unwrap_err().status, NrtStatus::Closed);
    nrt::close();
    assert_eq!(
        nrt::execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::Closed
    );
}
