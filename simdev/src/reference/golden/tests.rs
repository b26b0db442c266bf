use std::sync::Arc;

use shared::address_map::{AddressMap, Arch};
use shared::neff_program::shape_only;

use super::*;
use crate::client::ClientId;
use crate::memory::{AddressSpace, Chunk, Region};

const A: ClientId = ClientId(1);
const MIB: u64 = 1 << 20;

fn matmul_small() -> neff::Neff {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/data/neff/matmul_small.neff"
    );
    let bytes = std::fs::read(path).unwrap();
    neff::Neff::parse(&bytes, &neff::ParseOptions::default()).unwrap()
}

/// Seeded bytes (the shape-only byte stream, as a stand-in for data).
fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0; usize::try_from(len).unwrap()];
    shape_only::fill(seed, 0, &mut v);
    v
}

/// `n` executions of `neff` with seeded inputs and outputs.
fn recorded(neff: &neff::Neff, n: u64) -> Vec<Recorded> {
    (0..n)
        .map(|k| Recorded {
            inputs: (neff.inputs.iter().zip(0..))
                .map(|(t, i)| (t.name.clone(), bytes(k * 100 + i, t.size)))
                .collect(),
            outputs: (neff.outputs.iter().zip(0..))
                .map(|(t, i)| (t.name.clone(), bytes(k * 100 + 50 + i, t.size)))
                .collect(),
        })
        .collect()
}

/// The NEFF's tensors bound in chunks of an in-memory address space, each at a non-zero
/// offset inside its chunk.
struct Bound {
    _space: AddressSpace,
    tensors: Vec<BoundTensor>,
}

impl Bound {
    fn new(neff: &neff::Neff) -> Self {
        let mut space = AddressSpace::new(AddressMap {
            arch: Arch::Trn1,
            nc_count: 1,
            hbm_bytes_per_nc: 64 * MIB,
        });
        let mut tensors = Vec::new();
        for (t, input) in neff
            .inputs
            .iter()
            .map(|t| (t, true))
            .chain(neff.outputs.iter().map(|t| (t, false)))
        {
            let chunk: Arc<Chunk> = space.allocate(A, Region::Hbm(0), t.size + 8192, 0).unwrap();
            tensors.push(BoundTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                input,
                chunk,
                offset: 4096,
                size: t.size,
            });
        }
        Self {
            _space: space,
            tensors,
        }
    }

    fn tensor(&self, name: &str) -> &BoundTensor {
        self.tensors.iter().find(|t| t.name == name).unwrap()
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        let t = self.tensor(name);
        t.chunk
            .memory()
            .write(t.chunk.pa() + t.offset, bytes)
            .unwrap();
    }

    fn read(&self, name: &str) -> Vec<u8> {
        let t = self.tensor(name);
        let mut v = vec![0; usize::try_from(t.size).unwrap()];
        t.chunk
            .memory()
            .read(t.chunk.pa() + t.offset, &mut v)
            .unwrap();
        v
    }

    fn set_inputs(&self, e: &Recorded) {
        for (name, b) in &e.inputs {
            self.write(name, b);
        }
    }
}

fn open(neff: &neff::Neff, file: Vec<u8>) -> Result<Golden, String> {
    Golden::from_bytes("test.safetensors".into(), file, neff)
}

#[test]
fn a_recorded_input_gets_the_recorded_outputs_exactly() {
    let neff = matmul_small();
    let execs = recorded(&neff, 4);
    let file = serialize(&neff, "silicon", &execs).unwrap();
    // Through the file system, as simdev opens it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    std::fs::write(&path, &file).unwrap();
    let golden = Golden::open(&path, &neff).unwrap();
    assert_eq!(golden.executions(), 4);
    let bound = Bound::new(&neff);
    for k in [2, 0, 3, 1] {
        bound.set_inputs(&execs[k]);
        golden.run(&bound.tensors).unwrap();
        for (name, want) in &execs[k].outputs {
            assert!(bound.read(name) == *want, "execution {k} output {name}");
        }
    }
    // Nothing outside the output's bytes was written.
    let out = bound.tensor("output0");
    let mut around = vec![0u8; 4096];
    out.chunk
        .memory()
        .read(out.chunk.pa(), &mut around)
        .unwrap();
    assert!(around.iter().all(|&b| b == 0));
}

