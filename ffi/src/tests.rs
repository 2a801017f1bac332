//! Rust-side checks of the boundary itself: the status of every core error, and panics
//! caught at the boundary (a panic cannot be provoked from C: the core has no panicking
//! path, so the tests inject one through the test-only `INJECT_PANIC` switch of `call`).

use super::*;
use core::ffi::CStr;

/// Keeps the injected panics quiet (the default hook would print each one); any other
/// panic (a failing assertion) is still printed.
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"injected test panic") {
                default(info);
            }
        }));
    });
}

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
    quiet_injected_panics();
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

/// Every exported function runs its body inside the boundary's `catch_unwind`: armed, the
/// injected panic is caught in each (status functions report `KVFENCE_PANIC`, value
/// functions return their fallback) and the switch is consumed (the function did go through
/// the wrapper). The panic strikes before the body, so the null arguments are never read.
#[test]
fn every_exported_function_catches_a_panic() {
    quiet_injected_panics();
    let armed = |f: &dyn Fn() -> Option<kvfence_status>, name: &str| {
        INJECT_PANIC.with(|p| p.set(true));
        let got = f();
        assert!(
            !INJECT_PANIC.with(Cell::get),
            "{name} did not go through the boundary"
        );
        if let Some(s) = got {
            assert_eq!(s, KVFENCE_PANIC, "{name}");
        }
    };
    let (n, h, tok) = (
        ptr::null_mut(),
        kvfence_handle::default(),
        kvfence_token::default(),
    );
    let t: *const kvfence_table = ptr::null();
    // SAFETY (every call below): the injected panic strikes before any argument is used.
    unsafe {
        armed(&|| Some(kvfence_last_error(n, 0, n.cast())), "last_error");
        armed(
            &|| Some(kvfence_handle_to_bytes(h, n.cast(), 16)),
            "handle_to_bytes",
        );
        armed(
            &|| Some(kvfence_handle_from_bytes(n.cast(), 16, n.cast())),
            "handle_from_bytes",
        );
        armed(
            &|| Some(kvfence_table_new(ptr::null(), n.cast())),
            "table_new",
        );
        armed(&|| Some(kvfence_table_config(t, n.cast())), "table_config");
        armed(
            &|| Some(kvfence_open(t, ptr::null(), 0, 0, n.cast(), 0, n.cast())),
            "open",
        );
        armed(
            &|| {
                Some(kvfence_open_gate(
                    t,
                    ptr::null(),
                    0,
                    0,
                    ptr::null(),
                    0,
                    n.cast(),
                ))
            },
            "open_gate",
        );
        armed(&|| Some(kvfence_grow(t, h, 0, n.cast(), 0)), "grow");
        armed(
            &|| Some(kvfence_grow_gate(t, h, ptr::null(), 0)),
            "grow_gate",
        );
        armed(
            &|| Some(kvfence_pages_of(t, h, n.cast(), 0, n.cast())),
            "pages_of",
        );
        armed(&|| Some(kvfence_begin(t, h, 0, n.cast())), "begin");
        armed(&|| Some(kvfence_end(t, tok, 0, n.cast())), "end");
        armed(&|| Some(kvfence_end_queued(t, tok, 0)), "end_queued");
        armed(
            &|| Some(kvfence_quiesce(t, h, 0, n.cast(), n.cast())),
            "quiesce",
        );
        armed(
            &|| Some(kvfence_abort(t, h, n.cast(), 0, n.cast(), n.cast())),
            "abort",
        );
        armed(&|| Some(kvfence_finish(t, h, n.cast())), "finish");
        armed(&|| Some(kvfence_quarantine(t, h, n.cast())), "quarantine");
        armed(
            &|| Some(kvfence_fence_rank(t, 0, n.cast(), n.cast(), 0)),
            "fence_rank",
        );
        armed(
            &|| Some(kvfence_readmit_rank(t, 0, n.cast())),
            "readmit_rank",
        );
        armed(&|| Some(kvfence_pop_released(t, n.cast())), "pop_released");
        armed(
            &|| Some(kvfence_drain_released(t, n.cast(), 0, n.cast())),
            "drain_released",
        );
        armed(
            &|| Some(kvfence_queued_releases(t, n.cast())),
            "queued_releases",
        );
        armed(&|| Some(kvfence_release_free(n.cast())), "release_free");
        armed(
            &|| Some(kvfence_release_requeue(t, n.cast())),
            "release_requeue",
        );
        armed(
            &|| Some(kvfence_releases_free(n.cast(), 0)),
            "releases_free",
        );
        armed(&|| Some(kvfence_wait_released(t, h, 0)), "wait_released");
        armed(&|| Some(kvfence_wait_idle(t, 0)), "wait_idle");
        armed(&|| Some(kvfence_get_phase(t, h, n.cast())), "get_phase");
        armed(
            &|| Some(kvfence_get_room_status(t, h, n.cast())),
            "get_room_status",
        );
        armed(
            &|| Some(kvfence_get_stats(t, n.cast(), n.cast(), 0, n.cast(), 0)),
            "get_stats",
        );
        armed(
            &|| {
                kvfence_table_free(n.cast());
                None
            },
            "table_free",
        );
    }
    armed(
        &|| {
            kvfence_status_str(0);
            None
        },
        "status_str",
    );
    armed(
        &|| {
            kvfence_version();
            None
        },
        "version",
    );
    armed(
        &|| {
            assert_eq!(kvfence_abi_version(), KVFENCE_ABI_VERSION);
            None
        },
        "abi_version",
    );
    armed(
        &|| {
            assert_eq!(kvfence_last_error_id(), 0);
            None
        },
        "last_error_id (fallback 0)",
    );
    armed(
        &|| {
            kvfence_handle_index(h);
            None
        },
        "handle_index",
    );
    armed(
        &|| {
            kvfence_handle_generation(h);
            None
        },
        "handle_generation",
    );
    armed(
        &|| {
            assert!(!kvfence_handle_eq(h, h));
            None
        },
        "handle_eq (fallback false)",
    );
    armed(
        &|| {
            assert_eq!(kvfence_config_gate(4).rooms, 0);
            None
        },
        "config_gate (fallback)",
    );
    armed(
        &|| {
            assert_eq!(kvfence_config_pool(4, 4).rooms, 0);
            None
        },
        "config_pool (fallback)",
    );
    // SAFETY: static NUL-terminated string.
    assert_eq!(
        unsafe { CStr::from_ptr(kvfence_status_str(0)) }.to_str(),
        Ok("ok")
    );
}
