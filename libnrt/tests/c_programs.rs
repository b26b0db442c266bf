//! The C programs of `tests/c/`, compiled with the system compiler against our headers and the
//! built `libnrt.so` (as `libnrt.so.1` in a private prefix), each run against its own private
//! simdev: the library starts it through `NEURON_SIMDEV_BIN`, as any C program on a laptop.
//!
//! They need the workspace's `simdev` and `nrt` binaries in target/<profile> (`cargo test
//! --workspace` builds them), a C and a C++ compiler, `nm` and `valgrind` (`.ci/run` installs
//! it when missing).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The crate's directory.
fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The library cargo built for these tests: `deps/libnrt.so` (cargo uplifts it to
/// target/<profile> only when the package itself is built, not when a test needs it).
fn built_library() -> PathBuf {
    profile_dir().join("deps").join("libnrt.so")
}

/// target/<profile>: where cargo put simdev and nrt.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A prefix laid out like /opt/aws/neuron: lib/libnrt.so.1 (the built library) with the
/// libnrt.so link, include/ = our headers.
struct Prefix {
    dir: tempfile::TempDir,
}

impl Prefix {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        let built = built_library();
        assert!(built.is_file(), "{} not built", built.display());
        std::fs::copy(&built, lib.join("libnrt.so.1")).unwrap();
        std::os::unix::fs::symlink("libnrt.so.1", lib.join("libnrt.so")).unwrap();
        Self { dir }
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Compiles `sources` (in tests/c) into `exe` with `compiler` and `std`, warnings as errors,
/// linking libnrt unless `link_nrt` is false.
fn compile(
    prefix: &Prefix,
    compiler: &str,
    std: &str,
    sources: &[&str],
    exe: &str,
    link_nrt: bool,
) -> PathBuf {
    let out = prefix.out(exe);
    let c = crate_dir().join("tests/c");
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-g"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-I")
        .arg(&c);
    for s in sources {
        cmd.arg(c.join(s));
    }
    cmd.arg("-o").arg(&out).arg("-pthread");
    if link_nrt {
        cmd.arg("-L")
            .arg(prefix.lib())
            .arg("-lnrt")
            .arg(format!("-Wl,-rpath,{}", prefix.lib().display()));
    } else {
        cmd.arg("-ldl");
    }
    let o = cmd.output().expect("run the compiler");
    assert!(
        o.status.success(),
        "{compiler} {sources:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs `cmd` with the environment of a laptop without a device: a private simdev from
/// `NEURON_SIMDEV_BIN`.
fn run(cmd: Command) -> Output {
    run_with(cmd, &[])
}

/// [`run`] with the variables `env` set on top.
fn run_with(mut cmd: Command, env: &[(&str, &str)]) -> Output {
    let simdev = tests::simdev_command(&[]).program;
    cmd.env("NEURON_SIMDEV_BIN", simdev)
        .env("NEURON_RT_BACKEND", "sim")
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .envs(env.iter().copied());
    // Errors are logged, unless the test sets the level itself.
    if !cmd.get_envs().any(|(k, _)| k == "NEURON_RT_LOG_LEVEL") {
        cmd.env("NEURON_RT_LOG_LEVEL", "error");
    }
    cmd.output().expect("run the program")
}

fn assert_ran(o: &Output, what: &str, marker: &str) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success() && stdout.contains(marker),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn identity_model() -> PathBuf {
    crate_dir().join("../scenarios/data/identity_512.nrtm")
}

/// An identity model over `bytes` bytes, written into `prefix` (a slow execution: simdev's DMA
/// copies every byte).
fn identity_model_of(prefix: &Prefix, bytes: u32) -> PathBuf {
    let path = prefix.out(&format!("identity_{bytes}.nrtm"));
    let container = runtime::builder::identity(bytes)
        .to_container(shared::model::Target::Simdev)
        .unwrap();
    std::fs::write(&path, container).unwrap();
    path
}

#[test]
fn the_developer_guide_flow_runs_clean_under_valgrind() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["flow.c"], "flow", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "flow", "FLOW OK");
    leak_check(&exe, &[identity_model()], "FLOW OK");
}

/// Runs `exe args` under a user's valgrind leak check — every kind valgrind counts by default
/// (definite and possible), errors fail it — with the suppressions `nrt install` ships (the Rust
/// std handle of the C thread), and checks it printed `marker`.
fn leak_check(exe: &Path, args: &[PathBuf], marker: &str) {
    let valgrind = Command::new("valgrind").arg("--version").output();
    assert!(
        valgrind.is_ok_and(|o| o.status.success()),
        "valgrind is missing: install it (`apt-get install valgrind`; .ci/run does)"
    );
    let o = run({
        let mut c = Command::new("valgrind");
        c.args(["--leak-check=full", "--error-exitcode=1", "--quiet"])
            .arg(format!(
                "--suppressions={}",
                crate_dir().join("valgrind/libnrt.supp").display()
            ))
            .arg(exe)
            .args(args);
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_ran(&o, &format!("{} under valgrind", exe.display()), marker);
    assert!(!stderr.contains("definitely lost"), "{stderr}");
}

/// The async API's completion relay (a thread of the library, joined at `nrt_close`) and the
/// system trace's buffers leave nothing behind either.
#[test]
fn the_async_api_and_the_system_trace_run_clean_under_valgrind() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["sys_trace.c"], "sys_trace", true);
    leak_check(
        &exe,
        &[identity_model(), prefix.out("profile.json")],
        "SYS TRACE OK",
    );
}

/// The total core count ignores NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES, even
/// malformed (libfabric counts cores before anything calls `nrt_init`, and turns Neuron off on
/// an error); the visible count and `nrt_init` refuse a malformed one.
#[test]
fn the_total_core_count_is_unaffected_by_the_core_selection_variables() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["counts.c"], "counts", true);
    let counts = |env: &[(&str, &str)]| {
        let o = run_with(Command::new(&exe), env);
        let stdout = assert_ran(&o, "counts", "INIT");
        let line = |what: &str| -> Vec<i64> {
            let l = stdout
                .lines()
                .find(|l| l.starts_with(what))
                .unwrap_or_else(|| panic!("no {what} line in {stdout}"));
            l.split_whitespace()
                .skip(1)
                .map(|v| v.parse().unwrap())
                .collect()
        };
        (line("TOTAL"), line("VISIBLE"), line("INIT")[0])
    };
    let (total, visible, init) = counts(&[]);
    assert_eq!((total[0], visible[0], init), (0, 0, 0));
    assert!(
        total[1] >= 2 && visible[1] == total[1],
        "{total:?} {visible:?}"
    );
    for bad in [
        ("NEURON_RT_VISIBLE_CORES", "3,1"),
        ("NEURON_RT_NUM_CORES", "many"),
    ] {
        let (t, v, i) = counts(&[bad]);
        assert_eq!(t, total, "{bad:?}: the total is the device's");
        assert_eq!(
            v[0], 2,
            "{bad:?}: the visible count refuses it (NRT_INVALID)"
        );
        assert_eq!(i, 2, "{bad:?}: nrt_init refuses it (NRT_INVALID)");
    }
    // Only the logical core size changes the total: a malformed one is refused there too.
    let (t, _, _) = counts(&[("NEURON_LOGICAL_NC_CONFIG", "3")]);
    assert_eq!(t[0], 2, "{t:?}");
}