#[test]
fn an_unrecorded_input_names_the_closest_execution_and_the_first_differing_byte() {
    let neff = matmul_small();
    let execs = recorded(&neff, 4);
    let golden = open(&neff, serialize(&neff, "silicon", &execs).unwrap()).unwrap();
    let bound = Bound::new(&neff);
    bound.set_inputs(&execs[3]);
    let mut y = execs[3]
        .inputs
        .iter()
        .find(|(n, _)| n == "y")
        .unwrap()
        .1
        .clone();
    y[1024] ^= 0x40;
    y[2000] ^= 0x01;
    bound.write("y", &y);
    let before = bound.read("output0");
    let err = golden.run(&bound.tensors).unwrap_err();
    assert!(
        err.contains(
            "no recorded execution has these inputs; closest is execution 3: input \"y\" differs first at byte 1024 of 65536"
        ),
        "{err}"
    );
    assert_eq!(bound.read("output0"), before, "a miss writes nothing");
    // Only the last byte differs: still a miss, at that byte.
    y = execs[3]
        .inputs
        .iter()
        .find(|(n, _)| n == "y")
        .unwrap()
        .1
        .clone();
    y[65535] ^= 1;
    bound.write("y", &y);
    let err = golden.run(&bound.tensors).unwrap_err();
    assert!(
        err.contains("execution 3: input \"y\" differs first at byte 65535 of 65536"),
        "{err}"
    );
}

#[test]
fn the_content_hash_does_not_depend_on_how_the_bytes_are_cut() {
    let data = bytes(7, 1001);
    let whole = {
        let mut h = ContentHash::default();
        h.begin_input(1001);
        h.bytes(&data);
        h.begin_input(3);
        h.bytes(&[1, 2, 3]);
        h.value()
    };
    for cut in [1, 3, 7, 8, 9, 500, 1000] {
        let mut h = ContentHash::default();
        h.begin_input(1001);
        h.bytes(&data[..cut]);
        h.bytes(&data[cut..]);
        h.begin_input(3);
        h.bytes(&[1, 2, 3]);
        assert_eq!(h.value(), whole, "cut at {cut}");
    }
    // The size word separates inputs: moving a byte between inputs changes the hash.
    let mut h = ContentHash::default();
    h.begin_input(1002);
    h.bytes(&data);
    h.bytes(&[1]);
    h.begin_input(2);
    h.bytes(&[2, 3]);
    assert_ne!(h.value(), whole);
}

/// A safetensors file of `tensors` with `metadata`, built without [`serialize`]'s checks.
fn custom(tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)], metadata: &[(&str, &str)]) -> Vec<u8> {
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    safetensors::serialize(views, &Some(meta)).unwrap()
}

/// Execution 0 of `neff` as tensors, with `change` applied to the named tensor.
fn tensors_with(
    neff: &neff::Neff,
    change: &str,
    dtype: Dtype,
    shape: Vec<usize>,
) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let e = &recorded(neff, 1)[0];
    e.inputs
        .iter()
        .map(|x| (tensor_name(0, true, &x.0), x))
        .chain(e.outputs.iter().map(|x| (tensor_name(0, false, &x.0), x)))
        .map(|(name, (io, b))| {
            let t = neff
                .inputs
                .iter()
                .chain(&neff.outputs)
                .find(|t| t.name == *io)
                .unwrap();
            if name == change {
                (
                    name,
                    dtype,
                    shape.clone(),
                    vec![0; shape.iter().product::<usize>() * dtype.size()],
                )
            } else {
                let s = t
                    .shape
                    .iter()
                    .map(|&d| usize::try_from(d).unwrap())
                    .collect();
                (name, Dtype::F16, s, b.clone())
            }
        })
        .collect()
}

