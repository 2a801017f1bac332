//! `wire`: arbitrary bytes decoded as 16-byte wire forms of room handles and of transfer
//! tokens. Every value must decode, round-trip through `to_wire` and `to_bytes`, print, and
//! be refused or accepted by a table exactly as the model predicts: a handle the table never
//! issued is `InvalidHandle` (or `WrongMode` for the other mode's `grow`), a token it never
//! issued (or already ended) is `InvalidToken`, an issued handle is stale or names its live
//! lifecycle. Never a panic. Both modes, with and without the release queue.
#![no_main]

#[path = "../../tests/model/mod.rs"]
mod model;

use kvfence::{RoomHandle, RoomTable, TransferToken};
use libfuzzer_sys::fuzz_target;
use model::{Harness, Op, Setup};
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let (mode, data) = data.split_first().unwrap_or((&0, &[]));
    let setup = match mode % 4 {
        0 => Setup::pool(3, 16, false),
        1 => Setup::pool(3, 16, true),
        2 => Setup::gate(3, false),
        _ => Setup::gate(3, true),
    };
    let config = setup.config();
    let table = Arc::new(RoomTable::new(config).expect("valid config"));
    let mut h = Harness::new(&table, config).expect("harness primes");
    // A few live rooms (one of 33 writers), one closing with a transfer in flight, one
    // token in flight and one ended, for forged values to hit.
    let setup_ops = [
        Op::Open {
            kind: 1,
            width: 4,
            seed: 0x3_0001,
            pages: 2,
            token: 11,
        },
        Op::Open {
            kind: 1,
            width: 0,
            seed: 0,
            pages: 1,
            token: 12,
        },
        Op::Begin {
            room: 1,
            peer: 1,
            form: 0,
        },
        Op::Begin {
            room: 0,
            peer: 1,
            form: 4,
        },
        Op::Begin {
            room: 0,
            peer: 0,
            form: 3,
        },
        Op::EndToken {
            token: 1,
            how: 0,
            wire: 0,
        },
        Op::Abort { room: 1 },
    ];
    for op in &setup_ops {
        if let Err(e) = h.step(op).and_then(|()| h.check()) {
            panic!("setup {op:?} does not match the model: {e}");
        }
    }
    for chunk in data.chunks(18) {
        let mut bytes = [0u8; 16];
        bytes[..chunk.len().min(16)].copy_from_slice(&chunk[..chunk.len().min(16)]);
        let handle = RoomHandle::from_bytes(bytes);
        let wire = u128::from_le_bytes(bytes);
        assert_eq!(handle.to_wire(), wire, "wire form round-trips");
        assert_eq!(handle.to_bytes(), bytes, "byte form round-trips");
        assert_eq!(RoomHandle::from_wire(handle.to_wire()), handle);
        assert_eq!(handle.index() as u128, wire >> 32 & 0xFFFF_FFFF);
        assert_eq!(u128::from(handle.generation()), wire & 0xFFFF_FFFF);
        let _ = (format!("{handle:?}"), handle.to_string());
        let token = TransferToken::from_wire(wire);
        assert_eq!(token.to_wire(), wire, "token wire form round-trips");
        let _ = format!("{token:?}");
        let action = chunk.get(16).copied().unwrap_or(0);
        let rank = chunk.get(17).copied().unwrap_or(0);
        // The raw value as a handle (every action) and as a token (both outcomes).
        for a in [action, action.wrapping_add(1), action.wrapping_add(7)] {
            if let Err(e) = h.with_handle(handle, a, rank).and_then(|()| h.check()) {
                panic!("raw handle {wire:#x} (action {a}): {e}");
            }
        }
        if let Err(e) = h.with_token(token, rank & 1 == 1).and_then(|()| h.check()) {
            panic!("raw token {wire:#x}: {e}");
        }
        // Values derived from known handles and tokens (corrupted check halves, flipped
        // bits, tokens as handles, ended tokens).
        let lo = (wire ^ wire >> 64) as u64;
        for how in 0..5 {
            let op = Op::Forged {
                how,
                wire: lo,
                action,
                rank,
            };
            if let Err(e) = h.step(&op).and_then(|()| h.check()) {
                panic!("forged handle from {wire:#x} ({op:?}): {e}");
            }
        }
        let op = Op::EndToken {
            token: action,
            how: 4,
            wire: lo,
        };
        if let Err(e) = h.step(&op).and_then(|()| h.check()) {
            panic!("forged token from {wire:#x} ({op:?}): {e}");
        }
    }
    if let Err(e) = h.finish_all() {
        panic!("final drain: {e}");
    }
});