#[test]
fn every_status_gate_answers_from_c() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["gates.c"], "gates", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "gates", "GATES OK");
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Refusals are logged, naming what was wrong.
    assert!(
        stderr.contains("not handed out by this library"),
        "{stderr}"
    );
    assert!(stderr.contains("already freed"), "{stderr}");
    // The debug stream's refusal says why, naming the core or descriptor.
    for needle in [
        "logical core 99 is not visible to this process",
        "debug stream of logical core 0: this runtime has no debug-stream events to deliver",
        "stream_fd 3 is not a debug-stream connection",
        "stream_fd is NULL",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in:\n{stderr}");
    }
    // A freed member names itself as the set's tensor, the handle being the tensor's.
    assert!(
        stderr.contains("the set's tensor \"input\", handle 0x"),
        "{stderr}"
    );
    assert!(
        stderr.contains("is a tensor set handle, not a tensor"),
        "{stderr}"
    );
    // NEURON_RT_LOG_LEVEL takes libnrt's level names in any case; QUIET silences, and a value
    // that is no level is said and errors are still logged.
    for (level, logged) in [
        ("WARNING", true),
        ("warn", true),
        ("Info", true),
        ("QUIET", false),
        ("bogus", true),
    ] {
        let o = run({
            let mut c = Command::new(&exe);
            c.arg(identity_model()).env("NEURON_RT_LOG_LEVEL", level);
            c
        });
        assert_ran(&o, "gates", "GATES OK");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            stderr.contains("already freed"),
            logged,
            "NEURON_RT_LOG_LEVEL={level}:\n{stderr}"
        );
        assert_eq!(
            stderr.contains("NEURON_RT_LOG_LEVEL=\"bogus\" is not a level"),
            level == "bogus",
            "NEURON_RT_LOG_LEVEL={level}:\n{stderr}"
        );
    }
}

#[test]
fn eight_c_threads_execute_one_model_and_every_output_is_right() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["threads.c"], "threads", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "threads", "THREADS OK 400");
}

