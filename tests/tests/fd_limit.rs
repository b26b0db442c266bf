//! simdev keeps one memfd per chunk of device memory, so its file-descriptor limit bounds how
//! many tensors its clients hold. It raises its soft `RLIMIT_NOFILE` to the hard limit (a
//! private simdev inherits the soft limit of the program that starts it, commonly 1024), and a
//! chunk refused for want of a descriptor is NRT_RESOURCE naming the limit, not an internal
//! error.

use std::ffi::OsString;

use runtime::backend::sim::{PrivateSimdev, SimdevCommand};
use runtime::{Device, DeviceError};
use shared::NrtStatus;
use shared::protocol::{ErrorKind, MemLocation};
use tests::{connect, simdev_command};

/// simdev started by a shell that first sets its file-descriptor limits with `ulimit_args`.
fn simdev_under(ulimit_args: &str) -> PrivateSimdev {
    let simdev = simdev_command(&["--hbm", "64M"]);
    let script = format!("ulimit {ulimit_args} && exec \"$0\" \"$@\"");
    let mut args_prefix: Vec<OsString> = vec!["-c".into(), script.into()];
    args_prefix.push(simdev.program.into_os_string());
    args_prefix.extend(simdev.args_prefix);
    PrivateSimdev::spawn(&SimdevCommand {
        program: "sh".into(),
        args_prefix,
        extra_args: simdev.extra_args,
    })
    .expect("simdev starts")
}

/// A chunk allocated and mapped.
type Held = (runtime::backend::MemHandle, shared::SharedChunk);

/// Allocates and maps 4 KiB chunks until `n` are held or one is refused.
fn hold(dev: &impl Device, n: usize) -> (Vec<Held>, Option<DeviceError>) {
    let mut held = Vec::new();
    for _ in 0..n {
        let mapped = dev
            .mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 0)
            .and_then(|a| Ok((a.handle, dev.mem_map(&a)?)));
        match mapped {
            Ok(chunk) => held.push(chunk),
            Err(e) => return (held, Some(e)),
        }
    }
    (held, None)
}

#[test]
fn simdev_holds_more_chunks_than_the_soft_fd_limit_it_was_started_with() {
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap()
        .1;
    assert!(
        hard >= 1024,
        "this test needs a hard limit of 1024 at least, not {hard}"
    );
    let sim = simdev_under("-Sn 64");
    let dev = connect(&sim);
    dev.claim_nc(0).unwrap();
    let (held, refused) = hold(&dev, 500);
    assert!(refused.is_none(), "{refused:?} after {} chunks", held.len());
}

#[test]
fn a_chunk_refused_for_want_of_a_descriptor_is_nrt_resource_naming_the_limit() {
    let sim = simdev_under("-n 64");
    let dev = connect(&sim);
    dev.claim_nc(0).unwrap();
    let (held, refused) = hold(&dev, 500);
    let err = refused.expect("a 64-descriptor simdev refuses a chunk before 500");
    assert!(held.len() > 16, "only {} chunks held: {err}", held.len());
    assert_eq!(err.status(), NrtStatus::Resource, "{err}");
    let DeviceError::Remote { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.kind, ErrorKind::OutOfMemory, "{err}");
    assert!(source.message.contains("RLIMIT_NOFILE is 64"), "{err}");
    // Freeing gives descriptors back: the next chunk is allocated.
    for (handle, chunk) in held {
        drop(chunk);
        dev.mem_free(handle).unwrap();
    }
    let (_, refused) = hold(&dev, 1);
    assert!(refused.is_none(), "{refused:?}");
}

#[test]
fn an_nc_claim_refused_for_want_of_a_descriptor_is_nrt_resource_naming_the_limit() {
    // A claim sends the client two descriptors (the semaphore window and the notification
    // eventfd); at 16 simdev has too few left after its own. It was NRT_FAILURE ("Internal").
    let sim = simdev_under("-n 16");
    let dev = connect(&sim);
    let err = (0..dev.info().nc_count)
        .find_map(|nc| dev.claim_nc(nc).err())
        .expect("a 16-descriptor simdev refuses a claim");
    assert_eq!(err.status(), NrtStatus::Resource, "{err}");
    let DeviceError::Remote { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.kind, ErrorKind::OutOfMemory, "{err}");
    assert!(
        source.message.contains("claiming the NC")
            && source.message.contains("RLIMIT_NOFILE is 16"),
        "{err}"
    );
}