#[test]
fn bad_metadata_is_refused_naming_the_key() {
    let neff = matmul_small();
    let uuid = neff.uuid_hex();
    let good = tensors_with(&neff, "", Dtype::F16, vec![]);
    let meta = |format: &str, version: &str, uuid: &str, n: &str| {
        custom(
            &good,
            &[
                (FORMAT_KEY, format),
                (VERSION_KEY, version),
                (NEFF_UUID_KEY, uuid),
                (NEFF_NAME_KEY, "x.neff"),
                (EXECUTIONS_KEY, n),
            ],
        )
    };
    assert!(open(&neff, meta(FORMAT, VERSION, &uuid, "1")).is_ok());
    let cases = [
        (
            meta("other", VERSION, &uuid, "1"),
            "\"format\" is \"other\"",
        ),
        (meta(FORMAT, "2", &uuid, "1"), "\"version\" is \"2\""),
        (
            meta(FORMAT, VERSION, "00112233445566778899aabbccddeeff", "1"),
            "uuid 00112233445566778899aabbccddeeff",
        ),
        (meta(FORMAT, VERSION, &uuid, "0"), "\"executions\" is \"0\""),
        (meta(FORMAT, VERSION, &uuid, "2"), "tensor \"1/in/"),
        (custom(&good, &[]), "no \"format\""),
        (b"not safetensors".to_vec(), "not a safetensors file"),
    ];
    for (file, want) in cases {
        let err = open(&neff, file).unwrap_err();
        assert!(err.contains(want), "{want:?} not in {err}");
    }
}

#[test]
fn a_tensor_with_another_dtype_or_shape_or_name_is_refused_naming_it_and_both() {
    let neff = matmul_small();
    let uuid = neff.uuid_hex();
    let file = |tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>| {
        custom(
            &tensors,
            &[
                (FORMAT_KEY, FORMAT),
                (VERSION_KEY, VERSION),
                (NEFF_UUID_KEY, &uuid),
                (EXECUTIONS_KEY, "1"),
            ],
        )
    };
    let err = open(
        &neff,
        file(tensors_with(&neff, "0/in/y", Dtype::F32, vec![128, 128])),
    )
    .unwrap_err();
    assert!(
        err.contains(
            "tensor \"0/in/y\" has dtype F32; the NEFF's \"y\" is NRT_DTYPE_FLOAT16 (F16)"
        ),
        "{err}"
    );
    let err = open(
        &neff,
        file(tensors_with(
            &neff,
            "0/out/output0",
            Dtype::F16,
            vec![128, 129],
        )),
    )
    .unwrap_err();
    assert!(
        err.contains("tensor \"0/out/output0\" has shape [128, 129]; the NEFF's \"output0\" has shape [128, 128]"),
        "{err}"
    );
    let mut extra = tensors_with(&neff, "", Dtype::F16, vec![]);
    extra.push(("0/in/z".into(), Dtype::U8, vec![4], vec![0; 4]));
    let err = open(&neff, file(extra)).unwrap_err();
    assert!(
        err.contains("tensor \"0/in/z\" is not an input or output"),
        "{err}"
    );
    let mut missing = tensors_with(&neff, "", Dtype::F16, vec![]);
    missing.retain(|t| t.0 != "0/in/x");
    let err = open(&neff, file(missing)).unwrap_err();
    assert!(err.contains("tensor \"0/in/x\" is missing"), "{err}");
}

#[test]
fn dtypes_safetensors_cannot_name_are_refused() {
    for d in DType::ALL {
        let r = safetensors_dtype(d);
        match d {
            DType::Fp32r | DType::Fp8E3 => {
                let err = r.unwrap_err();
                assert!(err.contains(d.nrt_name()), "{err}");
            }
            _ => assert_eq!(r.unwrap().size() as u64, d.size(), "{}", d.nrt_name()),
        }
    }
}

#[test]
fn a_tensor_bound_with_the_wrong_size_or_not_at_all_is_an_error() {
    let neff = matmul_small();
    let execs = recorded(&neff, 1);
    let golden = open(&neff, serialize(&neff, "silicon", &execs).unwrap()).unwrap();
    let mut bound = Bound::new(&neff);
    bound.set_inputs(&execs[0]);
    bound.tensors.retain(|t| t.name != "output0");
    let err = golden.run(&bound.tensors).unwrap_err();
    assert!(err.contains("no output \"output0\" bound"), "{err}");
    let mut bound = Bound::new(&neff);
    bound.tensors[0].size -= 2;
    let err = golden.run(&bound.tensors).unwrap_err();
    assert!(
        err.contains("bound with 65534 bytes; the NEFF declares 65536"),
        "{err}"
    );
    // A tensor reaching past its chunk is read through the bounds-checked accessor: an error.
    let mut bound = Bound::new(&neff);
    bound.tensors[0].offset = bound.tensors[0].chunk.size() - 100;
    let err = golden.run(&bound.tensors).unwrap_err();
    assert!(err.contains("golden reference: reading"), "{err}");
}