/// The reference's table (`nrt-api.md` §2.2) and enum values, as `layout.c` prints them.
const LAYOUT: &[(&str, i64)] = &[
    ("sizeof(nrt_version_t)", 224),
    ("offsetof(nrt_version_t,rt_major)", 0),
    ("offsetof(nrt_version_t,rt_minor)", 8),
    ("offsetof(nrt_version_t,rt_patch)", 16),
    ("offsetof(nrt_version_t,rt_maintenance)", 24),
    ("offsetof(nrt_version_t,rt_detail)", 32),
    ("offsetof(nrt_version_t,git_hash)", 160),
    ("sizeof(nrt_instance_info_t)", 32),
    ("offsetof(nrt_instance_info_t,family)", 0),
    ("offsetof(nrt_instance_info_t,size)", 4),
    ("offsetof(nrt_instance_info_t,arch_name)", 8),
    ("offsetof(nrt_instance_info_t,device_revision)", 24),
    ("sizeof(nrt_tensor_info_t)", 296),
    ("offsetof(nrt_tensor_info_t,name)", 0),
    ("offsetof(nrt_tensor_info_t,usage)", 256),
    ("offsetof(nrt_tensor_info_t,size)", 264),
    ("offsetof(nrt_tensor_info_t,dtype)", 272),
    ("offsetof(nrt_tensor_info_t,shape)", 280),
    ("offsetof(nrt_tensor_info_t,ndim)", 288),
    ("sizeof(nrt_tensor_info_array_t)", 8),
    ("offsetof(nrt_tensor_info_array_t,tensor_count)", 0),
    ("offsetof(nrt_tensor_info_array_t,tensor_array)", 8),
    ("sizeof(nrt_tensor_device_allocation_info_t)", 24),
    (
        "offsetof(nrt_tensor_device_allocation_info_t,physical_address)",
        0,
    ),
    ("offsetof(nrt_tensor_device_allocation_info_t,size)", 8),
    (
        "offsetof(nrt_tensor_device_allocation_info_t,hbm_index)",
        16,
    ),
    ("sizeof(nrt_vnc_memory_stats_t)", 16),
    ("offsetof(nrt_vnc_memory_stats_t,bytes_used)", 0),
    ("offsetof(nrt_vnc_memory_stats_t,bytes_limit)", 8),
    ("sizeof(nrt_model_info_t)", 4),
    ("offsetof(nrt_model_info_t,vnc)", 0),
    ("sizeof(nrt_tensor_batch_op_t)", 24),
    ("offsetof(nrt_tensor_batch_op_t,offset)", 0),
    ("offsetof(nrt_tensor_batch_op_t,size)", 8),
    ("offsetof(nrt_tensor_batch_op_t,buffer)", 16),
    ("sizeof(nrt_tensor_batch_t)", 24),
    ("offsetof(nrt_tensor_batch_t,tensor)", 0),
    ("offsetof(nrt_tensor_batch_t,ops)", 8),
    ("offsetof(nrt_tensor_batch_t,num_ops)", 16),
    ("sizeof(nrt_cc_comm_t)", 32),
    ("offsetof(nrt_cc_comm_t,replica_group)", 0),
    ("offsetof(nrt_cc_comm_t,rank)", 8),
    ("offsetof(nrt_cc_comm_t,rank_n)", 12),
    ("offsetof(nrt_cc_comm_t,ctx_device_id)", 16),
    ("offsetof(nrt_cc_comm_t,ctx_device_count)", 20),
    ("offsetof(nrt_cc_comm_t,vnc)", 24),
    ("sizeof(nrt_tensor_list_t)", 16),
    ("offsetof(nrt_tensor_list_t,tensors)", 0),
    ("offsetof(nrt_tensor_list_t,num_tensors)", 8),
    ("sizeof(NRT_STATUS)", 4),
    ("sizeof(nrt_dtype_t)", 4),
    ("sizeof(nrta_seq_t)", 8),
    ("NRT_DTYPE_UINT64", 0x1),
    ("NRT_DTYPE_INT8", 0x2),
    ("NRT_DTYPE_UINT8", 0x3),
    ("NRT_DTYPE_INT16", 0x4),
    ("NRT_DTYPE_UINT16", 0x5),
    ("NRT_DTYPE_BFLOAT16", 0x6),
    ("NRT_DTYPE_FLOAT16", 0x7),
    ("NRT_DTYPE_INT32", 0x8),
    ("NRT_DTYPE_UINT32", 0x9),
    ("NRT_DTYPE_FLOAT32", 0xA),
    ("NRT_DTYPE_FP32R", 0xB),
    ("NRT_DTYPE_INT64", 0xC),
    ("NRT_DTYPE_FP8_E3", 0xD),
    ("NRT_DTYPE_FP8_E4", 0xE),
    ("NRT_DTYPE_FP8_E5", 0xF),
    ("NRT_OP_ADD", 0),
    ("NRT_OP_FMA", 1),
    ("NRT_OP_MAX", 2),
    ("NRT_OP_MIN", 3),
    ("NRT_OP_INVALID", 0xF),
    ("NRT_CC_ALLGATHER", 0),
    ("NRT_CC_ALLREDUCE", 1),
    ("NRT_CC_REDUCESCATTER", 2),
    ("NRTA_XU_TENSOR_OP", 0),
    ("NRTA_XU_COMPUTE", 1),
    ("NRTA_XU_COLLECTIVES", 2),
    ("NRTA_XU_TYPE_NUM", 3),
    ("NRT_TENSOR_PLACEMENT_DEVICE", 0),
    ("NRT_TENSOR_PLACEMENT_HOST", 1),
    ("NRT_TENSOR_USAGE_INPUT", 0),
    ("NRT_TENSOR_USAGE_OUTPUT", 1),
    ("NRT_FRAMEWORK_TYPE_NO_FW", 1),
    ("NRT_INSTANCE_TRN1", 2),
    ("NRT_INSTANCE_INF2", 4),
    ("NRT_INSTANCE_TRN2", 5),
    ("NRT_INSTANCE_TRN3E", 17),
    ("NRT_INSTANCE_SIZE_UNKNOWN", 9),
    ("NRT_TENSOR_NAME_MAX", 256),
    ("NRT_UNINITIALIZED", 13),
    ("NRT_CLOSED", 14),
    ("NRT_QUEUE_FULL", 7),
    ("NRT_EXEC_UNIT_UNRECOVERABLE", 101),
    ("NRT_EXEC_OOB", 1006),
    ("NRT_NETWORK_PROXY_FAILURE", 1206),
    ("NRTA_SEQ_GET_SEQ_NUM(0x0001000000000005ULL)", 5),
    ("NRTA_SEQ_GET_XU_ID(0x0001000000000005ULL)", 1),
    ("sizeof(ndebug_stream_event_header_t)", 64),
    ("offsetof(ndebug_stream_event_header_t,data_size)", 0),
    ("offsetof(ndebug_stream_event_header_t,type)", 8),
    ("offsetof(ndebug_stream_event_header_t,reserved)", 12),
    ("sizeof(ndebug_stream_payload_debug_tensor_read_t)", 1024),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,prefix)",
        0,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,logical_nc_id)",
        512,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,pipe)",
        516,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,tensor_dtype)",
        520,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,tensor_shape)",
        536,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,tensor_data_size)",
        600,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,reserved0)",
        608,
    ),
    (
        "offsetof(ndebug_stream_payload_debug_tensor_read_t,tensor_data)",
        1024,
    ),
    ("NDEBUG_STREAM_EVENT_TYPE_INVALID", 0),
    ("NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ", 1),
];

