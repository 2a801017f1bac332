//! Rust-side checks of the boundary itself: the status of every core error, and panics
//! caught at the boundary (a panic cannot be provoked from C: the core has no panicking
//! path, so the tests inject one through the test-only `INJECT_PANIC` switch of `call`).

use super::*;
use core::ffi::CStr;

fn every_error() -> Vec<Error> {
    vec![
        Error::InvalidConfig { reason: "x" },
        Error::UnknownRoom { index: 1, rooms: 1 },
        Error::InvalidHandle,
        Error::StaleHandle,
        Error::RoomClosed {
            phase: Phase::Aborting,
        },
        Error::AlreadyAborted,
        Error::AlreadyFinished,
        Error::InvalidRank { rank: u32::MAX },
        Error::TooManyWriters {
            writers: 65,
            max: 64,
        },
        Error::DuplicateWriter { rank: 1 },
        Error::RankNotInRoom { rank: 1 },
        Error::RankFenced { rank: 1 },
        Error::TooManyFenced { max: 1 },
        Error::WrongMode { table: "gate" },
        Error::TooManyPagesInRoom,
        Error::InvalidToken,
        Error::TooManyTokens,
        Error::TooManyPages {
            requested: 2,
            capacity: 1,
        },
        Error::RoomTableFull,
        Error::PoolExhausted { requested: 1 },
        Error::TooManyTransfers,
        Error::OutOfMemory { bytes: 1 },
    ]
}

#[test]
fn every_core_error_has_its_own_status_and_text() {
    let mut seen = std::collections::HashSet::new();
    for e in every_error() {
        let s = status_of(e);
        assert_ne!(s, KVFENCE_OK);
        assert_ne!(s, KVFENCE_INTERNAL_ERROR, "{e:?} has no status of its own");
        assert!(seen.insert(s as u32), "{e:?} shares status {s:?}");
        // SAFETY: kvfence_status_str returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(kvfence_status_str(s as u32)) };
        assert_ne!(text.to_str().unwrap(), "unknown kvfence status", "{s:?}");
    }
    // 22 variants today: a variant added to the core must be added here and to the enum.
    assert_eq!(seen.len(), 22);
}

#[test]
fn a_panic_is_caught_and_reported() {
    let config = kvfence_config_gate(4);
    let mut t = ptr::null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { kvfence_table_new(&config, &mut t) }, KVFENCE_OK);
    let mut h = kvfence_handle::default();
    // SAFETY: a live table, valid pointers.
    assert_eq!(
        unsafe { kvfence_open_gate(t, [0u32].as_ptr(), 1, 7, ptr::null(), 0, &mut h) },
        KVFENCE_OK
    );
    INJECT_PANIC.with(|p| p.set(true));
    let (mut q, mut r) = (kvfence_quiesced::KVFENCE_QUIESCE_RECORDED, NO_RELEASE);
    // SAFETY: a live table, valid pointers.
    assert_eq!(
        unsafe { kvfence_quiesce(t, h, 0, &mut q, &mut r) },
        KVFENCE_PANIC
    );
    let mut buf = [0 as c_char; 128];
    let mut len = 0;
    // SAFETY: valid buffer.
    assert_eq!(
        unsafe { kvfence_last_error(buf.as_mut_ptr(), buf.len(), &mut len) },
        KVFENCE_OK
    );
    // SAFETY: NUL-terminated by kvfence_last_error.
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert!(msg.contains("panicked"), "{msg}");
    // The switch is one-shot: the next call runs normally (the panic struck before the
    // body, so the table is intact here).
    // SAFETY: as above.
    assert_eq!(
        unsafe { kvfence_quiesce(t, h, 0, &mut q, &mut r) },
        KVFENCE_OK
    );
    // SAFETY: made above.
    unsafe { kvfence_table_free(t) };
}

#[test]
fn value_types_have_their_c_sizes() {
    assert_eq!(size_of::<kvfence_handle>(), 16);
    assert_eq!(size_of::<kvfence_token>(), 16);
    assert_eq!(size_of::<kvfence_config>(), 40);
    assert_eq!(size_of::<kvfence_status>(), 4);
}
