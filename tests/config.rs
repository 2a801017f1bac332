//! Finding 5 of issue 9: a valid but huge `Config` whose memory cannot be had is an
//! `Error::OutOfMemory`, not a process abort.
//!
//! The test re-runs this binary as a child under `ulimit -v` (1 GiB of address space) and
//! asks it for the largest table the limits allow (2^24 rooms, 2^31 pages: about 8.6 GiB). On the old library the child died with "memory allocation failed".

use kvfence::{Config, Error, RoomTable, MAX_PAGES, MAX_ROOMS};
use std::process::Command;

#[test]
fn child_asks_for_a_huge_table() {
    if std::env::var_os("KVFENCE_OOM_CHILD").is_none() {
        return;
    }
    match RoomTable::new(Config::pool(MAX_ROOMS, MAX_PAGES)) {
        Err(Error::OutOfMemory { bytes }) => println!("refused: OutOfMemory {{ bytes: {bytes} }}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => println!("allocated (the limit was not low enough)"),
    }
}

#[test]
fn a_table_too_big_for_memory_is_an_error_not_an_abort() {
    if cfg!(miri) || !cfg!(target_os = "linux") {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" --exact child_asks_for_a_huge_table --nocapture --test-threads=1")
        .arg(&exe)
        .env("KVFENCE_OOM_CHILD", "1")
        .output()
        .expect("run sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child process died instead of getting an error: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("refused: OutOfMemory"),
        "child said: {stdout}"
    );
}

#[test]
fn small_tables_still_build_and_errors_read_well() {
    assert!(RoomTable::new(Config::pool(4, 4)).is_ok());
    let e = Error::OutOfMemory { bytes: 1 << 32 };
    assert!(e.to_string().contains("4294967296 bytes"), "{e}");
}