#[test]
fn struct_layouts_and_enum_values_match_the_reference_in_c_and_cxx() {
    let prefix = Prefix::new();
    for (compiler, std, exe) in [("cc", "c11", "layout_c"), ("c++", "c++17", "layout_cxx")] {
        let bin = if compiler == "cc" {
            compile(&prefix, compiler, std, &["layout.c"], exe, false)
        } else {
            // The same program as C++.
            let src = prefix.out("layout.cpp");
            std::fs::copy(crate_dir().join("tests/c/layout.c"), &src).unwrap();
            let out = prefix.out(exe);
            let o = Command::new(compiler)
                .args([
                    &format!("-std={std}"),
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-pedantic",
                ])
                .arg("-I")
                .arg(crate_dir().join("include"))
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            out
        };
        let o = Command::new(&bin).output().unwrap();
        assert!(o.status.success());
        let stdout = String::from_utf8_lossy(&o.stdout);
        let printed: Vec<(String, i64)> = stdout
            .lines()
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        let expected: Vec<(String, i64)> =
            LAYOUT.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(printed, expected, "{compiler}");
    }
}

#[test]
fn the_digits_mlp_through_the_c_api_scores_0_986111() {
    use runtime::builder::digits::{Digits, default_path};
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["digits.c"], "digits", true);
    let data = Digits::load(&default_path()).unwrap();
    let model = data.mlp().build(1).unwrap();
    let container = model.to_container(shared::model::Target::Simdev).unwrap();
    let (m, i, l) = (
        prefix.out("digits.nrtm"),
        prefix.out("inputs.bin"),
        prefix.out("labels.bin"),
    );
    std::fs::write(&m, container).unwrap();
    std::fs::write(
        &i,
        data.inputs
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    std::fs::write(
        &l,
        data.labels
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let o = run({
        let mut c = Command::new(&exe);
        c.args([&m, &i, &l]);
        c
    });
    let stdout = assert_ran(&o, "digits", "accuracy");
    assert!(
        stdout.contains("images 360 correct 355 accuracy 0.986111"),
        "{stdout}"
    );
}

/// Every function the headers declare: a line starting with a return type and naming an
/// `nrt`/`nrta` identifier followed by `(`.
fn declared_functions() -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(crate_dir().join("include/nrt")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let l = line.trim_start();
            let Some(rest) = ["NRT_STATUS ", "void ", "size_t ", "const char *", "void *"]
                .iter()
                .find_map(|ret| l.strip_prefix(ret))
            else {
                continue;
            };
            let rest = rest.trim_start_matches('*');
            if let Some((name, _)) = rest.split_once('(')
                && name.starts_with("nrt")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The functions libnrt.so exports (`nm -D --defined-only`).
fn exported_functions() -> std::collections::BTreeSet<String> {
    let o = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(built_library())
        .output()
        .expect("nm");
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

#[test]
fn the_library_exports_exactly_the_functions_the_headers_declare() {
    let declared = declared_functions();
    // The issue's list (a sample from each header) is declared.
    for f in [
        "nrt_init",
        "nrt_get_version",
        "nrt_get_status_as_str",
        "nrt_tensor_get_va",
        "nrt_get_model_tensor_info",
        "nrt_async_drain_queued_execs",
        "nrta_execute_schedule",
        "nrta_event_register_xu_completion",
        "nrt_profile_start",
        "nrt_sys_trace_fetch_events",
        "nrt_sys_trace_buffer_free",
    ] {
        assert!(declared.contains(f), "{f}");
    }
    assert_eq!(exported_functions(), declared);
}

/// `nrt install --prefix DIR` with the workspace's `nrt` binary.
fn nrt_install() -> tempfile::TempDir {
    let nrt = profile_dir().join("nrt");
    assert!(
        nrt.is_file(),
        "{} not built (cargo build --workspace)",
        nrt.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(&nrt)
        .args(["install", "--prefix"])
        .arg(dir.path())
        .arg("--lib")
        .arg(built_library())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lib = dir.path().join("lib");
    assert!(lib.join("libnrt.so.1").is_file());
    assert_eq!(
        std::fs::read_link(lib.join("libnrt.so")).unwrap(),
        Path::new("libnrt.so.1")
    );
    for h in [
        "nrt.h",
        "nrt_status.h",
        "nrt_version.h",
        "nrt_async.h",
        "nrt_experimental.h",
        "nrt_profile.h",
        "nrt_sys_trace.h",
        "ndebug_stream.h",
    ] {
        let installed = std::fs::read(dir.path().join("include/nrt").join(h)).unwrap();
        assert_eq!(
            installed,
            std::fs::read(crate_dir().join("include/nrt").join(h)).unwrap()
        );
    }
    dir
}

#[test]
fn a_dlopen_user_resolves_every_export_from_an_installed_prefix_and_runs_the_flow() {
    let prefix = nrt_install();
    let scratch = Prefix::new();
    let exe = compile(&scratch, "cc", "c11", &["dlopen.c"], "dlopen", false);
    let names: Vec<String> = exported_functions().into_iter().collect();
    assert!(names.len() >= 40);
    // Found by name through the loader's path, with the simdev the prefix carries (no
    // NEURON_SIMDEV_BIN: the library looks in its ../bin).
    let o = Command::new(&exe)
        .arg(identity_model())
        .args(&names)
        .env("LD_LIBRARY_PATH", prefix.path().join("lib"))
        .env("NEURON_RT_BACKEND", "sim")
        .env_remove("NEURON_SIMDEV_BIN")
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_ran(&o, "dlopen", &format!("DLOPEN OK {} symbols", names.len()));
}

#[test]
fn a_cxx17_program_includes_every_header_and_links() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "c++",
        "c++17",
        &["all_headers.cpp"],
        "all_headers",
        true,
    );
    let o = run(Command::new(&exe));
    assert_ran(&o, "c++", "CXX OK the API of libnrt 2.34.10.0");
}

#[test]
fn slices_attached_buffers_dmabuf_and_model_queries_work_from_c() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["tensors.c"], "tensors", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "tensors", "TENSORS OK");
}

