//! simdev with a counting global allocator, answering `allocations` queries on stdin: the
//! private simdev of the allocation test and of the `simdev_speed` benchmark (see
//! `tests::counted_simdev`). Arguments are simdev's.

use std::process::ExitCode;

use tests::bench::CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

fn main() -> ExitCode {
    tests::counted_simdev::child_main(&GLOBAL, std::env::args_os().skip(1).collect())
}