#[test]
fn pinned_host_buffers_are_allocated_aligned_written_and_freed_from_c() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["pinned.c"], "pinned", true);
    let o = run(Command::new(&exe));
    assert_ran(&o, "pinned", "PINNED OK");
    // Every buffer is written and read within its bounds (pinned.c checks each is unmapped
    // when freed: memcheck does not see mappings).
    leak_check(&exe, &[], "PINNED OK");
}

#[test]
fn batched_reads_and_writes_and_output_completion_counts_work_from_c() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["outputs.c"], "outputs", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "outputs", "OUTPUTS OK");
    // The caller's batch arrays and buffers are read and written within their bounds only.
    leak_check(&exe, &[identity_model()], "OUTPUTS OK");
}

#[test]
fn executions_racing_an_unload_succeed_or_get_nrt_invalid() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["unload_race.c"],
        "unload_race",
        true,
    );
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "unload_race", "UNLOAD RACE OK");
}

#[test]
fn a_real_neff_loads_from_c_and_reports_float16_tensors() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["neff_info.c"], "neff_info", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(crate_dir().join("../scenarios/data/neff/matmul_small.neff"))
            .env("NEURON_SIMDEV_ARCH", "trn2")
            .env("NEURON_LOGICAL_NC_CONFIG", "2");
        c
    });
    let out = assert_ran(&o, "neff_info", "NEFF INFO OK");
    assert!(
        out.contains("x usage=0 dtype=7 size=65536 shape=[128,256]"),
        "{out}"
    );
}

#[test]
fn the_implicit_async_mode_calls_back_from_c_and_drains() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["async.c"], "async", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model())
            .env("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "3")
            // Read again when the private simdev is started: the warning must not repeat.
            .env("NEURON_RT_EXEC_TIMEOUT", "30")
            // A libnrt variable this runtime ignores: said at init.
            .env("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")
            .env("NEURON_RT_LOG_LEVEL", "warn");
        c
    });
    assert_ran(&o, "async", "ASYNC OK 20");
    // libnrt 2.34.10, whose API this reports, removed the mode: a user is told, once per
    // nrt_init however often the configuration is read.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        stderr.matches("libnrt 2.34.10 removed it").count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("NEURON_RT_STOCHASTIC_ROUNDING_EN set, but this runtime does not act on it")
            .count(),
        1,
        "{stderr}"
    );
}

/// The C program of the README's libnrt section.
fn readme_program() -> String {
    let readme = std::fs::read_to_string(crate_dir().join("../README.md")).unwrap();
    let section = readme
        .split("## The C library: libnrt.so.1")
        .nth(1)
        .expect("the README's libnrt section");
    let code = section.split("```c\n").nth(1).expect("a C block");
    code.split("```").next().unwrap().to_string()
}

#[test]
fn the_readme_program_builds_against_an_installed_prefix_and_runs() {
    let prefix = nrt_install();
    let src = prefix.path().join("app.c");
    std::fs::write(&src, readme_program()).unwrap();
    let exe = prefix.path().join("app");
    let lib = prefix.path().join("lib");
    let o = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg(&src)
        .arg("-I")
        .arg(prefix.path().join("include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lnrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // "A C or C++ program": the same source compiles as C++ too.
    let cxx_src = prefix.path().join("app.cpp");
    std::fs::copy(&src, &cxx_src).unwrap();
    let o = Command::new("c++")
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-c"])
        .arg(&cxx_src)
        .arg("-I")
        .arg(prefix.path().join("include"))
        .arg("-o")
        .arg(prefix.path().join("app_cxx.o"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    let stdout = assert_ran(&o, "README program", "output starts 7 7 7 7");
    assert!(stdout.contains("input  input: 512 bytes"), "{stdout}");

    // Its error paths return from `main` without `nrt_close`: the private simdev's directory
    // (socket and log) is removed and the datastore file closed all the same, as after a clean
    // close (a closed datastore lingers for monitors).
    let bad_model = prefix.path().join("not_a_model.nrtm");
    std::fs::write(&bad_model, b"not a model").unwrap();
    for (model, status) in [(identity_model(), 0), (bad_model, 1)] {
        let tmp = tempfile::tempdir().unwrap();
        let o = run({
            let mut c = Command::new(&exe);
            c.arg(&model)
                .env("TMPDIR", tmp.path())
                .env("NEURON_RT_DATASTORE_DIR", tmp.path())
                .env_remove("NEURON_RT_DATASTORE");
            c
        });
        assert_eq!(
            o.status.code(),
            Some(status),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                !runtime::datastore::read_file(p)
                    .is_ok_and(|s| s.liveness == runtime::datastore::snapshot::Liveness::Closed)
            })
            .collect();
        assert!(
            left.is_empty(),
            "exit status {status}: left behind in TMPDIR: {left:?}"
        );
    }

    // A datastore directory the user named that cannot hold the file: the program runs, and
    // the default log level (errors) says why monitors will not see it.
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model())
            .env("NEURON_RT_DATASTORE_DIR", prefix.path().join("no/such/dir"))
            .env_remove("NEURON_RT_DATASTORE");
        c
    });
    assert_ran(&o, "README program", "output starts 7 7 7 7");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("NEURON_RT_DATASTORE_DIR: the datastore file cannot be created there"),
        "{stderr}"
    );
}

#[test]
fn explicit_async_from_c_fills_polls_waits_on_eventfds_and_refuses_bad_input() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["explicit_async.c"],
        "explicit_async",
        true,
    );
    let model = identity_model_of(&prefix, 4 << 20);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(&model);
        c
    });
    let stdout = assert_ran(&o, "explicit_async", "EXPLICIT ASYNC OK");
    let stderr = String::from_utf8_lossy(&o.stderr);
    // The refusals are logged, naming what was wrong.
    for needle in [
        "ret is NULL",
        "req_sequence is NULL",
        "a COMPUTE execution unit has queue 0 only",
        "in host memory",
        "names no execution unit",
        "which has submitted only 0",
        "is not an eventfd",
        "is used by scheduled request",
        "collectives are not simulated: simdev is one device",
        "cc_ctx is NULL",
        "cc_ctx is not a context from nrta_cc_prepare",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in:\n{stderr}");
    }
    println!("{stdout}");
}

#[test]
fn nrt_close_with_requests_in_flight_writes_every_ret_and_signals_every_eventfd() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["close_in_flight.c"],
        "close_in_flight",
        true,
    );
    let model = identity_model_of(&prefix, 4 << 20);
    for (mode, marker) in [
        ("fds", "CLOSE FDS OK"),
        ("threads", "CLOSE THREADS OK"),
        ("two", "CLOSE TWO OK"),
        ("address", "CLOSE ADDRESS OK"),
    ] {
        let o = run({
            let mut c = Command::new(&exe);
            c.arg(&model).arg(mode);
            c
        });
        println!("{}", assert_ran(&o, mode, marker));
    }
}

#[test]
fn a_program_with_its_standard_streams_closed_keeps_them_off_the_runtimes_descriptors() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["closed_stdio.c"],
        "closed_stdio",
        true,
    );
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "closed_stdio", "CLOSED STDIO OK");
}

/// `pthread_cancel` of threads inside `nrt_execute` and the async calls: the cancel acts when
/// the call has returned (it aborted the process, glibc's forced unwind meeting the panic
/// boundary), and the runtime goes on working.
#[test]
fn a_thread_cancelled_inside_a_call_is_cancelled_after_it_and_the_runtime_goes_on() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["cancel.c"], "cancel", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "cancel", "CANCEL OK");
}

/// A program with no file descriptor left after `nrt_init`: a device tensor's memfd, passed by
/// `SCM_RIGHTS`, is dropped by the kernel. The allocation is NRT_RESOURCE naming the open-file
/// limit (it was NRT_FAILURE, "truncated reply"), and succeeds once descriptors are free.
#[test]
fn a_reply_whose_descriptors_the_kernel_dropped_is_nrt_resource_naming_the_limit() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["fd_exhausted.c"],
        "fd_exhausted",
        true,
    );
    let o = run(Command::new(&exe));
    assert_ran(&o, "fd_exhausted", "FD EXHAUSTED OK");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("dropped: this process is at its open-file limit")
            && stderr.contains("ulimit -n 256"),
        "the refusal does not name the limit:\n{stderr}"
    );
}

/// A program killed after forking a child that outlives it: its datastore reads stale (the
/// child inherited the file's lock, and the dead parent's file read live while it ran).
#[test]
fn a_killed_parents_datastore_is_stale_though_its_forked_child_lives() {
    use runtime::datastore::reader::{read_file, remove_stale};
    use runtime::datastore::snapshot::Liveness;
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["fork_killed.c"],
        "fork_killed",
        true,
    );
    let store = tempfile::tempdir().unwrap();
    let o = run_with(
        Command::new(&exe),
        &[("NEURON_RT_DATASTORE_DIR", store.path().to_str().unwrap())],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let child: i32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD ")?.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no child pid: {stdout} {}",
                String::from_utf8_lossy(&o.stderr)
            )
        });
    let child = nix::unistd::Pid::from_raw(child);
    let file = std::fs::read_dir(store.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .expect("the parent's datastore file");
    let alive = nix::sys::signal::kill(child, None).is_ok();
    let liveness = read_file(&file).unwrap().liveness;
    let removed = remove_stale(store.path()).unwrap();
    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    assert!(alive, "the child was still running");
    assert_eq!(liveness, Liveness::Stale, "{}", file.display());
    assert_eq!(removed, vec![file]);
}

#[test]
fn a_traced_program_that_exits_without_nrt_close_still_gets_its_timeline() {
    let prefix = Prefix::new();
    let exe = compile(
        &prefix,
        "cc",
        "c11",
        &["exit_traced.c"],
        "exit_traced",
        true,
    );
    let trace = prefix.out("timeline.json");
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model()).env("NEURON_RT_TRACE", &trace);
        c
    });
    assert_ran(&o, "exit_traced", "EXIT TRACED OK");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("a whole JSON document");
    let events = doc["traceEvents"].as_array().unwrap();
    let count = |cat: &str, name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == cat && e["name"] == name)
            .count()
    };
    assert_eq!(count("runtime", "execute"), 10, "{}", doc["otherData"]);
    assert!(
        count("execution", "execution") >= 10,
        "the device's events too: {}",
        doc["otherData"]
    );
}

#[test]
fn a_child_forked_after_the_async_api_was_used_gets_its_own_completion_relay() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["fork_async.c"], "fork_async", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    let stdout = assert_ran(&o, "fork_async", "FORK ASYNC OK");
    assert!(stdout.contains("CHILD OK"), "{stdout}");
}

#[test]
fn nrt_init_after_nrt_close_starts_a_new_runtime() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["reinit.c"], "reinit", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "reinit", "REINIT OK");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("nrt_init has already been called in this process"),
        "{stderr}"
    );
    assert!(
        stderr.contains("src \"input\" was allocated by a runtime nrt_close has closed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("is in tensor \"input\", allocated by a runtime nrt_close has closed"),
        "{stderr}"
    );
    // The first nrt_init ran at the "error" level the test set; the second at the "info" the
    // program set before it, though the library had logged (and set its filter) since.
    assert_eq!(stderr.matches("nrt_init framework=").count(), 1, "{stderr}");
}

#[test]
fn the_serving_pattern_runs_from_c_with_two_requests_in_flight() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["serving.c"], "serving", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "serving", "SERVING OK 200 steps");
}

/// The JSON documents `sys_trace.c` printed between `JSON<<` and `>>JSON`.
fn printed_json(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .split("JSON<<")
        .skip(1)
        .map(|s| serde_json::from_str(s.split(">>JSON").next().unwrap()).expect("valid JSON"))
        .collect()
}

#[test]
fn the_system_trace_and_the_profile_work_from_c() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["sys_trace.c"], "sys_trace", true);
    let profile = prefix.out("profile.json");
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model()).arg(&profile);
        c
    });
    let stdout = assert_ran(&o, "sys_trace", "SYS TRACE OK");
    let docs = printed_json(&stdout);
    assert_eq!(docs.len(), 2, "{stdout}");
    let ncs = docs[0]["ncs"].as_array().unwrap();
    assert_eq!(ncs.len(), 1, "fetched for nc_idx 0 only");
    assert_eq!(ncs[0]["nc_idx"], 0);
    let events = ncs[0]["events"].as_array().unwrap();
    let of = |t: &str| events.iter().filter(|e| e["type"] == t).collect::<Vec<_>>();
    let executes = of("execute");
    assert_eq!(executes.len(), 10, "one span per nrt_execute: {events:?}");
    for e in &executes {
        assert_eq!(e["status"], "NRT_SUCCESS");
        assert!(e["start_ns"].as_u64().unwrap() <= e["end_ns"].as_u64().unwrap());
    }
    // The program's three tensor writes, each recorded before it shows as completed.
    let writes = of("tensor_op");
    assert_eq!(writes.len(), 3, "{events:?}");
    assert!(
        writes
            .iter()
            .all(|w| w["op"] == "write" && w["bytes"] == 512)
    );
    let consumed: usize = docs[1]["ncs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["events"].as_array().unwrap().len())
        .sum();
    assert_eq!(consumed, 0, "the first fetch consumed the events");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("is not a live system trace config handle"),
        "{stderr}"
    );
    assert!(
        stderr.contains("not a buffer from nrt_sys_trace_fetch_events"),
        "{stderr}"
    );
    let p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&profile).expect("the profile file")).unwrap();
    assert!(
        p["otherData"]["format"]
            .as_str()
            .unwrap()
            .contains("NOT an NTFF")
    );
    let spans = p["traceEvents"].as_array().unwrap();
    assert!(spans.len() >= 5, "{p}");
}

#[test]
fn a_real_neff_loads_and_runs_shape_only_from_c_with_its_tensor_info() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["neff.c"], "neff", true);
    let neff = crate_dir().join("../scenarios/data/neff/matmul_small.neff");
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(&neff)
            .args(["20", "shape-only"])
            // Any case, blanks around it: as the other variables.
            .env("NEURON_SIMDEV_ARCH", " TRN2")
            .env("NEURON_LOGICAL_NC_CONFIG", "2")
            // libnrt's default logging: errors, and the shape-only warning.
            .env_remove("NEURON_RT_LOG_LEVEL");
        c
    });
    let stdout = assert_ran(&o, "neff", "neff executions 20 outputs shape-only-checked");
    for line in [
        "input x dtype 7 shape 128x256 bytes 65536",
        "input y dtype 7 shape 256x128 bytes 65536",
        "output output0 dtype 7 shape 128x128 bytes 32768",
    ] {
        assert!(stdout.contains(line), "{line:?} in\n{stdout}");
    }
    // The program is told its outputs are not the model's numbers, once, at load.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        stderr.matches(") runs shape-only on simdev").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("Bind a CPU reference"), "{stderr}");
    assert!(stderr.contains("NEFF \"file.neff\" (uuid "), "{stderr}");
}

#[test]
fn a_real_neff_with_a_reference_bound_gives_x_at_y_to_a_c_program() {
    // The same C program, unchanged but for what it checks: the private simdev libnrt starts
    // inherits NEURON_SIMDEV_REFERENCE and runs the example reference (numpy's x @ y).
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["neff.c"], "neff", true);
    let neff = crate_dir().join("../scenarios/data/neff/matmul_small.neff");
    let reference = crate_dir().join("../simdev/python/ref_matmul.py");
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(&neff)
            .args(["10", "matmul"])
            .env("NEURON_SIMDEV_ARCH", "trn2")
            .env("NEURON_LOGICAL_NC_CONFIG", "2")
            .env(
                "NEURON_SIMDEV_REFERENCE",
                format!("{}={}:matmul", neff.display(), reference.display()),
            )
            .env_remove("NEURON_RT_LOG_LEVEL");
        c
    });
    assert_ran(
        &o,
        "neff with a reference",
        "neff executions 10 outputs matmul-checked",
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("shape-only"), "{stderr}");
}

#[test]
fn a_failed_execution_on_a_private_simdev_shows_simdevs_reason_in_the_programs_stderr() {
    // The private simdev's log is a file in a directory removed with it; the reason of a
    // failed execution (here a reference that raises) must still reach the user's stderr,
    // at libnrt's default level (errors), before the program's own report of the 1004.
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["neff.c"], "neff", true);
    let neff = crate_dir().join("../scenarios/data/neff/matmul_small.neff");
    let module = prefix.dir.path().join("refuses.py");
    std::fs::write(
        &module,
        "def matmul(x, y):\n    raise RuntimeError('the reference refuses: kaboom-9')\n",
    )
    .unwrap();
    for mode in ["sync", "async"] {
        let o = run({
            let mut c = Command::new(&exe);
            c.arg(&neff)
                .args(["1", "matmul"])
                .args((mode == "async").then_some("async"))
                .env("NEURON_SIMDEV_ARCH", "trn2")
                .env(
                    "NEURON_SIMDEV_REFERENCE",
                    format!("{}={}:matmul", neff.display(), module.display()),
                );
            c
        });
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{mode}: stderr:\n{stderr}");
        let reason = stderr
            .find("RuntimeError: the reference refuses: kaboom-9")
            .unwrap_or_else(|| panic!("{mode}: simdev's reason is not in stderr:\n{stderr}"));
        let report = stderr
            .find("execute(model, inputs, outputs, argc == 5) returned 1004")
            .unwrap_or_else(|| panic!("{mode}: the program's report is not in stderr:\n{stderr}"));
        assert!(reason < report, "{mode}: the reason comes first:\n{stderr}");
        assert!(
            stderr.contains("refuses.py:matmul"),
            "{mode}: the reference is named:\n{stderr}"
        );
        assert!(
            !stderr.contains('\u{1b}'),
            "{mode}: no colour sequences:\n{stderr}"
        );
        // An async caller gets only a status: the runtime names the execution that failed
        // (a sync caller's error names it already).
        assert_eq!(
            stderr.contains("async execution of model"),
            mode == "async",
            "{mode}:\n{stderr}"
        );
        if mode == "async" {
            let named = stderr
                .find("async execution of model \"file.neff\" on logical core 0 (sequence id 0x1000000000001) ended with NRT_EXEC_COMPLETED_WITH_ERR")
                .unwrap_or_else(|| panic!("the failed execution is not named:\n{stderr}"));
            assert!(named < report, "before the program's report:\n{stderr}");
        }
    }
}
